"""What the operator and the retraining programs (policy_models/retrain, `mlsched` CLI) share.

Both sides import these modules; neither imports the other, so a retraining Job never needs
the operator (`mlsched.controller`) and the operator never needs torch.

    dataset_store.py   the retraining dataset as ConfigMaps: segments of closed interval
                       records, the open interval on its own; list_records      pure
    model_versions.py  published model versions: the ConfigMap format retraining writes and
                       the operator adopts (labels, keys, parts, next version)  pure
    model_sources.py   reading a policy's model and card without trusting the policy:
                       allowed directories, size bounds, models split over ConfigMap parts
    serving.py         how a round serves its learned phases (bounded exploration, its seed,
                       the decision log), which retraining replays to reproduce a round  pure
"""
