"""GPU types in the cluster (issue 54, part 4): a node's type from its GPU product label, a
role restricted to some types (spec.replicaSpecs.<role>.gpuTypes), the snapshot's types, the
types each role runs on in status, and why a job whose types have no room waits."""

from __future__ import annotations

import copy

import pytest
import yaml

from mlsched.api import GpuType, HistoryEntry, InvalidObject, MLJob, Placement, get_condition
from mlsched.cluster.types import Decision, JobDecision
from mlsched.controller.__main__ import export, parse_args
from mlsched.controller.admission.limitranges import ContainerDefaults, defaulted
from mlsched.controller.constraints import gpu_labels
from mlsched.controller.objects.desired import job_targets
from mlsched.controller.objects.job_records import job_record
from mlsched.controller.objects.records import node_record
from mlsched.controller.process.config import OperatorConfig
from mlsched.controller.scheduling.cluster_fit import ClusterFit
from mlsched.controller.scheduling.cluster_state import ClusterState
from mlsched.controller.scheduling.snapshot import build_snapshot
from mlsched.controller.scheduling.waiting import why_waiting
from mlsched.policies import registry
from mlsched.policies.round import run_round
from mlsched.workloads.gpu_types import GPU_TYPES
from builders import NS, SAMPLES, create_jobs, make_runtime, node, policy, ps_job, run
from controller_steps import round_, settle, sync
from memory_kube import MemoryKube

LABEL = "nvidia.com/gpu.product"
PRODUCTS = {"v": "Tesla-V100-SXM2-16GB", "p": "Tesla-P100-PCIE-16GB", "k": "Tesla-K80",
            "a": "NVIDIA-A100-SXM4-80GB"}


def _node(name: str, product: str | None, gpu: str = "2", cpu: str = "8") -> dict:
    return node(name, gpu=gpu, cpu=cpu, labels={LABEL: product} if product else None)


def _nodes() -> list:
    """2 V100, 2 K80, an A100 (a product the table does not know), an unlabelled GPU node."""
    return [node_record(_node(n, p)) for n, p in (
        ("k0", PRODUCTS["k"]), ("k1", PRODUCTS["k"]), ("v0", PRODUCTS["v"]),
        ("v1", PRODUCTS["v"]), ("x-a100", PRODUCTS["a"]), ("x-plain", None))]


def _typed_job(name: str, types: list[str] | None, min_workers: int = 1, max_workers: int = 4,
               role: str = "worker", created: str = "2024-01-01T00:00:00Z") -> dict:
    body = ps_job(name, min_workers=min_workers, max_workers=max_workers)
    if types is not None:
        body["spec"]["replicaSpecs"][role]["gpuTypes"] = types
    body["metadata"].update(uid=name, creationTimestamp=created, generation=1)
    return body


# ---------------------------------------------------------------------------- the label


def test_a_nodes_type_is_the_tables_and_its_name_keeps_an_unknown_product_readable():
    assert gpu_labels.node_type({LABEL: "Tesla-V100-SXM2-16GB"}) == "v100"
    assert gpu_labels.node_type({LABEL: "tesla-p100-pcie-16gb"}) == "p100"
    assert gpu_labels.node_type({LABEL: "NVIDIA-A100-SXM4-80GB"}) is None  # the table: no A100
    assert gpu_labels.node_type({}) is None
    assert gpu_labels.display_name({LABEL: "Tesla-K80"}) == "k80"
    assert gpu_labels.display_name({LABEL: "NVIDIA-A100-SXM4-80GB"}) == "NVIDIA-A100-SXM4-80GB"
    assert gpu_labels.display_name({"other": "Tesla-K80"}) is None
    # Another label, when the operator is told to read it.
    assert gpu_labels.node_type({"example.com/gpu": "v100"}, "example.com/gpu") == "v100"
    assert gpu_labels.ordered(["k80", "NVIDIA-H100", "v100", "k80", "A10"]) == \
        ["v100", "k80", "A10", "NVIDIA-H100"]
    assert gpu_labels.describe(["p100"]) == "p100"
    assert gpu_labels.describe(["k80", "v100", "p100"]) == "v100, p100 or k80"


