"""A node's pod slots and extended resources are counted like CPU
(controller/admission/counted_resources.py): no round plans more pods on a node than its allocatable
`pods` leave, or more of an RDMA NIC or a MIG slice than it has left, so kube-scheduler never
has to refuse a pinned pod for "Too many pods" or "Insufficient example.com/nic"."""

from __future__ import annotations

import numpy as np

from mlsched.api import get_condition
from mlsched.cluster.ledger import Ledger
from mlsched.cluster.types import JobView, Snapshot
from mlsched.controller.admission.counted_resources import POD_SLOTS
from mlsched.controller.objects.records import node_record, pod_record
from mlsched.controller.scheduling.snapshot import build_snapshot
from mlsched.controller.scheduling.cluster_fit import ClusterFit
from mlsched.controller.scheduling.cluster_state import ClusterState, held_counted
from mlsched.policies.placement.heuristics import FirstFit
from builders import (
    NIC, NS, allreduce_job, cluster, counted_node, counted_record, create_jobs, make_runtime, node,
    pod, policy, run, small_workers,
)
from controller_steps import admit, round_, settle, setup, sync


# ---------------------------------------------------------------- what records carry


def test_nodes_carry_their_pod_slots_and_pods_their_extended_resources():
    assert counted_node("a", pods=29).pods == 29
    bare = node("b")
    del bare["status"]["allocatable"]["pods"]
    assert node_record(bare).pods == float("inf")  # not reported: no limit
    body = pod("ring", "worker", 0, node_name="n0")
    body["spec"]["containers"][0]["resources"]["requests"][NIC] = "2"
    assert pod_record(body).extended == ((NIC, 2.0),)


# ---------------------------------------------------------------- the ledger


def _view(name: str, takes=((NIC, 1.0),), workers=(1, 16)) -> JobView:
    return JobView(name=name, model="resnet-50", arch="allreduce", arrival_s=0.0, total_epochs=10,
                   min_workers=workers[0], max_workers=workers[1],
                   worker_demand=np.array([1.0, 0.0, 1.0]), counted={"worker": tuple(takes)})


def test_the_ledger_books_counted_resources_per_node():
    a, b = _view("a"), _view("b", takes=((NIC, 1.0), (POD_SLOTS, 1.0)))
    snap = Snapshot(time_s=0, interval_s=60, node_names=["n0", "n1", "n2"],
                    capacity=np.array([[8.0, 0.0, 48.0]] * 3), jobs=[a, b],
                    counted_free={NIC: np.array([2.0, 0.0, 1.0]), POD_SLOTS: np.array([1.0, 5.0, 5.0])})
    ledger = Ledger(snap, FirstFit())
    while ledger.grow(a, "worker"):
        pass
    assert sorted(ledger.jobs["a"].worker_nodes) == [0, 0, 2]  # 8 CPUs per node would take 24
    assert not ledger.grow(b, "worker")
    ledger.release(a, [("worker", 2)])
    assert ledger.fits_mask(b.worker_demand, b, "worker").tolist() == [False, False, True]
    assert ledger.grow(b, "worker") and ledger.jobs["b"].worker_nodes == [2]
    assert snap.counted_free[NIC].tolist() == [2.0, 0.0, 1.0]  # the snapshot is left alone
    assert ledger.counted_free[POD_SLOTS].tolist() == [1.0, 5.0, 4.0]


# Every allocation x every placement plans with them: test_policy_constraints_contract.py.


# ---------------------------------------------------------------- the cluster's view


def test_what_other_pods_hold_is_taken_out_and_pod_slots_only_where_they_could_run_out():
    nodes = [counted_node("n0", pods=3, nics=2), counted_node("n1", pods=3, nics=2), counted_node("n2", pods=110, nics=2)]
    theirs = pod("other", "worker", 0, node_name="n0")
    theirs["spec"]["containers"][0]["resources"]["requests"][NIC] = "1"
    mine = pod("ring", "worker", 0, node_name="n1")
    state = ClusterState(nodes=nodes, pods={(NS, "other"): [pod_record(theirs)],
                                            (NS, "ring"): [pod_record(mine)]},
                         foreign={"n1": [(0.1, 0.0, 0.1), (0.1, 0.0, 0.1)]},
                         foreign_extended={"n1": [((NIC, 2.0),)]})
    held = held_counted(state, own_jobs={(NS, "ring")})
    assert held == {"n0": {POD_SLOTS: 1.0, NIC: 1.0}, "n1": {POD_SLOTS: 2.0, NIC: 2.0}}
    job = counted_record(small_workers(allreduce_job("ring"), nics=1))
    snap = build_snapshot([job], state, now_s=0, interval_s=60, counted_used=held)
    assert snap.counted_free[NIC].tolist() == [1.0, 0.0, 2.0]
    assert snap.counted_free[POD_SLOTS].tolist() == [2.0, 1.0, 110.0]  # 16 half-CPU pods per node
    assert snap.jobs[0].counted == {"worker": ((NIC, 1.0), (POD_SLOTS, 1.0))}
    # 2-CPU workers: 4 per node at most, fewer than any node's free slots: slots not counted.
    roomy = [counted_node(f"m{i}", pods=110) for i in range(3)]
    job = counted_record(small_workers(allreduce_job("big"), cpu="2"))
    snap = build_snapshot([job], ClusterState(nodes=roomy), now_s=0, interval_s=60, counted_used={})
    assert snap.counted_free == {} and snap.jobs[0].counted == {}


