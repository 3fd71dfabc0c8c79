"""A namespace's ResourceQuotas as the budget of its rounds (controller/admission/quotas.py), and which
accelerator counts as the planner's GPU (--gpu-resource)."""

from __future__ import annotations

import numpy as np

from mlsched.controller.objects.records import node_record
from mlsched.controller.objects.job_records import job_record
from mlsched.controller.scheduling.snapshot import build_snapshot
from mlsched.controller.scheduling.cluster_state import ClusterState
from mlsched.policies import registry
from mlsched.policies.allocation.dl2 import DL2Policy
from mlsched.policies.round import run_round
from builders import node, ps_job


def _quota(hard, used=None, name="team", **spec):
    from mlsched.controller.admission.quotas import quota_record
    return quota_record({"metadata": {"name": name, "namespace": "team-a"},
                         "spec": {"hard": hard, **spec}, "status": {"used": used or {}}})


def test_quota_records_read_what_the_planner_books():
    from mlsched.controller.admission.quotas import Usage, budget, why_not, why_waiting
    q = _quota({"requests.nvidia.com/gpu": "4", "requests.cpu": "16", "memory": "64Gi",
                "count/pods": "50", "limits.cpu": "8", "count/services": "3"},
               {"requests.nvidia.com/gpu": "3", "requests.cpu": "6", "memory": "24Gi",
                "count/pods": "5", "limits.cpu": "7"})
    # Requests of CPU, GPU, memory; limits of CPU, memory; pods (quantities.QUOTA_DIMS).
    assert q.hard == (16.0, 4.0, 64.0, 8.0, None, 50.0)
    assert q.used == (6.0, 3.0, 24.0, 7.0, 0.0, 5.0)
    # Scoped quotas bound some pods only; quotas of nothing we plan bound none.
    assert _quota({"requests.cpu": "1"}, scopes=["BestEffort"]) is None
    assert _quota({"requests.cpu": "1"}, scopes=["NotBestEffort"]) is not None
    assert _quota({"requests.cpu": "1"}, scopeSelector={"matchExpressions": []}).scope is None

    def selecting(*expressions):
        return _quota({"requests.cpu": "1"}, scopeSelector={"matchExpressions": list(expressions)})

    high = {"scopeName": "PriorityClass", "operator": "In", "values": ["high", "critical"]}
    assert selecting(high).scope == ("In", ("critical", "high"))
    assert selecting(high, {"scopeName": "NotTerminating", "operator": "Exists"}).scope == \
        ("In", ("critical", "high"))
    assert selecting({"scopeName": "Terminating", "operator": "Exists"}) is None
    assert selecting({"scopeName": "PriorityClass", "operator": "DoesNotExist"}) is None
    from mlsched.controller.admission.quotas import matches
    assert matches(("In", ("high",)), "high") and not matches(("In", ("high",)), "")
    assert matches(("NotIn", ("high",)), "") and not matches(("NotIn", ("high",)), "high")
    assert matches(("Exists", ()), "low") and not matches(("Exists", ()), "")
    assert matches(None, "") and matches(None, "high")
    assert _quota({"count/services": "10", "requests.storage": "4Ti"}) is None
    assert _quota({"pods": "10"}).hard[5] == 10.0 and _quota({"limits.memory": "1Gi"}).hard[4] == 1.0
    # Left for the round: hard less what others use (its own pods' usage is booked afresh).
    own = {None: Usage([2.0, 1.0, 8.0, 2.0, 8.0, 1.0])}
    np.testing.assert_allclose(budget([q], own=own).amounts, [12.0, 2.0, 48.0, 3.0, np.inf, 46.0])
    gpu_only = _quota({"requests.nvidia.com/gpu": "2"}, {"requests.nvidia.com/gpu": "2"}, name="b")
    np.testing.assert_allclose(budget([q, gpu_only], own=own).amounts, [12.0, 1.0, 48.0, 3.0, np.inf, 46.0])
    assert budget([], own=own) is None

    def minimum(cpu=2.0, gpu=4.0, mem=16.0, lim_cpu=2.0, lim_mem=16.0, pods=2.0):
        return (cpu, gpu, mem, lim_cpu, lim_mem, pods)

    assert why_not(minimum(), [q]) is None
    assert why_not(minimum(gpu=6.0), [q]) == \
        "its minimum requests 6 GPU; the namespace's ResourceQuota 'team' allows 4 in all"
    assert why_not(minimum(lim_cpu=10.0), [q]) == \
        "its minimum has limits of 10 CPU; the namespace's ResourceQuota 'team' allows 8 in all"
    assert why_not(minimum(lim_cpu=float("nan")), [q]) == (
        "its pods do not set a CPU limit in every container (init containers included), so the "
        "API server refuses them: the namespace's ResourceQuota 'team' bounds limits.cpu")
    assert why_not(minimum(lim_mem=float("nan")), [q]) is None  # no quota bounds limits.memory
    assert why_waiting(minimum(gpu=1.0, lim_cpu=1.0), [q]) is None
    assert why_waiting(minimum(gpu=2.0, lim_cpu=1.0), [q]) == \
        "its minimum requests 2 GPU; the namespace's ResourceQuota 'team' has 1 of 4 left"
    assert why_waiting(minimum(gpu=1.0, lim_cpu=2.0), [q]) == \
        "its minimum has limits of 2 CPU; the namespace's ResourceQuota 'team' has 1 of 8 left"


