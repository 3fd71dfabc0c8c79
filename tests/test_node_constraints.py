"""A pod template's nodeSelector and required node affinity: parsed with Kubernetes' semantics,
planned with by every allocation and placement policy, and told when no node meets them."""

from __future__ import annotations

import numpy as np
import pytest

from mlsched.cluster.ledger import Ledger
from mlsched.controller.constraints.node_constraints import node_constraint, role_constraints
from mlsched.controller.objects.records import node_record
from mlsched.controller.objects.job_records import job_record
from mlsched.controller.scheduling.snapshot import build_snapshot
from mlsched.controller.scheduling.cluster_fit import ClusterFit
from mlsched.controller.scheduling.cluster_state import ClusterState
from mlsched.policies import registry
from mlsched.policies.round import run_round
from builders import node, ps_job

LABELS = {"disk": "ssd", "gpu": "a100", "cores": "64", "zone": "a", "kubernetes.io/hostname": "n1"}


def _affinity(*terms: list[dict]) -> dict:
    return {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": t} for t in terms]}}}}


def _expr(key: str, op: str, *values: str) -> dict:
    return {"key": key, "operator": op, **({"values": list(values)} if values else {})}


@pytest.mark.parametrize("spec, allowed", [
    ({}, True),
    ({"nodeSelector": {"disk": "ssd"}}, True),
    ({"nodeSelector": {"disk": "ssd", "gpu": "h100"}}, False),  # every pair must hold
    ({"nodeSelector": {"disk": ""}}, False),  # an empty value is a value, not "exists"
    # A user's own pin is planned with (desired.py renders the operator's pin in its place).
    ({"nodeSelector": {"kubernetes.io/hostname": "elsewhere"}}, False),
    ({"nodeSelector": {"kubernetes.io/hostname": "n1"}}, True),
    ({"nodeName": "n1"}, True),
    ({"nodeName": "n2"}, False),
    ({"nodeName": "n1", "nodeSelector": {"disk": "hdd"}}, False),
    (_affinity([_expr("gpu", "In", "a100", "h100")]), True),
    (_affinity([_expr("gpu", "NotIn", "a100")]), False),
    (_affinity([_expr("spot", "NotIn", "true")]), True),  # absent label: NotIn holds
    (_affinity([_expr("spot", "DoesNotExist")]), True),
    (_affinity([_expr("spot", "Exists")]), False),
    (_affinity([_expr("cores", "Gt", "32")]), True),
    (_affinity([_expr("cores", "Lt", "32")]), False),
    (_affinity([_expr("zone", "Gt", "1")]), False),  # not an integer
    # Requirements of a term are ANDed, terms ORed.
    (_affinity([_expr("disk", "In", "ssd"), _expr("zone", "In", "b")]), False),
    (_affinity([_expr("zone", "In", "b")], [_expr("disk", "In", "ssd")]), True),
    ({**_affinity([_expr("zone", "In", "a")]), "nodeSelector": {"disk": "hdd"}}, False),
    ({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchFields": [_expr("metadata.name", "In", "n1")]}]}}}}, True),
    ({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchFields": [_expr("metadata.name", "NotIn", "n1")]}]}}}}, False),
    ({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{}]}}}}, False),  # an empty term matches no node
    ({"affinity": {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
        {"weight": 1, "preference": {"matchExpressions": [_expr("gpu", "In", "h100")]}}]}}},
     True),  # a preference only ranks nodes
])
def test_kubernetes_semantics(spec, allowed):
    constraint = node_constraint(spec)
    result = True if constraint is None else constraint.allows("n1", LABELS)
    assert result is allowed, constraint


def test_constraints_are_per_role_and_described():
    body = ps_job("picky")
    specs = body["spec"]["replicaSpecs"]
    specs["worker"]["template"]["spec"]["nodeSelector"] = {"gpu": "a100"}
    specs["ps"]["template"]["spec"].update(_affinity([_expr("gpu", "DoesNotExist")]))
    got = role_constraints({role: s["template"] for role, s in specs.items()})
    assert str(got["worker"]) == "nodeSelector gpu=a100"
    assert str(got["ps"]) == "required node affinity (gpu DoesNotExist)"
    assert job_record(body).node_constraints == got
    assert job_record(ps_job("plain")).node_constraints == {}
    specs["worker"]["template"]["spec"]["nodeName"] = "g7"
    assert str(role_constraints({"worker": specs["worker"]["template"]})["worker"]) == \
        "nodeName g7; nodeSelector gpu=a100"