def test_a_minimum_needing_more_pods_or_nics_than_the_nodes_have_cannot_fit():
    fit = ClusterFit.of([counted_node(f"n{i}", pods=3, nics=2) for i in range(6)])
    assert fit.why_not(counted_record(small_workers(allreduce_job("ok", max_workers=18), min_workers=18))) is None
    wide = counted_record(small_workers(allreduce_job("wide", max_workers=20), min_workers=20))
    assert fit.why_not(wide) == ("its minimum of 20 worker needs 20 pods; the 6 schedulable nodes "
                                 "that can take one have room for 18 (allocatable pods)")
    nics = counted_record(small_workers(allreduce_job("nics", max_workers=14), nics=1, min_workers=14))
    assert fit.why_not(nics) == ("its minimum of 14 worker needs 14 pods taking 1 example.com/nic "
                                 "each; the 6 schedulable nodes that can take one have room for 12 "
                                 "(allocatable example.com/nic)")


# ---------------------------------------------------------------- through the operator


def _slots(kube, pods: int) -> None:
    for body in kube.of_kind("Node"):
        body["status"]["allocatable"]["pods"] = str(pods)


def test_the_operator_plans_with_pod_slots_and_a_job_they_cannot_hold_waits_saying_why():
    # Found in the sandbox: bin-packing pinned 8 half-CPU workers to one node of 3 pod slots;
    # kube-scheduler refused 5 ("Too many pods"). A second job of 12 was admitted with 10 slots
    # left: 10 pods ran, 2 stayed Pending for good, and the gang never trained.
    rt, kube = setup(nodes=6, policies=(policy(placement="bin-pack"),),
                     job_bodies=[small_workers(allreduce_job("first", max_workers=8), min_workers=8)])
    _slots(kube, 3)
    report = round_(rt, kube)
    nodes = report.targets["first"].nodes["worker"]
    assert len(nodes) == 8 and max(nodes.count(n) for n in nodes) == 3, nodes
    settle(rt, kube)
    run(create_jobs(rt, kube, small_workers(allreduce_job("second", max_workers=12), min_workers=12)))
    settle(rt, kube)
    report = admit(rt, kube)
    assert report is None or report.targets["second"].nodes["worker"] == ()
    assert not [p for p in kube.of_kind("Pod") if p["metadata"]["name"].startswith("second-")]
    sync(rt, kube, "second")
    admitted = get_condition(kube.obj("MLJob", NS, "second")["status"]["conditions"], "Admitted")
    assert admitted.reason == "WaitingForAllocation", admitted
    assert ("its minimum (12 worker) needs 12 worker pods; the 6 nodes it may use have 10 pod "
            "slots free now") in admitted.message, admitted.message


def test_the_operator_plans_with_extended_resources_other_pods_use():
    kube = cluster(4)
    for body in kube.of_kind("Node"):
        body["status"]["allocatable"][NIC] = "2"
    other = pod("other", "worker", 0, node_name="node-0", namespace="elsewhere")
    other["metadata"]["labels"] = {}
    other["spec"]["containers"][0]["resources"]["requests"][NIC] = "2"
    kube.put(other)
    rt, kube = make_runtime(kube)
    kube.put(policy(placement="bin-pack"))
    run(create_jobs(rt, kube, small_workers(allreduce_job("nics", max_workers=8), cpu="1", nics=1,
                                            min_workers=8)))
    report = round_(rt, kube)
    assert report.targets["nics"].nodes["worker"] == ()  # 6 NICs free for a gang of 8
    sync(rt, kube, "nics")
    admitted = get_condition(kube.obj("MLJob", NS, "nics")["status"]["conditions"], "Admitted")
    assert ("needs 8 worker pods taking 1 example.com/nic each; the 4 nodes it may use have room "
            "for 6 such pods now") in admitted.message, admitted.message
    del kube.objects[("Pod", "elsewhere", other["metadata"]["name"])]
    report = round_(rt, kube)
    nodes = report.targets["nics"].nodes["worker"]
    assert sorted(nodes.count(n) for n in set(nodes)) == [2, 2, 2, 2], nodes  # 8 on one node before


def test_two_policies_deciding_one_after_the_other_count_each_others_tasks_before_pods_exist():
    # Found in the sandbox: two policies' jobs submitted together were both bin-packed onto the
    # same two nodes of three pod slots (the first one's pods did not exist yet, and
    # reservations are CPU, GPU and memory); kube-scheduler refused three pods.
    first = small_workers(allreduce_job("first", max_workers=6), min_workers=6)
    second = small_workers(allreduce_job("second", max_workers=6), min_workers=6)
    first["spec"]["schedulingPolicy"], second["spec"]["schedulingPolicy"] = "a", "b"
    rt, kube = setup(nodes=6, policies=(policy("a", placement="bin-pack"),
                                        policy("b", placement="bin-pack")),
                     job_bodies=[first, second])
    _slots(kube, 3)
    one = admit(rt, kube, name="a").targets["first"].nodes["worker"]
    two = admit(rt, kube, name="b").targets["second"].nodes["worker"]
    assert not [p for p in kube.of_kind("Pod")]  # neither job's pods exist yet
    assert not set(one) & set(two), (one, two)
    assert max(one.count(n) for n in one) == 3 and max(two.count(n) for n in two) == 3
