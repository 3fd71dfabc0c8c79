"""One contract (issue 50): every registered policy respects each constraint a Snapshot can express.

Parametrized over every registered allocation policy x every registered placement policy
(the learned ones with their shipped models; `optimus-oracle` with the measured speed table
as its true speed) x each constraint the operator plans with: per-role node constraints
(nodeSelector, required node affinity), ResourceQuotas (the round's budget), host ports and
required pod anti-affinity (a token per node), topology spread, counted per-node resources
(pod slots, extended resources; DRA devices reach the ledger the same way), and plain
capacity with the gang and the caps. A new policy or a new constraint gets the whole matrix.

Each case is built the operator's way (tests/builders.py templates, `job_record`,
`build_snapshot`), so the constraint reaches the JobViews as it does in the cluster, and is
made to bind: the jobs want more than the constraint allows, and less than the cluster holds.
The decision is then checked by the ledger's own rules: its tasks are booked into a fresh
Ledger one by one, each only where `Ledger.fits_on` (capacity, node filter, budget, tokens,
spread room, counted resources) says it fits, in whatever order lets them in (a spread's
room depends on the order: a layout within the skew has an order that fits); and each job
holds nothing or at least its starting gang and at most its caps.

The per-constraint loops over policies that this replaces: test_node_constraints.py,
test_quotas.py, test_one_per_node.py, test_counted_resources.py (each keeps its own
cases of what the constraint means, with fixed expectations).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from functools import cache

import pytest

from mlsched.cluster.ledger import Ledger
from mlsched.cluster.types import Decision, Snapshot
from mlsched.controller.admission.quotas import budget, quota_record
from mlsched.controller.objects.job_records import job_record
from mlsched.controller.objects.records import node_record
from mlsched.controller.scheduling.cluster_state import ClusterState
from mlsched.controller.scheduling.snapshot import build_snapshot
from mlsched.policies import registry
from mlsched.policies.placement.heuristics import FirstFit
from mlsched.policies.round import run_round
from mlsched.workloads.speed_models import MeasuredSpeed
from builders import NIC, allreduce_job, counted_node, node, ps_job, small_workers

ZONE = "topology.kubernetes.io/zone"


@cache
def _allocation(name: str):
    """Built once per name, as the operator keeps a policy from round to round (the learned
    ones load their model once)."""
    return registry.make_allocation(name, registry.PolicyContext(speed_model=MeasuredSpeed()))


@cache
def _placement(name: str):
    return registry.make_placement(name)


def _record(body: dict, i: int):
    meta = body["metadata"]
    return job_record({**body, "metadata": {**meta, "uid": "u-" + meta["name"], "generation": 1,
                                            "creationTimestamp": f"2024-01-01T00:00:0{i}Z"}})


def _records(bodies: list[dict]) -> list:
    return [_record(b, i) for i, b in enumerate(bodies)]


def _snapshot(bodies: list[dict], nodes: list, **kw) -> Snapshot:
    return build_snapshot(_records(bodies), ClusterState(nodes=nodes), now_s=0, interval_s=60, **kw)


def _gpu_nodes(n: int, **labels) -> list:
    return [node_record(node(f"n{i}", labels=labels)) for i in range(n)]


# ---------------------------------------------------------------- the constraints


def node_constraints() -> Snapshot:
    """Workers only on nodes labelled gpu=a100 (a nodeSelector), PS only where no such label
    is (required node affinity): 12 workers wanted, 6 GPUs on the labelled nodes, 12 in all."""
    nodes = [node_record(node(f"g{i}", labels={"gpu": "a100"})) for i in range(3)]
    nodes += [node_record(node(f"u{i}")) for i in range(3)]
    nodes += [node_record(node(f"c{i}", cpu="16", gpu="0")) for i in range(2)]
    bodies = []
    for name in ("a", "b", "c"):
        body = ps_job(name, max_workers=4)
        specs = body["spec"]["replicaSpecs"]
        specs["worker"]["template"]["spec"]["nodeSelector"] = {"gpu": "a100"}
        specs["ps"]["template"]["spec"]["affinity"] = {"nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                {"matchExpressions": [{"key": "gpu", "operator": "DoesNotExist"}]}]}}}
        for role in ("ps", "worker"):
            specs[role]["template"]["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "1"
        bodies.append(body)
    snap = _snapshot(bodies, nodes)
    assert all(j.node_filters for j in snap.jobs)
    return snap


def quotas() -> Snapshot:
    """`requests.nvidia.com/gpu: 3` over three jobs of up to 3 workers on 12 GPUs."""
    quota = quota_record({"metadata": {"name": "team", "namespace": "team-a"},
                          "spec": {"hard": {"requests.nvidia.com/gpu": "3"}}, "status": {"used": {}}})
    snap = _snapshot([ps_job(n, max_workers=3) for n in ("a", "b", "c")], _gpu_nodes(6),
                     budget=budget([quota], own={}))
    assert snap.budget is not None
    return snap


def host_ports() -> Snapshot:
    """Workers on the host's network, all on port 29500: one per node whatever its job; 18
    wanted, 6 nodes of 2 GPUs."""
    bodies = []
    for name in ("a", "b", "c"):
        body = allreduce_job(name, max_workers=6)
        spec = body["spec"]["replicaSpecs"]["worker"]["template"]["spec"]
        spec["hostNetwork"] = True
        spec["containers"][0]["ports"] = [{"containerPort": 29500, "name": "nccl"}]
        bodies.append(body)
    snap = _snapshot(bodies, _gpu_nodes(6))
    assert all(j.exclusive for j in snap.jobs)
    return snap


def pod_anti_affinity() -> Snapshot:
    """Workers labelled app=trainer and kept one per node from every pod so labelled (a
    required anti-affinity by hostname), across jobs: 12 wanted, 6 nodes."""
    bodies = []
    for name in ("a", "b", "c"):
        body = allreduce_job(name, max_workers=4)
        template = body["spec"]["replicaSpecs"]["worker"]["template"]
        template.setdefault("metadata", {})["labels"] = {"app": "trainer"}
        template["spec"]["affinity"] = {"podAntiAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {"labelSelector": {"matchLabels": {"app": "trainer"}},
                 "topologyKey": "kubernetes.io/hostname"}]}}
        bodies.append(body)
    snap = _snapshot(bodies, _gpu_nodes(6))
    assert all(j.exclusive for j in snap.jobs)
    return snap


def topology_spread() -> Snapshot:
    """Two jobs' workers (one label) spread over three zones with a skew of 1, beside a
    plain job: bin-packing alone would fill a zone first."""
    nodes = [node_record(node(f"n{i}", labels={ZONE: f"z{i % 3}"})) for i in range(6)]
    bodies = []
    for name in ("a", "b"):
        body = allreduce_job(name, max_workers=5)
        template = body["spec"]["replicaSpecs"]["worker"]["template"]
        template.setdefault("metadata", {})["labels"] = {"app": "spread"}
        template["spec"]["topologySpreadConstraints"] = [{
            "maxSkew": 1, "topologyKey": ZONE, "whenUnsatisfiable": "DoNotSchedule",
            "labelSelector": {"matchLabels": {"app": "spread"}}}]
        bodies.append(body)
    bodies.append(allreduce_job("plain", max_workers=4))
    snap = _snapshot(bodies, nodes)
    assert snap.jobs[0].spreads and snap.jobs[1].spreads
    return snap


def counted_resources() -> Snapshot:
    """Workers asking one example.com/nic each and no GPU: 12 wanted, 6 NICs in all (one per
    node), and 3 pod slots on each node."""
    nodes = [counted_node(f"n{i}", pods=3, nics=1) for i in range(6)]
    bodies = [small_workers(allreduce_job(n, max_workers=4), cpu="1", nics=1, min_workers=1)
              for n in ("a", "b", "c")]
    snap = _snapshot(bodies, nodes)
    assert all(j.counted for j in snap.jobs) and NIC in snap.counted_free
    return snap


def capacity() -> Snapshot:
    """No constraint but the nodes' CPU, GPU and memory, the gang and the caps: 18 workers
    wanted, 8 GPUs."""
    return _snapshot([ps_job(n, max_workers=6) for n in ("a", "b", "c")], _gpu_nodes(4))


CONSTRAINTS: dict[str, Callable[[], Snapshot]] = {
    f.__name__: f for f in (node_constraints, quotas, host_ports, pod_anti_affinity,
                            topology_spread, counted_resources, capacity)}


@cache
def _case(constraint: str) -> Snapshot:
    """Built once (parsing the templates is most of the cost); each test decides on a copy."""
    return CONSTRAINTS[constraint]()


# ---------------------------------------------------------------- the check


def assert_respected(snap: Snapshot, decision: Decision, what: object) -> None:
    """The decision as the ledger's own rules allow it (module docstring)."""
    views = {j.name: j for j in snap.jobs}
    tasks = []
    for name, d in decision.jobs.items():
        job = views[name]
        if d.ps + d.workers == 0:
            continue
        for role, count in (("ps", d.ps), ("worker", d.workers)):
            low, high = job.bounds(role)
            start = job.starting_gang[0 if role == "ps" else 1]
            assert max(low, start) <= count <= high, (what, name, role, count, (low, high))
        tasks += [(job, "ps", n) for n in d.ps_nodes] + [(job, "worker", n) for n in d.worker_nodes]
    ledger = Ledger(snap, FirstFit())
    while tasks:
        i = next((i for i, (job, role, n) in enumerate(tasks)
                  if ledger.fits_on(job.demand(role), n, job, role)), None)
        assert i is not None, (what, "tasks the ledger does not let in, whatever the order",
                               [(j.name, r, snap.node_names[n]) for j, r, n in tasks],
                               {k: (v.ps_nodes, v.worker_nodes) for k, v in decision.jobs.items()})
        job, role, n = tasks.pop(i)
        ledger.book(job, role, n)