def test_the_label_is_an_operator_setting():
    assert OperatorConfig().gpu_type_label == LABEL
    config = OperatorConfig.from_env({"MLSCHED_GPU_TYPE_LABEL": "cloud.google.com/gke-accelerator"})
    assert config.gpu_type_label == "cloud.google.com/gke-accelerator" and not config.problems()
    bad = OperatorConfig(gpu_type_label="not a label/")
    assert any("--gpu-type-label 'not a label/' is not a label key" in p for p in bad.problems())
    assert not OperatorConfig(gpu_type_label="gpu-product").problems()  # no prefix: a valid key


def test_the_flag_is_exported_for_the_handlers(monkeypatch):
    monkeypatch.delenv("MLSCHED_GPU_TYPE_LABEL", raising=False)
    export(parse_args(["--gpu-type-label", "example.com/gpu-model"]))
    import os

    assert os.environ["MLSCHED_GPU_TYPE_LABEL"] == "example.com/gpu-model"
    monkeypatch.delenv("MLSCHED_GPU_TYPE_LABEL")


# ------------------------------------------------------------------------------ the spec


def test_the_api_knows_exactly_the_tables_types():
    assert tuple(t.value for t in GpuType) == GPU_TYPES


def test_a_role_may_name_known_types_and_an_unknown_one_is_refused_naming_the_known():
    body = _typed_job("typed", ["v100", "p100"])
    spec = MLJob.from_k8s(body).spec.replica_specs
    assert spec.worker.gpu_types == [GpuType.V100, GpuType.P100] and spec.ps.gpu_types is None
    with pytest.raises(InvalidObject) as err:
        MLJob.from_k8s(_typed_job("typo", ["a100"]))
    assert str(err.value) == ("MLJob team-a/typo: spec.replicaSpecs.worker.gpuTypes[0]: Input "
                              "should be 'v100', 'p100' or 'k80'"), str(err.value)
    with pytest.raises(InvalidObject):
        MLJob.from_k8s(_typed_job("none", []))  # an empty list restricts to nothing: refused


def test_the_crd_refuses_an_unknown_type_with_the_known_ones():
    crd = yaml.safe_load((SAMPLES.parent.parent / "crds" / "mlsched.io_mljobs.yaml").read_text())
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    worker = schema["properties"]["spec"]["properties"]["replicaSpecs"]["properties"]["worker"]
    types = worker["properties"]["gpuTypes"]
    assert types["items"]["enum"] == list(GPU_TYPES)
    assert types["x-kubernetes-list-type"] == "set" and types["minItems"] == 1
    columns = {c["name"]: c for c in crd["spec"]["versions"][0]["additionalPrinterColumns"]}
    assert columns["GPU"]["jsonPath"] == ".status.placement.gpuTypes.worker"


def test_the_job_record_carries_the_restriction_in_its_node_constraint():
    record = job_record(_typed_job("typed", ["v100"]))
    assert record.gpu_types == {"worker": ("v100",)}
    constraint = record.node_constraints["worker"]
    assert constraint.gpu_types == ("v100",) and "ps" not in record.node_constraints
    assert constraint.allows("v0", {LABEL: PRODUCTS["v"]})
    assert not constraint.allows("k0", {LABEL: PRODUCTS["k"]})
    assert not constraint.allows("x", {LABEL: PRODUCTS["a"]}) and not constraint.allows("y", {})
    assert str(constraint) == "GPU type v100 (gpuTypes; node label nvidia.com/gpu.product)"
    # A namespace's LimitRange defaults rebuild the constraints from the templates: kept.
    limited = defaulted(record, ContainerDefaults({"cpu": 1.0}, {}))
    assert limited.node_constraints["worker"].gpu_types == ("v100",)


