"""The operator process's own machinery, apart from what it schedules: settings, the leader
Lease, metrics, long-running tasks and the health of its event loop. Imports only `kube/`.

    config.py       OperatorConfig from MLSCHED_* variables (the CLI's flags fill them)
    leadership.py   active/standby replicas: the leader Lease, writes fenced by it
    metrics.py      Prometheus metrics (prefix `mlsched_`) on their own registry
    supervision.py  one scheduling loop per SchedulingPolicy and the lifecycle sweep, started
                    and stopped from watch events
    loop_health.py  how long the event loop is blocked; the garbage collector's part
    relists.py      objects deleted while a watch was down, forgotten after kopf relists
"""
