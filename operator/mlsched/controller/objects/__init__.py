"""The Kubernetes objects the operator reads and writes for its jobs: compact records of what
it watches, the manifests it wants, and the writes and checks that get there. Imports
`kube/` and `constraints/`. A new watched kind gets its record here (records.py) and its
index in `app/handlers.py`.

    records.py       k8s object → compact, immutable record (what kopf indexes hold)  pure
    desired.py       what should exist for a job (Services, StatefulSets, pod templates) and
                     the smallest set of actions that gets there                      pure
    apply.py         executes those actions idempotently
    preflight.py     dry-run creates: would the API server create the job's pods?
    services.py      which jobs' headless Services exist
    lifecycle.py     an MLJob's phase, conditions and run-policy actions               pure
    cluster_pods.py  pods outside the served namespaces, for the capacity view
"""