# -------------------------------------------------------------------------- the snapshot


def test_the_snapshot_has_each_nodes_type_and_a_readable_name():
    snap = build_snapshot([job_record(_typed_job("typed", ["v100"]))], ClusterState(nodes=_nodes()),
                          now_s=0, interval_s=60)
    assert snap.node_names == ["k0", "k1", "v0", "v1", "x-a100", "x-plain"]
    assert list(snap.gpu_types) == ["k80", "k80", "v100", "v100", None, None]
    assert list(snap.gpu_names) == ["k80", "k80", "v100", "v100", PRODUCTS["a"], None]
    job = snap.jobs[0]
    assert job.gpu_types == {"worker": ("v100",)}
    assert job.node_filter("worker").tolist() == [False, False, True, True, False, False]
    assert job.node_filter("ps") is None


def test_an_untyped_cluster_has_no_types():
    plain = [node_record(_node(f"n{i}", None)) for i in range(3)]
    snap = build_snapshot([job_record(_typed_job("a", None))], ClusterState(nodes=plain),
                          now_s=0, interval_s=60)
    assert snap.gpu_types is None and snap.gpu_names is None and not snap.typed
    # Read from another label when the operator is told to.
    other = [node_record(node("n0", labels={"example.com/gpu": "V100"}))]
    snap = build_snapshot([], ClusterState(nodes=other), now_s=0, interval_s=60,
                          gpu_type_label="example.com/gpu")
    assert list(snap.gpu_types) == ["v100"]


@pytest.mark.parametrize("placement", list(registry.PLACEMENT))
def test_every_placement_keeps_a_restricted_role_on_its_types(placement):
    # Two jobs that could use far more than the V100s hold, and one free to go anywhere.
    jobs = [job_record(_typed_job("a", ["v100"], max_workers=8)),
            job_record(_typed_job("b", ["v100"], max_workers=8, created="2024-01-01T00:00:01Z")),
            job_record(_typed_job("c", None, created="2024-01-01T00:00:02Z"))]
    snap = build_snapshot(jobs, ClusterState(nodes=_nodes()), now_s=0, interval_s=60)
    decision = run_round(snap, registry.make_allocation("drf"), registry.make_placement(placement))
    types = snap.gpu_types
    for name in ("a", "b"):
        d = decision.jobs.get(name)
        if d is not None:
            assert {types[n] for n in d.worker_nodes} <= {"v100"}, (placement, name, d)
    restricted = sum(len(decision.jobs[n].worker_nodes) for n in ("a", "b") if n in decision.jobs)
    assert 1 <= restricted <= 4, (placement, decision.jobs)  # 2 V100 nodes x 2 GPUs


def test_the_types_each_role_runs_on_are_in_its_target():
    snap = build_snapshot([job_record(_typed_job("a", None))], ClusterState(nodes=_nodes()),
                          now_s=0, interval_s=60)
    decision = Decision({"a": JobDecision(ps_nodes=[5], worker_nodes=[0, 4, 2])})
    target = job_targets(decision, snap)["a"]
    assert target.gpu_types == {"worker": f"v100,k80,{PRODUCTS['a']}"}  # ps: an unlabelled node
    assert target.placement()["gpuTypes"] == {"worker": f"v100,k80,{PRODUCTS['a']}"}


# ------------------------------------------------------------------------------- waiting