@pytest.mark.parametrize("placement", list(registry.PLACEMENT))
@pytest.mark.parametrize("allocation", list(registry.ALLOCATION))
@pytest.mark.parametrize("constraint", list(CONSTRAINTS))
def test_every_policy_respects_each_constraint(constraint, allocation, placement):
    snap = copy.deepcopy(_case(constraint))  # no policy may see what another changed
    decision = run_round(snap, _allocation(allocation), _placement(placement))
    assert_respected(snap, decision, (constraint, allocation, placement))
    # Not vacuous: the cluster is used (each case leaves every policy room for some job).
    assert any(d.workers for d in decision.jobs.values()), (constraint, allocation, placement)


def _unconstrained(snap: Snapshot) -> Snapshot:
    """The same jobs and nodes with every constraint but capacity taken away."""
    free = copy.deepcopy(snap)
    free.budget, free.exclusive_in_use = None, None
    for job in free.jobs:
        job.node_filters, job.exclusive, job.counted = {}, {}, {}
        job.spreads, job.spread_counts = {}, {}
    return free


@pytest.mark.parametrize("constraint", [c for c in CONSTRAINTS if c != "capacity"])
def test_each_case_binds_and_the_check_sees_it_broken(constraint):
    """Without its constraint, DRF with bin-packing decides what the constraint forbids, and
    the check says so: neither a case nor the check is vacuous."""
    snap = _case(constraint)
    decision = run_round(_unconstrained(snap), _allocation("drf"), _placement("bin-pack"))
    with pytest.raises(AssertionError, match="does not let in"):
        assert_respected(snap, decision, constraint)
