"""The operator's HTTP endpoint. Imports `scheduling/` (the Runtime) and below.

    progress_server.py  POST /v1/progress (TokenReview-authenticated), GET /metrics, GET /healthz
"""