def test_a_job_whose_types_have_no_room_waits_naming_the_type():
    jobs = [job_record(_typed_job("big", ["v100"], min_workers=4, max_workers=4)),
            job_record(_typed_job("late", ["v100"], created="2024-01-01T00:00:01Z")),
            job_record(_typed_job("k80s", ["k80"], min_workers=4, created="2024-01-01T00:00:02Z"))]
    snap = build_snapshot(jobs, ClusterState(nodes=_nodes()), now_s=0, interval_s=60)
    # `big` holds every V100; one worker of something else on each K80 node.
    decision = Decision({"big": JobDecision([5], [2, 2, 3, 3])})
    reasons = why_waiting(snap, decision, "drf")
    assert reasons["late"].startswith("no node of GPU type v100 has room for a worker (1 GPU, "
                                      "2 CPU, 8 GiB) now: the 2 nodes of GPU type v100 it may "
                                      "use have 0 GPU, "), reasons["late"]
    # The K80s are free but for one GPU, and the job's minimum is four workers.
    crowded = Decision({"big": JobDecision([5], [2, 2, 3, 3]), "late": JobDecision([5], [])})
    snap.capacity[0, 1] = 1.0  # one K80 GPU taken by another workload
    reasons = why_waiting(snap, crowded, "drf")
    assert reasons["k80s"].startswith("its minimum (1 ps and 4 worker) needs room for 4 worker "
                                      "on nodes of GPU type k80; there is room for 3 now: the 2 "
                                      "nodes of GPU type k80 it may use have 3 GPU, "), \
        reasons["k80s"]


def test_a_type_no_node_has_is_why_the_job_cannot_fit():
    fit = ClusterFit.of(_nodes())
    assert fit.why_not(job_record(_typed_job("v", ["v100"]))) is None
    nodes = [n for n in _nodes() if not n.name.startswith("v")]
    why = ClusterFit.of(nodes).why_not(job_record(_typed_job("v", ["v100"])))
    assert why == ("no schedulable node matches the worker template's GPU type v100 (gpuTypes; "
                   "node label nvidia.com/gpu.product) (of the cluster's 4 schedulable nodes)")


# ------------------------------------------------------------------ through the operator


def _typed_cluster() -> MemoryKube:
    kube = MemoryKube()
    for name, product in (("k0", PRODUCTS["k"]), ("k1", PRODUCTS["k"]), ("v0", PRODUCTS["v"]),
                          ("v1", PRODUCTS["v"]), ("x-a100", PRODUCTS["a"])):
        kube.put(_node(name, product))
    return kube


def test_the_operator_places_a_restricted_job_on_its_type_and_says_where_it_runs():
    rt, kube = make_runtime(_typed_cluster())
    kube.put(policy(allocation="fixed"))
    run(create_jobs(rt, kube, _typed_job("fast", ["v100"], min_workers=4, max_workers=4),
                    _typed_job("late", ["v100"], min_workers=1, max_workers=1,
                               created="2024-01-01T00:00:01Z"),
                    _typed_job("anywhere", None, min_workers=2, max_workers=2,
                               created="2024-01-01T00:00:02Z")))
    round_(rt, kube)
    settle(rt, kube)
    fast = kube.obj("MLJob", NS, "fast")["status"]
    assert sorted(fast["placement"]["worker"]) == ["v0", "v0", "v1", "v1"]
    assert fast["placement"]["gpuTypes"]["worker"] == "v100"
    pinned = [p["spec"]["nodeSelector"]["kubernetes.io/hostname"] for p in kube.of_kind("Pod")
              if p["metadata"]["labels"].get("mlsched.io/job-name") == "fast"
              and p["metadata"]["labels"].get("mlsched.io/role") == "worker"]
    assert sorted(pinned) == ["v0", "v0", "v1", "v1"]
    anywhere = kube.obj("MLJob", NS, "anywhere")["status"]["placement"]
    assert not {"v0", "v1"} & set(anywhere["worker"]) and anywhere["worker"]
    # The V100s are full: the late job waits and says which type has no room.
    sync(rt, kube, "late")
    late = kube.obj("MLJob", NS, "late")["status"]
    admitted = get_condition(late["conditions"], "Admitted")
    assert admitted.status == "False" and admitted.reason == "WaitingForAllocation"
    assert "no node of GPU type v100 has room for a worker" in admitted.message, admitted.message
    assert not (late.get("placement") or {}).get("worker")


