"""The kopf wiring: the top layer, the only one that knows kopf's decorators. Imports any
subpackage below. A new watched kind gets its index and handlers in handlers.py (its record
in `objects/records.py`).

    handlers.py  kopf decorators, indexes and startup only; the work is elsewhere
    jobs.py      what the MLJob and pod handlers do, apart from kopf: children, lifecycle
                 sweep, late pod pinning

The process entry point is `python -m mlsched.controller` (controller/__main__.py).
"""