def _cluster(n_gpu_nodes=2, n_cpu_nodes=4):
    nodes = [node_record(node(f"g{i}", labels={"gpu": "a100"})) for i in range(n_gpu_nodes)]
    nodes += [node_record(node(f"c{i}", cpu="16", gpu="0")) for i in range(n_cpu_nodes)]
    return ClusterState(nodes=nodes)


def _picky_job(name="picky", min_workers=1, max_workers=8):
    body = ps_job(name, min_workers=min_workers, max_workers=max_workers)
    specs = body["spec"]["replicaSpecs"]
    specs["worker"]["template"]["spec"]["nodeSelector"] = {"gpu": "a100"}
    specs["ps"]["template"]["spec"].update(_affinity([_expr("gpu", "DoesNotExist")]))
    for role in ("ps", "worker"):
        specs[role]["template"]["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "1"
    body["metadata"].update(uid=name, creationTimestamp="2024-01-01T00:00:00Z", generation=1)
    return job_record(body)


def _placed(snap, decision):
    names = snap.node_names
    return {job: ([names[n] for n in d.ps_nodes], [names[n] for n in d.worker_nodes])
            for job, d in decision.jobs.items()}


def test_snapshot_gives_each_role_its_nodes_and_shares_equal_constraints():
    snap = build_snapshot([_picky_job("a"), _picky_job("b")], _cluster(), now_s=0, interval_s=60)
    a, b = snap.jobs
    assert snap.node_names == ["c0", "c1", "c2", "c3", "g0", "g1"]
    assert a.node_filter("worker").tolist() == [False] * 4 + [True] * 2
    assert a.node_filter("ps").tolist() == [True] * 4 + [False] * 2
    assert a.node_filter("worker") is b.node_filter("worker")  # evaluated once per round


@pytest.mark.parametrize("placement", list(registry.PLACEMENT))
def test_every_placement_keeps_tasks_on_allowed_nodes(placement):
    # Two picky jobs that could use far more than the two GPU nodes hold, and a plain one.
    plain = ps_job("plain")
    plain["metadata"].update(uid="plain", creationTimestamp="2024-01-01T00:00:01Z")
    jobs = [_picky_job("a"), _picky_job("b"), job_record(plain)]
    snap = build_snapshot(jobs, _cluster(), now_s=0, interval_s=60)
    decision = run_round(snap, registry.make_allocation("drf"), registry.make_placement(placement))
    placed = _placed(snap, decision)
    for job in ("a", "b"):
        if job in placed:
            ps, workers = placed[job]
            assert all(n.startswith("g") for n in workers), (placement, placed)
            assert all(n.startswith("c") for n in ps), (placement, placed)
    gpus = sum(len(w) for _, w in placed.values())
    assert gpus <= 4 and len(placed) >= 2, placed  # capacity holds; the cluster is used


# Every allocation x every placement keeps within them: test_policy_constraints_contract.py.


def test_ledger_combines_node_filter_and_pool():
    snap = build_snapshot([_picky_job()], _cluster(), now_s=0, interval_s=60)
    job = snap.jobs[0]
    snap.node_pools = ["p", "q", "p", "q", "p", "q"]
    job.pool = "q"
    ledger = Ledger(snap, registry.make_placement("load-balance"))
    demand = job.demand("worker")
    assert ledger.fits_mask(demand, job, "worker").tolist() == [False] * 5 + [True]
    ps = job.demand("ps")  # fits every node: only the pool, and the filter of its role, count
    assert ledger.fits_mask(ps, job).tolist() == [False, True] * 3
    assert ledger.fits_mask(ps, job, "ps").tolist() == [False, True, False, True, False, False]
    assert [ledger.fits_on(demand, n, job, "worker") for n in range(6)] == [False] * 5 + [True]


def test_a_constraint_no_node_meets_is_why_the_job_cannot_fit():
    nodes = list(_cluster().nodes)
    fit = ClusterFit.of(nodes)
    assert fit.why_not(_picky_job()) is None
    nowhere = ps_job("nowhere")
    nowhere["spec"]["replicaSpecs"]["worker"]["template"]["spec"]["nodeSelector"] = {"gpu": "h200"}
    why = fit.why_not(job_record(nowhere))
    assert why == ("no schedulable node matches the worker template's nodeSelector gpu=h200 "
                   "(of the cluster's 6 schedulable nodes)")
    # Nodes that match but are too small, or too few for the minimum gang.
    gang = _picky_job("gang", min_workers=5, max_workers=5)
    why = fit.why_not(gang)
    assert why and "its minimum of 5 worker needs" in why and "2 schedulable nodes its template " \
        "allows (nodeSelector gpu=a100)" in why and "4 GPU" in why, why
    big = _picky_job("big")
    big.templates["worker"]["spec"]["containers"][0]["resources"]["requests"]["nvidia.com/gpu"] = "1"
    assert fit.why_not(big) is None
    cpu_only = ClusterFit.of([n for n in nodes if n.name.startswith("c")] +
                             [node_record(node("g9", gpu="0", labels={"gpu": "a100"}))])
    why = cpu_only.why_not(_picky_job())
    assert why and why.startswith("one worker asks for 1 CPU, 1 GPU, 8 GiB and none of the 1 "
                                  "schedulable nodes its template allows"), why


def test_one_cluster_fit_answers_every_job_as_a_fresh_one_would():
    """Its node scans are made once per template and demand and shared by the jobs asked
    after (a sweep, a burst): each job's answer must still be its own."""
    nodes = list(_cluster().nodes)
    nowhere = ps_job("nowhere")
    nowhere["spec"]["replicaSpecs"]["worker"]["template"]["spec"]["nodeSelector"] = {"gpu": "h200"}
    big = _picky_job("big")
    big.templates["worker"]["spec"]["containers"][0]["resources"]["requests"]["nvidia.com/gpu"] = "1"
    huge = ps_job("huge", min_workers=40, max_workers=40)
    jobs = [_picky_job(), job_record(nowhere), _picky_job("gang", min_workers=5, max_workers=5),
            big, job_record(ps_job("plain")), job_record(huge), _picky_job("again")]
    shared = ClusterFit.of(nodes)
    answers = [shared.why_not(j) for j in jobs + jobs[::-1]]
    fresh = [ClusterFit.of(nodes).why_not(j) for j in jobs + jobs[::-1]]
    assert answers == fresh
    assert sum(a is None for a in answers) == 8 and len(set(answers)) == 4, answers


def test_unconstrained_rounds_are_unchanged():
    """No template constraint: the filters are absent and every decision is as before."""
    plain = [ps_job(f"j{i}") for i in range(3)]
    for i, body in enumerate(plain):
        body["metadata"].update(uid=f"j{i}", creationTimestamp=f"2024-01-01T00:00:0{i}Z")
    snap = build_snapshot([job_record(b) for b in plain], _cluster(), now_s=0, interval_s=60)
    assert all(not j.node_filters for j in snap.jobs)
    ledger = Ledger(snap, registry.make_placement("load-balance"))
    assert ledger.allowed_nodes(snap.jobs[0], "worker") is None
    np.testing.assert_array_equal(ledger.fits_mask(snap.jobs[0].demand("worker"), snap.jobs[0], "worker"),
                                  ledger.fits_mask(snap.jobs[0].demand("worker")))


@pytest.mark.parametrize("toleration, taint, tolerated", [
    ({"key": "dedicated", "operator": "Equal", "value": "ml", "effect": "NoSchedule"},
     ("dedicated", "ml", "NoSchedule"), True),
    ({"key": "dedicated", "value": "ml"}, ("dedicated", "ml", "NoExecute"), True),  # any effect
    ({"key": "dedicated", "value": "web"}, ("dedicated", "ml", "NoSchedule"), False),
    ({"key": "dedicated", "operator": "Exists"}, ("dedicated", "ml", "NoSchedule"), True),
    ({"key": "dedicated", "operator": "Exists", "effect": "NoExecute"},
     ("dedicated", "ml", "NoSchedule"), False),
    ({"operator": "Exists"}, ("anything", "x", "NoExecute"), True),  # tolerates every taint
    ({"key": "sku", "operator": "Exists"}, ("dedicated", "ml", "NoSchedule"), False),
    ({"key": "dedicated", "operator": "Exists", "effect": "PreferNoSchedule"},
     ("dedicated", "ml", "NoSchedule"), False),  # a preference tolerates nothing here
])
def test_tolerations_with_kubernetes_semantics(toleration, taint, tolerated):
    constraint = node_constraint({"tolerations": [toleration]})
    allowed = (constraint or node_constraint({"nodeSelector": {"zone": "a"}})).allows(
        "n1", LABELS, (taint,))
    assert allowed is tolerated


def _tainted_cluster():
    dedicated = [{"key": "dedicated", "value": "ml", "effect": "NoSchedule"}]
    gpu = [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]
    nodes = [node_record(node(f"d{i}", taints=dedicated + gpu)) for i in range(2)]
    nodes += [node_record(node(f"n{i}", taints=gpu)) for i in range(3)]
    return ClusterState(nodes=nodes)


def _tolerating(name, **job):
    body = ps_job(name, **job)
    for role in ("ps", "worker"):
        spec = body["spec"]["replicaSpecs"][role]["template"]["spec"]
        spec["tolerations"] = [{"key": "dedicated", "operator": "Exists"}]
    body["metadata"].update(uid=name, creationTimestamp="2024-01-01T00:00:00Z", generation=1)
    return job_record(body)


def test_nodes_with_a_taint_only_some_templates_tolerate():
    tolerated = frozenset({"nvidia.com/gpu"})  # the operator's own, for every pod
    plain = ps_job("plain")
    plain["metadata"].update(uid="plain", creationTimestamp="2024-01-01T00:00:01Z")
    # No job tolerates `dedicated`: those nodes are not planned on at all.
    snap = build_snapshot([job_record(plain)], _tainted_cluster(), now_s=0, interval_s=60,
                          tolerated_taints=tolerated)
    assert snap.node_names == ["n0", "n1", "n2"] and not snap.jobs[0].node_filters
    # One does: they are, for its roles only.
    snap = build_snapshot([_tolerating("team"), job_record(plain)], _tainted_cluster(), now_s=0,
                          interval_s=60, tolerated_taints=tolerated)
    assert snap.node_names == ["d0", "d1", "n0", "n1", "n2"]
    team, other = snap.jobs
    assert not team.node_filters  # tolerates every node here
    assert other.node_filter("worker").tolist() == [False, False, True, True, True]
    decision = run_round(snap, registry.make_allocation("drf"), registry.make_placement("bin-pack"))
    placed = _placed(snap, decision)
    assert not any(n.startswith("d") for n in placed["plain"][0] + placed["plain"][1]), placed
    # Nothing tolerates an unknown taint key unless the operator does.
    assert build_snapshot([job_record(plain)], _tainted_cluster(), now_s=0, interval_s=60,
                          tolerated_taints=frozenset()).node_names == []


def test_cannot_fit_counts_the_tainted_nodes_a_template_tolerates():
    fit = ClusterFit.of(list(_tainted_cluster().nodes), tolerated_taints=frozenset({"nvidia.com/gpu"}))
    gang = ps_job("gang", min_workers=8, max_workers=8)  # 8 GPUs: untainted nodes have 6
    why = fit.why_not(job_record(gang))
    assert why and "the cluster's 3 schedulable nodes" in why, why
    tolerating = _tolerating("gang2", min_workers=8, max_workers=8)
    assert fit.why_not(tolerating) is None  # 10 GPUs on the 5 nodes it may use
    assert str(tolerating.node_constraints["worker"]) == "tolerations dedicated"



def _fpga_node(name, fpgas):
    body = node(name)
    body["status"]["allocatable"]["example.com/fpga"] = str(fpgas)
    return node_record(body)


def _fpga_job(name="fpga", per_worker="1"):
    body = ps_job(name, min_workers=2, max_workers=2)
    res = body["spec"]["replicaSpecs"]["worker"]["template"]["spec"]["containers"][0]["resources"]
    res["requests"]["example.com/fpga"] = res.setdefault("limits", {})["example.com/fpga"] = per_worker
    return job_record(body)


def test_extended_resources_send_a_role_only_to_nodes_that_have_them():
    """`example.com/fpga`, `rdma/hca`, MIG profiles: a worker asking for one used to be pinned
    to any node and refused there by kube-scheduler; now only nodes whose allocatable has
    enough of it are planned on for that role (how much other pods use is kube-scheduler's)."""
    job = _fpga_job()
    assert job.node_constraints["worker"].resources == (("example.com/fpga", 1.0),)
    assert "ps" not in job.node_constraints  # the PS asks for none
    assert str(job.node_constraints["worker"]) == "requests 1 example.com/fpga"
    cluster = ClusterState(nodes=[node_record(node("a")), _fpga_node("b", 2), node_record(node("c"))])
    snap = build_snapshot([job], cluster, now_s=0, interval_s=60)
    assert snap.jobs[0].node_filter("worker").tolist() == [False, True, False]
    decision = run_round(snap, registry.make_allocation("fixed"), registry.make_placement("load-balance"))
    assert _placed(snap, decision)["fpga"][1] == ["b", "b"]
    # No node has enough: the job cannot fit, and says what it asks for.
    why = ClusterFit.of(list(cluster.nodes)).why_not(_fpga_job("greedy", per_worker="4"))
    assert why == ("no schedulable node matches the worker template's requests 4 "
                   "example.com/fpga (of the cluster's 3 schedulable nodes)"), why
    from mlsched.controller.scheduling.displacement import refusal
    assert refusal(node_record(node("a")), job.node_constraints["worker"], {}, frozenset()) == \
        "lacks example.com/fpga"


def _disk_node(name, disk, hugepages=None):
    body = node(name)
    body["status"]["allocatable"]["ephemeral-storage"] = disk
    if hugepages:
        body["status"]["allocatable"]["hugepages-2Mi"] = hugepages
    return node_record(body)


def test_local_storage_and_hugepages_send_a_role_only_to_nodes_that_have_them():
    """`ephemeral-storage` and `hugepages-<size>` are node-local too: a template asking 500Gi
    of scratch disk on nodes with 100Gi was admitted and every pod stayed Pending
    (kube-scheduler: `Insufficient ephemeral-storage`), its GPUs held. Now it cannot fit and
    says so in the units it was written in, and a smaller one goes only where it fits."""
    body = ps_job("scratch", min_workers=2, max_workers=2)
    res = body["spec"]["replicaSpecs"]["worker"]["template"]["spec"]["containers"][0]["resources"]
    res["requests"]["ephemeral-storage"] = "200Gi"
    res["requests"]["hugepages-2Mi"] = res["limits"]["hugepages-2Mi"] = "1Gi"
    job = job_record(body)
    assert str(job.node_constraints["worker"]) == "requests 200Gi ephemeral-storage, 1Gi hugepages-2Mi"
    cluster = ClusterState(nodes=[_disk_node("a-small", "100Gi", "2Gi"), _disk_node("b-big", "400Gi", "2Gi"),
                                  _disk_node("c-no-hugepages", "400Gi")])
    snap = build_snapshot([job], cluster, now_s=0, interval_s=60)
    assert snap.node_names == ["a-small", "b-big", "c-no-hugepages"]
    assert snap.jobs[0].node_filter("worker").tolist() == [False, True, False]
    res["requests"]["ephemeral-storage"] = "500Gi"
    why = ClusterFit.of(list(cluster.nodes)).why_not(job_record(body))
    assert why == ("no schedulable node matches the worker template's requests 500Gi "
                   "ephemeral-storage, 1Gi hugepages-2Mi (of the cluster's 3 schedulable nodes)"), why