def test_a_job_moved_off_typed_nodes_loses_its_types_in_status():
    rt, kube = make_runtime(_typed_cluster())
    kube.put(policy(allocation="fixed"))
    run(create_jobs(rt, kube, _typed_job("a", ["k80"], min_workers=1, max_workers=1)))
    round_(rt, kube)
    settle(rt, kube)
    status = kube.obj("MLJob", NS, "a")["status"]
    assert status["placement"]["gpuTypes"]["worker"] == "k80"
    # Every label gone (the nodes relabelled): the next round's placement names no type, and
    # the merge patch removes the old one instead of keeping it.
    body = copy.deepcopy(kube.obj("MLJob", NS, "a"))
    del body["spec"]["replicaSpecs"]["worker"]["gpuTypes"]
    kube.put(body)
    for n in kube.of_kind("Node"):
        n = copy.deepcopy(n)
        n["metadata"]["labels"].pop(LABEL, None)
        kube.put(n)
    round_(rt, kube)
    status = kube.obj("MLJob", NS, "a")["status"]
    assert status["placement"]["worker"] and "gpuTypes" not in status["placement"], status


def test_the_speeds_a_job_showed_carry_the_type_they_were_measured_at():
    """The hetero policies divide each observed speed by its type's relative speed
    (policies/gpu_speed.normalised): the history's placement says which types the workers
    ran on, and the slowest of them is the pace."""
    body = _typed_job("seen", None)
    body["status"] = {"history": [
        {"interval": 1, "ps": 1, "workers": 2, "epochs": 1.0,
         "placement": {"worker": ["v0", "k0"], "gpuTypes": {"worker": "v100,k80"}}},
        {"interval": 2, "ps": 1, "workers": 2, "epochs": 0.0,  # no progress: no speed
         "placement": {"worker": ["v0", "v1"], "gpuTypes": {"worker": "v100"}}},
        {"interval": 3, "ps": 1, "workers": 1, "epochs": 2.0,
         "placement": {"worker": ["x-a100"], "gpuTypes": {"worker": PRODUCTS["a"]}}},
        {"interval": 4, "ps": 1, "workers": 2, "epochs": 3.0,
         "placement": {"worker": ["v0", "v1"], "gpuTypes": {"worker": "v100"}}}]}
    record = job_record(body)
    assert [w for _, w, _ in record.trained] == [2, 1, 2]
    assert record.trained_types == ("k80", None, "v100")
    view = build_snapshot([record], ClusterState(nodes=_nodes()), now_s=0, interval_s=60).jobs[0]
    assert view.observation_types == ("k80", None, "v100") and len(view.observations) == 3
    # Untyped history: no types at all (the homogeneous default).
    body["status"]["history"] = [{"interval": 1, "ps": 1, "workers": 1, "epochs": 1.0,
                                  "placement": {"worker": ["n0"]}}]
    record = job_record(body)
    assert record.trained_types == ()
    view = build_snapshot([record], ClusterState(nodes=_nodes()), now_s=0, interval_s=60).jobs[0]
    assert view.observation_types == ()


def test_a_history_entry_keeps_the_types_its_placement_had():
    snap = build_snapshot([job_record(_typed_job("a", None))], ClusterState(nodes=_nodes()),
                          now_s=0, interval_s=60)
    target = job_targets(Decision({"a": JobDecision(ps_nodes=[5], worker_nodes=[2, 0])}), snap)["a"]
    entry = HistoryEntry(interval=1, start="2024-01-01T00:00:00Z", ps=1, workers=2, epochs=1.0,
                         reward=0.0, placement=Placement(**target.placement()))
    assert entry.to_k8s()["placement"]["gpuTypes"] == {"worker": "v100,k80"}
