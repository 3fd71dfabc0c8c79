"""The retraining dataset on the operator's side: each round's per-job rewards and the interval
records written as intervals open and close (the ConfigMap format is
`mlsched.formats.dataset_store`). Imports `objects/`, `kube/` and `mlsched.formats`.

    rewards.py           the per-interval record: what each job was given and earned  pure
    dataset.py           interval records written as intervals open and close, retention
    dataset_segments.py  closed records appended to and pruned from segments
"""
