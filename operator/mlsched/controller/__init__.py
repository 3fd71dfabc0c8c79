"""The operator: kopf handlers and the translation between Kubernetes objects and `cluster/`.

Data flows one way, and only the last two modules know about kopf or the network:

    records.py    k8s object → compact record (what kopf indexes hold)         pure
    snapshot.py   records → cluster.Snapshot for one SchedulingPolicy         pure
    desired.py    Decision → target per job → manifests and minimal actions    pure
    lifecycle.py  MLJob + observations → phase, conditions, run-policy actions  pure
    rewards.py    per-interval grants → history entries and policy rewards     pure
    conservation.py   work conservation over rounds: status, Ready reason, Events  pure
    domain.py     ModelInDomain: served models' card domains vs the round, Events  pure
    models.py     SchedulingPolicy spec → policy objects, ONNX models, fallback
    pools.py      grouping in the cluster: pool names, labels, affinity, status    pure
    pool_steps.py a round's grouping work: labels, job pools, status.groups, Events
    kube.py       the API seam (kubernetes client in threads; a fake in tests)
    apply.py      executes actions idempotently
    write_queue.py    the writers' shared background queue: slots, rate, retries, backoff
    token_bucket.py   the rate limit the writers and token reviews share
    status_writer.py  status records written in the background, retried, never dropped
    written_status.py the lifecycle's status patches laid over older MLJob watch bodies  pure
    serving.py    a round's learned phases: exploration (bounded) and decision logs  pure
    dataset_store.py  the retraining dataset's ConfigMap format (segments, records of
                  their own); read_records                                 pure
    dataset_segments.py closed records appended to / pruned from segments, writes
                  conditional on the resourceVersion read
    dataset.py    interval records written as intervals open and close, retention
    object_writer.py  whole objects (dataset ConfigMaps) written in the background, retried
    model_versions.py published model versions: the ConfigMap format          pure
    version_adoption.py which published version serves (updatePolicy), its status
    loop.py       one scheduling round, and the loop around it
    jobs.py       MLJob children/lifecycle (each job as its pods change) and late pod pinning
    leadership.py the leader Lease: the election, writes fenced by it, restart in place
    progress_server.py  /v1/progress (TokenReview-authenticated), /metrics, /healthz
    token_reviews.py    TokenReviews cached by token hash and limited in rate
    serving_tls.py      the endpoint's CA and certificate, kept in a Secret
    handlers.py   kopf decorators only

Entry point: `python -m mlsched.controller` (docs/operator.md).
"""
