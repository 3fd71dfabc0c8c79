"""The operator: kopf handlers and the translation between Kubernetes objects and `cluster/`.

Split by responsibility into subpackages, each with a map of its modules in its docstring.
Lowest first; a subpackage imports only those before it (tests/test_architecture.py reads
every import and fails on one against the order):

    kube/         the API seam and its writers: KubeApi, status/object writers, Events,
                  token reviews, the names the operator writes (constants.py)
    process/      the process's own machinery: config, leader Lease, metrics, supervision
                  of loops and sweeps, event-loop health, relists
    serving/      which models a policy serves: spec → policy objects and loaded models,
                  published-version adoption, the endpoint's TLS
    constraints/  what pod templates and nodes constrain: node affinity, label selectors,
                  topology spread, anti-affinity, host ports, RuntimeClasses, DRA     pure
    objects/      records of watched objects, desired manifests, apply, preflight,
                  Services, an MLJob's lifecycle, pods of other namespaces
    admission/    mirrors of namespace admission: ResourceQuotas, LimitRanges, counted
                  resources                                                        pure
    dataset/      rewards and the retraining dataset's interval records
    scheduling/   the Runtime and its state's owners, snapshots, a round and admission steps, fair share, pools,
                  displacement, guard, reporting: the scheduling loop
    progress/     the HTTP endpoint: /v1/progress, /metrics, /healthz
    app/          kopf handlers (decorators only) and what the MLJob handlers do

Formats shared with retraining (the dataset's ConfigMaps, published model versions, model
parts, a round's serving) live outside, in `mlsched.formats`.

Where a change goes: a new watched kind → one entry of app/watched.py's WATCHED (its
record in objects/records.py or beside its constraint); a new constraint → constraints/ (per pod or node) or admission/
(per namespace), planned in scheduling/snapshot.py; a new policy → mlsched.policies (no
operator change beyond api/algorithms.py); a new status field → its model in mlsched.api,
written by scheduling/reporting.py (a round's, through kube/status_writer.py) or
app/job_lifecycle.py (a job's lifecycle, from objects/lifecycle.py).

Entry point: `python -m mlsched.controller` (__main__.py; docs/operator.md).
"""