def test_a_pod_counts_against_quotas_what_the_api_server_counts():
    """Requests and limits by the pod rule (sidecars and init containers), LimitRange defaults
    applied, one pod; NaN where a container leaves a request or limit unset (the quota
    admission refuses such a pod wherever that resource is bounded: verified on 1.34)."""
    from mlsched.controller.objects.quantities import quota_usage
    gib = 2.0**30
    box = {"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"cpu": "2", "memory": "2Gi"}}
    spec = {"containers": [{"name": "a", "resources": box},
                           {"name": "b", "resources": {"limits": {"cpu": "1", "memory": "1Gi",
                                                                  "nvidia.com/gpu": "1"}}}],
            "initContainers": [{"name": "side", "restartPolicy": "Always", "resources": box}]}
    assert quota_usage(spec) == (3.0, 1.0, 3.0, 5.0, 5.0, 1.0)
    spec["containers"].append({"name": "bare"})
    usage = quota_usage(spec)
    assert usage[1] == 1.0 and usage[5] == 1.0 and all(np.isnan(usage[r]) for r in (0, 2, 3, 4))
    # The namespace's LimitRange fills them in, as LimitRanger does when the pod is created.
    assert quota_usage(spec, {"cpu": 0.5, "memory": gib}, {"cpu": 1.0, "memory": gib}) == \
        (3.5, 1.0, 4.0, 6.0, 6.0, 1.0)


def test_limits_and_pod_count_quotas_bound_a_round():
    """A job of 2-CPU-limit workers under `limits.cpu: 8` gets four workers, not eight (four
    pods were refused with FailedCreate and the job ran short while their GPUs stayed
    reserved); under `pods: 3`, three tasks; without a CPU limit, none."""
    from mlsched.controller.admission.quotas import budget
    body = ps_job("capped", max_workers=8, min_workers=1)
    for role in body["spec"]["replicaSpecs"].values():
        for c in role["template"]["spec"]["containers"]:
            c["resources"] = {"requests": {"cpu": "2", "memory": "4Gi", "nvidia.com/gpu": "1"},
                              "limits": {"cpu": "2", "memory": "4Gi", "nvidia.com/gpu": "1"}}
    body["spec"]["replicaSpecs"]["ps"]["template"]["spec"]["containers"][0]["resources"] = {
        "requests": {"cpu": "2", "memory": "4Gi"}, "limits": {"cpu": "2", "memory": "4Gi"}}
    body["spec"]["replicaSpecs"]["ps"].update(min=1, max=1)
    job = job_record({**body, "metadata": {**body["metadata"], "uid": "u"}})
    cluster = ClusterState(nodes=[node_record(node(f"n{i}", cpu="32", gpu="8")) for i in range(4)])
    own: dict = {}

    def tasks(hard):
        snap = build_snapshot([job], cluster, now_s=0, interval_s=60,
                              budget=budget([_quota(hard)], own=own))
        d = run_round(snap, registry.make_allocation("fixed"),
                      registry.make_placement("load-balance")).jobs.get("capped")
        return (d.ps, d.workers) if d else (0, 0)

    assert tasks({"requests.cpu": "64"}) == (1, 8)
    assert tasks({"limits.cpu": "10"}) == (0, 0)  # `fixed`: its max (1 + 8 tasks) or nothing
    for allocation in ("drf", "fifo", "optimus", "tetris", "srtf"):
        snap = build_snapshot([job], cluster, now_s=0, interval_s=60,
                              budget=budget([_quota({"limits.cpu": "10", "pods": "4"})], own=own))
        d = run_round(snap, registry.make_allocation(allocation),
                      registry.make_placement("load-balance")).jobs["capped"]
        assert d.ps + d.workers <= 4 and 2 * (d.ps + d.workers) <= 10, (allocation, d)
        assert d.workers >= 1, allocation
    unlimited = dict(body, spec={**body["spec"]})
    for role in unlimited["spec"]["replicaSpecs"].values():
        role["template"]["spec"]["containers"][0]["resources"].pop("limits")
    bare = job_record({**unlimited, "metadata": {**body["metadata"], "uid": "u"}})
    snap = build_snapshot([bare], cluster, now_s=0, interval_s=60,
                          budget=budget([_quota({"limits.cpu": "100"})], own=own))
    assert not run_round(snap, registry.make_allocation("drf"),
                         registry.make_placement("load-balance")).jobs.get("capped")


def test_every_allocation_stays_within_the_budget():
    from mlsched.controller.admission.quotas import budget
    jobs = [job_record({**b, "metadata": {**b["metadata"], "uid": b["metadata"]["name"],
                                          "creationTimestamp": f"2024-01-01T00:00:0{i}Z"}})
            for i, b in enumerate([ps_job("a"), ps_job("b"), ps_job("c")])]
    cap = budget([_quota({"requests.nvidia.com/gpu": "3"})], own={})
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

    from mlsched.controller.objects import quantities
    from mlsched.controller.__main__ import export, parse_args
    from mlsched.controller.process.config import OperatorConfig
    from mlsched.controller.admission.quotas import keys
    from mlsched.controller.objects.quantities import pod_requests

    monkeypatch.setattr(quantities, "GPU_RESOURCE", "amd.com/gpu")
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
    out = subprocess.run([sys.executable, "-c", "from mlsched.controller.objects import quantities; "
                          "print(quantities.GPU_RESOURCE)"], capture_output=True, text=True, check=True)
    monkeypatch.delenv("MLSCHED_GPU_RESOURCE")
    assert out.stdout.strip() == "amd.com/gpu"


# ---------------------------------------------------------------- object counts


def test_a_job_whose_children_a_full_object_count_quota_refuses_waits_saying_why(monkeypatch):
    """A quota on `services` (or `count/statefulsets.apps`) full: the job's Service cannot be
    created. Found in the sandbox: the MLJob showed no phase and no condition at all, its
    create was retried (and a warning logged) every second; a job whose children existed was
    told "could not create the job's children", since a full quota refuses a create (403)
    before the API server looks for the name."""
    from mlsched.api import get_condition
    from mlsched.controller.app import handlers, jobs
    from builders import NS, allreduce_job, cluster, make_runtime, policy, run

    rt, kube = make_runtime(cluster(4))
    kube.put(policy())
    kube.object_quota = {"Service": 1}
    for name in ("first", "second"):
        kube.put(allreduce_job(name))
        run(jobs.on_job_event(rt, "ADDED", kube.obj("MLJob", NS, name), kube.indexes()))
    status = kube.obj("MLJob", NS, "second")["status"]
    admitted = get_condition(status["conditions"], "Admitted")
    assert status["phase"] == "Pending" and admitted.reason == "WaitingForQuota", status
    assert admitted.message.startswith(
        "its Service second cannot be created until the namespace's ResourceQuota has room (services "
        '"second" is forbidden: exceeded quota: objects, requested: services=1'), admitted.message
    assert [e["reason"] for e in kube.events("second")] == ["WaitingForQuota"]
    # Not a create call every sweep while the quota stays full.
    creates = len([c for c in kube.calls if c[0] == "create"])
    for _ in range(3):
        run(jobs.sweep(rt, kube.indexes()))
    assert len([c for c in kube.calls if c[0] == "create"]) == creates
    # The first job's children exist: reconciled again (an edit), it is not told otherwise.
    rt.jobs.books.reconciled.clear()
    first = kube.obj("MLJob", NS, "first")
    run(jobs.reconcile_if_needed(rt, first, kube.indexes()))
    assert "ChildrenNotCreated" not in [e["reason"] for e in kube.events("first")]
    assert rt.jobs.books.reconciled.get((NS, "first")) is not None
    # The quota raised: its event lets the next sweep create the children at once.
    kube.object_quota = {"Service": 2}
    monkeypatch.setattr(handlers, "wake_all_admissions", lambda rt: None)  # no policy loops here
    run(handlers.quota_event(event={}, body={"metadata": {"namespace": NS}},
                             memo={"runtime": rt}))
    run(jobs.sweep(rt, kube.indexes()))
    assert ("StatefulSet", NS, "second-worker") in kube.objects
    status = kube.obj("MLJob", NS, "second")["status"]
    assert get_condition(status["conditions"], "Admitted").reason == "WaitingForAllocation", status


def test_quotas_on_counted_resources_are_read_by_the_names_the_planner_counts():
    """`requests.<extended resource>` (and `ephemeral-storage`) and a DRA DeviceClass's
    `<class>.deviceclass.resource.k8s.io/devices` bound the counted resources
    (counted_resources.py) of the same names; the GPU resource stays a QUOTA_DIMS one."""
    from mlsched.controller.admission.quotas import counted_key
    assert counted_key("requests.example.com/nic") == "example.com/nic"
    assert counted_key("ephemeral-storage") == "ephemeral-storage"
    assert counted_key("requests.ephemeral-storage") == "ephemeral-storage"
    assert counted_key("requests.hugepages-2Mi") == "hugepages-2Mi"
    assert counted_key("gpu.example.com.deviceclass.resource.k8s.io/devices") == "dra:gpu.example.com"
    for other in ("requests.nvidia.com/gpu", "requests.cpu", "requests.storage", "count/pods",
                  "limits.example.com/nic", "persistentvolumeclaims"):
        assert counted_key(other) is None, other
    q = _quota({"requests.example.com/nic": "4", "gpu.x.deviceclass.resource.k8s.io/devices": "3",
                "ephemeral-storage": "20Gi", "requests.ephemeral-storage": "10Gi"},
               {"requests.example.com/nic": "1", "requests.ephemeral-storage": "2Gi"})
    assert q is not None and q.hard == (None,) * 6
    # The lower of two spellings of one bound, with its usage.
    assert q.counted == (("dra:gpu.x", 3.0, 0.0), ("ephemeral-storage", 10 * 2.0**30, 2 * 2.0**30),
                         ("example.com/nic", 4.0, 1.0))


def test_the_budget_and_the_reasons_count_the_counted_resources():
    from mlsched.controller.admission.quotas import Usage, budget, why_not, why_waiting
    nics = _quota({"requests.example.com/nic": "4", "requests.cpu": "10"},
                  {"requests.example.com/nic": "3", "requests.cpu": "2"}, name="nics")
    devices = _quota({"gpu.x.deviceclass.resource.k8s.io/devices": "2"},
                     {"gpu.x.deviceclass.resource.k8s.io/devices": "2"}, name="devices")
    own = Usage([1.0, 0.0, 0.0, 0.0, 0.0, 1.0], {"example.com/nic": 1.0, "dra:gpu.x": 2.0})
    b = budget([nics, devices], {None: own}, {None: Usage(counted={"example.com/nic": 1.0})})
    assert b.counted == ("dra:gpu.x", "example.com/nic")
    # NICs: 4 less the 2 others use less 1 decided for a pod not made yet; devices: all its own.
    np.testing.assert_allclose(b.amounts, [9.0, np.inf, np.inf, np.inf, np.inf, np.inf, 2.0, 1.0])
    none = (0.0,) * 6
    assert why_not(none, [nics, devices], {"example.com/nic": 4.0, "dra:gpu.x": 2.0}) is None
    assert why_not(none, [nics, devices], {"dra:gpu.x": 3.0}) == (
        "its minimum claims 3 gpu.x devices; the namespace's ResourceQuota 'devices' allows 2 in all")
    assert why_not(none, [nics], {"example.com/nic": 5.0}) == (
        "its minimum requests 5 example.com/nic; the namespace's ResourceQuota 'nics' allows 4 in all")
    assert why_waiting(none, [nics, devices], {}) is None
    assert why_waiting(none, [nics], {"example.com/nic": 2.0}) == (
        "its minimum requests 2 example.com/nic; the namespace's ResourceQuota 'nics' has 1 of 4 left")
    # A request narrowing the class by its own selectors counts as the class's devices.
    from mlsched.controller.admission.quotas import add_takes
    total: dict[str, float] = {}
    add_takes(total, (("dra:gpu.x[gpu.x/model='h100']", 1.0), ("dra:gpu.x", 1.0),
                      ("example.com/nic", 2.0)), 2)
    assert total == {"dra:gpu.x": 4.0, "example.com/nic": 4.0}
    assert why_waiting(none, [devices], {"dra:gpu.x": 1.0}) == (
        "its minimum claims 1 gpu.x device; the namespace's ResourceQuota 'devices' has 0 of 2 left")


def test_a_quota_on_an_extended_resource_bounds_every_allocation():
    """Workers asking one example.com/nic each under `requests.example.com/nic: 3`: no policy
    gives them more than 3 (DRF gave all 8 and the API server refused 5 pods: FailedCreate),
    and what is decided for jobs without pods yet counts as used."""
    from mlsched.controller.admission.quotas import Usage, budget, minimum_of
    from builders import counted_node, counted_record, small_workers
    from builders import allreduce_job
    body = small_workers(allreduce_job("ring"), cpu="1", nics=1, min_workers=1)
    body["spec"]["replicaSpecs"]["worker"]["max"] = 8
    job = counted_record(body)
    assert minimum_of(job, None)[1] == {"example.com/nic": 1.0}
    cluster = ClusterState(nodes=[counted_node(f"n{i}", nics=4) for i in range(4)])
    quota = _quota({"requests.example.com/nic": "3"})
    for allocation in ("drf", "fifo", "srtf", "tetris", "optimus", "chic", "dl2"):
        snap = build_snapshot([job], cluster, now_s=0, interval_s=60, budget=budget([quota], {}))
        assert snap.jobs[0].quota_charges["worker"].tolist()[-1] == 1.0
        policy = DL2Policy.load(None) if allocation == "dl2" else registry.make_allocation(allocation)
        d = run_round(snap, policy, registry.make_placement("load-balance")).jobs["ring"]
        assert 1 <= d.workers <= 3, (allocation, d)
    spent = budget([quota], {}, {None: Usage(counted={"example.com/nic": 3.0})})
    snap = build_snapshot([job], cluster, now_s=0, interval_s=60, budget=spent)
    assert not run_round(snap, registry.make_allocation("drf"),
                         registry.make_placement("load-balance")).jobs.get("ring")


def test_a_quota_scoped_to_a_priority_class_bounds_the_tasks_of_that_class_only():
    """`scopeSelector` on PriorityClass: its own block of the budget, charged only by tasks
    whose template names a matching class; its reasons only for such jobs. Before, it was left
    out: a high-priority job was scaled past it and pods were refused."""
    from mlsched.controller.admission.quotas import budget, charges, reasons
    from builders import counted_node, counted_record
    from builders import allreduce_job

    def job(name: str, priority: str | None, minimum: int = 1):
        body = allreduce_job(name, max_workers=6)
        body["spec"]["replicaSpecs"]["worker"]["min"] = minimum
        if priority:
            body["spec"]["replicaSpecs"]["worker"]["template"]["spec"]["priorityClassName"] = priority
        return counted_record(body)

    urgent, routine = job("urgent", "high"), job("routine", None)
    scoped = _quota({"requests.nvidia.com/gpu": "2"}, name="high", scopeSelector={"matchExpressions": [
        {"scopeName": "PriorityClass", "operator": "In", "values": ["high"]}]})
    cpus = _quota({"requests.cpu": "1000"}, name="cpus")
    b = budget([scoped, cpus], {})
    assert b.scopes == (None, ("In", ("high",))) and len(b.amounts) == 12
    gpu = urgent.charges["worker"][1]
    assert gpu > 0
    assert charges(urgent, b)["worker"][[1, 7]].tolist() == [gpu, gpu]
    assert charges(routine, b)["worker"][[1, 7]].tolist() == [gpu, 0.0]
    cluster = ClusterState(nodes=[counted_node(f"n{i}") for i in range(4)])
    snap = build_snapshot([urgent, routine], cluster, now_s=0, interval_s=60, budget=b)
    d = run_round(snap, registry.make_allocation("drf"), registry.make_placement("load-balance")).jobs
    assert d["urgent"].workers == 2 and d["routine"].workers == 6, d
    # Its reasons: for the jobs of its class only.
    used = quota_used(scoped, gpus=2.0)
    assert reasons(job("urgent-too", "high"), [used, cpus]) == (None, (
        "its minimum requests 1 GPU; the namespace's ResourceQuota 'high' has 0 of 2 left"))
    assert reasons(job("routine-too", None), [used, cpus]) == (None, None)
    assert reasons(job("big", "high", minimum=3), [used]) == (
        "its minimum requests 3 GPU; the namespace's ResourceQuota 'high' allows 2 in all",
        "its minimum requests 3 GPU; the namespace's ResourceQuota 'high' has 0 of 2 left")


def quota_used(q, gpus: float):
    import dataclasses
    return dataclasses.replace(q, used=(0.0, gpus, 0.0, 0.0, 0.0, 0.0))


def test_pods_of_a_template_naming_no_priority_class_count_as_the_global_default():
    """The API server gives a pod whose template names no PriorityClass the globalDefault one,
    so a quota scoped to that class counts it: planned the same way."""
    from builders import allreduce_job, cluster, create_jobs, make_runtime, policy, run
    from controller_steps import round_
    kube = cluster(4)
    kube.put({"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
              "metadata": {"name": "standard"}, "value": 100, "globalDefault": True})
    kube.put({"apiVersion": "v1", "kind": "ResourceQuota",
              "metadata": {"name": "standard", "namespace": "team-a"},
              "spec": {"hard": {"requests.nvidia.com/gpu": "2"}, "scopeSelector": {"matchExpressions": [
                  {"scopeName": "PriorityClass", "operator": "In", "values": ["standard"]}]}}})
    rt, kube = make_runtime(kube)
    kube.put(policy(allocation="drf"))
    body = allreduce_job("plain", max_workers=6)
    run(create_jobs(rt, kube, body))
    assert kube.indexes().default_priority_class() == "standard"
    workers = round_(rt, kube).targets["plain"].counts["worker"]
    assert workers == 2, workers


def test_pods_made_before_a_global_default_are_planned_in_their_own_class():
    """A pod's PriorityClass is set when it is made (its template's, else the globalDefault of
    that moment): pods made before an admin named a default keep none, and a quota scoped to
    the new default does not count them. Planned with the new default's class, a running job's
    two GPUs filled that quota in the plan and a new job of the class got nothing."""
    from builders import allreduce_job, cluster, create_jobs, make_runtime, policy, run
    from controller_steps import round_, settle
    rt, kube = make_runtime(cluster(4))
    kube.put(policy(allocation="drf"))
    run(create_jobs(rt, kube, allreduce_job("early", max_workers=2)))
    assert round_(rt, kube).targets["early"].counts["worker"] == 2
    settle(rt, kube)
    pods = kube.of_kind("Pod")
    assert len(pods) == 2 and not any(p["spec"].get("priorityClassName") for p in pods)
    kube.put({"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
              "metadata": {"name": "standard"}, "value": 100, "globalDefault": True})
    kube.put({"apiVersion": "v1", "kind": "ResourceQuota",
              "metadata": {"name": "standard", "namespace": "team-a"},
              "spec": {"hard": {"requests.nvidia.com/gpu": "2"}, "scopeSelector": {"matchExpressions": [
                  {"scopeName": "PriorityClass", "operator": "In", "values": ["standard"]}]}},
              "status": {"used": {"requests.nvidia.com/gpu": "0"}}})
    run(create_jobs(rt, kube, allreduce_job("later", max_workers=2)))
    targets = round_(rt, kube).targets
    assert targets["early"].counts["worker"] == 2, targets["early"]
    assert targets["later"].counts["worker"] == 2, targets["later"]
    # Once early's pods are replaced (a scaling, a restart), the new ones have the default:
    # then the quota counts them, and no more fit beside later's.
    for p in pods:
        p["spec"]["priorityClassName"] = "standard"
        kube.put(p)
    quota = kube.obj("ResourceQuota", "team-a", "standard")
    quota["status"]["used"] = {"requests.nvidia.com/gpu": "2"}
    kube.put(quota)
    targets = round_(rt, kube).targets
    assert sum(targets[j].counts["worker"] for j in ("early", "later")) == 2, targets


def test_a_quota_on_the_count_of_resource_claims_bounds_every_allocation():
    """`count/resourceclaims.resource.k8s.io`: each worker makes one claim from its template,
    so under a quota of 3 no policy gives a job more than 3 (DRF gave 8: the claims of five
    pods were never made and they waited for good); the reasons say so in claims."""
    from mlsched.controller.admission.quotas import CLAIMS, Usage, budget, counted_key, minimum_of, why_not, why_waiting
    from builders import counted_node, counted_record, small_workers
    from builders import allreduce_job
    from builders import claiming
    assert counted_key("count/resourceclaims.resource.k8s.io") == CLAIMS
    body = claiming(small_workers(allreduce_job("ring"), cpu="1", min_workers=1))
    body["spec"]["replicaSpecs"]["worker"]["max"] = 8
    job = counted_record(body)  # (the template need not exist for the count: one claim per pod)
    assert minimum_of(job, None)[1] == {CLAIMS: 1.0}
    quota = _quota({"count/resourceclaims.resource.k8s.io": "3"},
                   {"count/resourceclaims.resource.k8s.io": "1"}, name="claims")
    assert quota is not None and quota.counted == ((CLAIMS, 3.0, 1.0),)
    cluster = ClusterState(nodes=[counted_node(f"n{i}") for i in range(4)])
    for allocation in ("drf", "fifo", "srtf", "tetris", "optimus", "dl2"):
        # Its one existing claim is its own: booked afresh, so 3 are left to it.
        snap = build_snapshot([job], cluster, now_s=0, interval_s=60,
                              budget=budget([quota], {None: Usage(counted={CLAIMS: 1.0})}))
        policy = DL2Policy.load(None) if allocation == "dl2" else registry.make_allocation(allocation)
        d = run_round(snap, policy, registry.make_placement("load-balance")).jobs["ring"]
        assert 1 <= d.workers <= 3 and (d.workers == 3 or allocation != "drf"), (allocation, d)
    none = (0.0,) * 6
    assert why_waiting(none, [quota], {CLAIMS: 3.0}) == (
        "its minimum makes 3 ResourceClaims; the namespace's ResourceQuota 'claims' has 2 of 3 left")
    assert why_not(none, [quota], {CLAIMS: 4.0}) == (
        "its minimum makes 4 ResourceClaims; the namespace's ResourceQuota 'claims' allows 3 in all")
