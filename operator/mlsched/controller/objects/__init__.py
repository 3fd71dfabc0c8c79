"""The Kubernetes objects the operator reads and writes for its jobs: compact records of what
it watches, the manifests it wants, and the writes and checks that get there. Imports
`kube/` and `constraints/`. A new watched kind gets its record here (records.py; an MLJob's, job_records.py) and its
index in `app/handlers.py`.

    quantities.py    Kubernetes quantities, Resources, what pods request and charge quotas  pure
    records.py       nodes, pods, StatefulSets → compact, immutable records (what kopf
                     indexes hold)                                                    pure
    job_records.py   an MLJob → its compact record (JobRecord): the parsed spec, demands,
                     charges and constraints per role                                 pure
    desired.py       what should exist for a job (Services, StatefulSets, pod templates) and
                     the smallest set of actions that gets there                      pure
    apply.py         executes those actions idempotently
    preflight.py     dry-run creates: would the API server create the job's pods?
    services.py      which jobs' headless Services exist
    lifecycle.py     an MLJob's phase, conditions and run-policy actions               pure
    cluster_pods.py  pods outside the served namespaces, for the capacity view
"""
