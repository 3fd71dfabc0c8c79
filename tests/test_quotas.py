"""A namespace's ResourceQuotas as the budget of its rounds (controller/quotas.py), and which
accelerator counts as the planner's GPU (--gpu-resource)."""

from __future__ import annotations

import numpy as np

from mlsched.controller.records import job_record, node_record
from mlsched.controller.snapshot import ClusterState, build_snapshot
from mlsched.policies import registry
from mlsched.policies.allocation.dl2 import DL2Policy
from mlsched.policies.round import run_round
from test_controller_fixtures import node, ps_job


def _quota(hard, used=None, name="team", **spec):
    from mlsched.controller.quotas import quota_record
    return quota_record({"metadata": {"name": name, "namespace": "team-a"},
                         "spec": {"hard": hard, **spec}, "status": {"used": used or {}}})


def test_quota_records_read_what_the_planner_books():
    from mlsched.controller.quotas import budget, why_not, why_waiting
    q = _quota({"requests.nvidia.com/gpu": "4", "requests.cpu": "16", "memory": "64Gi",
                "count/pods": "50", "limits.cpu": "8"},
               {"requests.nvidia.com/gpu": "3", "requests.cpu": "6", "memory": "24Gi"})
    assert q.hard == (16.0, 4.0, 64.0) and q.used == (6.0, 3.0, 24.0)
    # Scoped quotas bound some pods only; quotas of nothing we plan bound none.
    assert _quota({"requests.cpu": "1"}, scopes=["BestEffort"]) is None
    assert _quota({"requests.cpu": "1"}, scopes=["NotBestEffort"]) is not None
    assert _quota({"requests.cpu": "1"}, scopeSelector={"matchExpressions": []}) is None
    assert _quota({"pods": "10", "limits.cpu": "4"}) is None
    # Left for the round: hard less what others use (its own pods' requests are booked afresh).
    np.testing.assert_allclose(budget([q], own=(2.0, 1.0, 8.0)), [12.0, 2.0, 48.0])
    gpu_only = _quota({"requests.nvidia.com/gpu": "2"}, {"requests.nvidia.com/gpu": "2"}, name="b")
    np.testing.assert_allclose(budget([q, gpu_only], own=(2.0, 1.0, 8.0)), [12.0, 1.0, 48.0])
    assert budget([], own=(0.0, 0.0, 0.0)) is None
    assert why_not((2.0, 4.0, 16.0), [q]) is None
    assert why_not((2.0, 6.0, 16.0), [q]) == \
        "its minimum requests 6 GPU; the namespace's ResourceQuota 'team' allows 4 in all"
    assert why_waiting((2.0, 1.0, 8.0), [q]) is None
    assert why_waiting((2.0, 2.0, 8.0), [q]) == \
        "its minimum requests 2 GPU; the namespace's ResourceQuota 'team' has 1 of 4 left"


def test_every_allocation_stays_within_the_budget():
    from mlsched.controller.quotas import budget
    jobs = [job_record({**b, "metadata": {**b["metadata"], "uid": b["metadata"]["name"],
                                          "creationTimestamp": f"2024-01-01T00:00:0{i}Z"}})
            for i, b in enumerate([ps_job("a"), ps_job("b"), ps_job("c")])]
    cap = budget([_quota({"requests.nvidia.com/gpu": "3"})], own=(0.0, 0.0, 0.0))
    cluster = ClusterState(nodes=[node_record(node(f"n{i}")) for i in range(6)])  # 12 GPUs
    for allocation in ("drf", "fifo", "srtf", "tetris", "optimus", "fixed", "chic", "dl2"):
        snap = build_snapshot(jobs, cluster, now_s=0, interval_s=60, budget=cap)
        policy = DL2Policy.load(None) if allocation == "dl2" else registry.make_allocation(allocation)
        decision = run_round(snap, policy, registry.make_placement("load-balance"))
        gpus = sum(d.workers for d in decision.jobs.values())
        assert gpus <= 3, (allocation, gpus)
        # `fixed` gives a job its max (8 workers) or nothing: nothing fits the quota.
        assert gpus >= (0 if allocation == "fixed" else 1), (allocation, gpus)
    # Held jobs count against it too: an admission step books them first.
    from mlsched.policies.round import run_admission
    snap = build_snapshot(jobs, cluster, now_s=0, interval_s=60, budget=cap)
    first = snap.jobs[0]
    first.ps, first.workers, first.ps_nodes, first.worker_nodes = 1, 3, (0,), (1, 2, 3)
    decision = run_admission(snap, registry.make_allocation("drf"),
                             registry.make_placement("load-balance"))
    assert set(decision.jobs) == {"a"}  # the quota is spent: nothing admitted beside it


def test_another_vendors_accelerator_is_planned_as_the_gpu(monkeypatch):
    """`--gpu-resource amd.com/gpu`: allocatable, requests and quotas of that resource are the
    planner's GPUs, and the default tolerated taints follow it."""
    import subprocess
    import sys

    from mlsched.controller import records
    from mlsched.controller.__main__ import export, parse_args
    from mlsched.controller.config import OperatorConfig
    from mlsched.controller.quotas import keys
    from mlsched.controller.records import pod_requests

    monkeypatch.setattr(records, "GPU_RESOURCE", "amd.com/gpu")
    amd = node("mi300", gpu="0")
    amd["status"]["allocatable"]["amd.com/gpu"] = "8"
    assert node_record(amd).allocatable == (8.0, 8.0, 48.0)
    assert pod_requests({"containers": [{"resources": {"requests": {
        "cpu": "4", "amd.com/gpu": "2", "nvidia.com/gpu": "1"}}}]}) == (4.0, 2.0, 0.0)
    assert keys()[1] == ("requests.amd.com/gpu",)

    config = OperatorConfig.from_env({"MLSCHED_GPU_RESOURCE": "amd.com/gpu"})
    assert config.gpu_resource == "amd.com/gpu" and "amd.com/gpu" in config.tolerated_taints
    assert "nvidia.com/gpu" not in config.tolerated_taints and not config.problems()
    assert OperatorConfig.from_env({}).tolerated_taints == {"nvidia.com/gpu", "kwok.x-k8s.io/node"}
    bad = OperatorConfig.from_env({"MLSCHED_GPU_RESOURCE": "gpu"})
    assert any("not an extended resource name" in p for p in bad.problems())

    # The flag reaches the module the index functions read, as the CLI runs it.
    monkeypatch.delenv("MLSCHED_GPU_RESOURCE", raising=False)
    export(parse_args(["--gpu-resource", "amd.com/gpu"]))
    out = subprocess.run([sys.executable, "-c", "from mlsched.controller import records; "
                          "print(records.GPU_RESOURCE)"], capture_output=True, text=True, check=True)
    monkeypatch.delenv("MLSCHED_GPU_RESOURCE")
    assert out.stdout.strip() == "amd.com/gpu"
