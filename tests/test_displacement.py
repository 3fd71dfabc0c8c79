"""Tasks whose node was drained, deleted or tainted are placed again by the next admission
step (controller/scheduling/displacement.py, round._restore), not left Pending until the next round."""

from __future__ import annotations

import copy

import numpy as np

from mlsched.cluster.types import JobDecision, Snapshot
from mlsched.controller.scheduling import displacement
from mlsched.controller.constraints.node_constraints import EVERY_NODE, role_constraints
from mlsched.controller.objects.records import node_record
from mlsched.policies import registry
from mlsched.policies.round import run_admission
from conftest import job
from builders import NOW, NS, node, policy, ps_job, run
from controller_steps import admit, round_, settle, setup


def _pods(kube, job):
    return {p["metadata"]["name"]: p for p in kube.of_kind("Pod")
            if p["metadata"]["labels"]["mlsched.io/job-name"] == job}


def _drain(kube, name):
    """`kubectl drain`: the node cordoned, its pods evicted (the StatefulSets recreate them)."""
    kube.obj("Node", "", name)["spec"]["unschedulable"] = True
    for p in kube.of_kind("Pod"):
        if p["spec"].get("nodeName") == name:
            del kube.objects[("Pod", p["metadata"]["namespace"], p["metadata"]["name"])]


def _placed_job(nodes=6):
    rt, kube = setup(nodes=nodes, policies=(policy(allocation="fixed"),),
                     job_bodies=[ps_job("bert", max_workers=4)])
    first = round_(rt, kube)
    settle(rt, kube)
    return rt, kube, first.targets["bert"]


def test_tasks_of_a_drained_node_are_placed_again_and_the_others_stay():
    rt, kube, before = _placed_job()
    drained = before.nodes["worker"][1]
    lost = {(role, k) for role, names in before.nodes.items()
            for k, n in enumerate(names) if n == drained}
    uids = {name: p["metadata"]["uid"] for name, p in _pods(kube, "bert").items()}
    _drain(kube, drained)
    settle(rt, kube)
    # The recreated pods are not pinned to the cordoned node: they wait, gated, for the step.
    for role, k in lost:
        recreated = kube.obj("Pod", NS, f"bert-{role}-{k}")
        assert recreated["spec"].get("schedulingGates") and not recreated["spec"].get("nodeSelector")

    report = admit(rt, kube)
    after = report.targets["bert"]
    for role, names in before.nodes.items():
        assert len(after.nodes[role]) == len(names)  # the same counts: a repair, not a decision
        for k, n in enumerate(names):
            if (role, k) in lost:
                assert after.nodes[role][k] != drained
            else:
                assert after.nodes[role][k] == n  # kept tasks keep their node and ordinal
    events = [e["message"] for e in kube.events("bert") if e["reason"] == "Displaced"]
    assert len(events) == 1 and f"on {drained} (cordoned)" in events[0], events
    assert "bert-worker-1 " in events[0] or "bert-worker-1," in events[0]
    settle(rt, kube)
    pods = _pods(kube, "bert")
    for name, p in pods.items():
        role, k = p["metadata"]["labels"]["mlsched.io/role"], int(name.rsplit("-", 1)[1])
        assert p["spec"]["nodeName"] == after.nodes[role][k] != drained
        if (role, k) not in lost:
            assert p["metadata"]["uid"] == uids[name]  # not restarted
    assert kube.obj("MLJob", NS, "bert")["status"]["placement"]["worker"] == list(after.nodes["worker"])
    assert admit(rt, kube) is None  # repaired: nothing to do again
    counted = rt.process.metrics.displaced_tasks.labels(NS, "default", "node")._value.get()
    assert counted == len(lost)


def test_a_pod_still_running_on_a_cordoned_node_is_left_there():
    rt, kube, before = _placed_job()
    kube.obj("Node", "", before.nodes["worker"][0])["spec"]["unschedulable"] = True
    assert admit(rt, kube) is None  # Kubernetes leaves running pods on a cordoned node too


def test_tasks_of_a_deleted_node_are_placed_again():
    rt, kube, before = _placed_job()
    gone = before.nodes["ps"][0]
    del kube.objects[("Node", "", gone)]
    # The pod garbage collector removes pods bound to a node that no longer exists.
    for p in kube.of_kind("Pod"):
        if p["spec"].get("nodeName") == gone:
            del kube.objects[("Pod", NS, p["metadata"]["name"])]
    report = admit(rt, kube)
    assert gone not in report.targets["bert"].nodes["ps"] + report.targets["bert"].nodes["worker"]
    assert len(report.targets["bert"].nodes["ps"]) == len(before.nodes["ps"])
    events = [e["message"] for e in kube.events("bert") if e["reason"] == "Displaced"]
    assert events and f"on {gone} (deleted)" in events[0]


def test_a_job_whose_gang_no_longer_fits_waits_and_holds_nothing():
    # Both nodes drained (maintenance of the whole pool): nothing can take the job's tasks.
    rt, kube, before = _placed_job(nodes=2)
    assert before.count("worker")
    _drain(kube, "node-0")
    _drain(kube, "node-1")
    settle(rt, kube)
    report = admit(rt, kube)
    assert report.targets["bert"].count("worker") == 0
    assert kube.obj("StatefulSet", NS, "bert-worker")["spec"]["replicas"] == 0
    assert kube.obj("StatefulSet", NS, "bert-ps")["spec"]["replicas"] == 0
    # The nodes back: the waiting job is admitted again.
    for name in ("node-0", "node-1"):
        kube.obj("Node", "", name)["spec"]["unschedulable"] = False
    assert admit(rt, kube).targets["bert"].count("worker") == before.count("worker")


def test_refusal_names_why():
    plain = node_record(node("n"))
    assert displacement.refusal(plain, EVERY_NODE, {}, frozenset()) is None
    assert displacement.refusal(None, EVERY_NODE, {}, frozenset()) == "deleted"
    assert displacement.refusal(node_record(node("n", ready=False)), EVERY_NODE, {},
                                frozenset()) == "not Ready"
    cordoned = node("n")
    cordoned["spec"]["unschedulable"] = True
    assert displacement.refusal(node_record(cordoned), EVERY_NODE, {}, frozenset()) == "cordoned"
    tainted = node_record(node("n", taints=[{"key": "maint", "effect": "NoExecute"}]))
    assert displacement.refusal(tainted, EVERY_NODE, {}, frozenset()) == "tainted maint:NoExecute"
    assert displacement.refusal(tainted, EVERY_NODE, {}, frozenset({"maint"})) is None
    tolerant = role_constraints({"worker": {"spec": {"tolerations": [
        {"key": "maint", "operator": "Exists"}]}}})["worker"]
    assert displacement.refusal(tainted, tolerant, {}, frozenset()) is None
    picky = role_constraints({"worker": {"spec": {"nodeSelector": {"disk": "ssd"}}}})["worker"]
    assert displacement.refusal(plain, picky, {}, frozenset()) == \
        "labels its template does not select"
    assert displacement.refusal(plain, EVERY_NODE, {"pool": "gpu"}, frozenset()) == \
        "outside the operator's node selector"


def _snapshot(gpus_per_node, job_view):
    cap = np.array([[8.0, g, 48.0] for g in gpus_per_node])
    return Snapshot(0.0, 1200.0, [f"n{i}" for i in range(len(gpus_per_node))], cap, [job_view])


def _job(ps_nodes, worker_nodes):
    return job("j", ps=len(ps_nodes), workers=len(worker_nodes), ps_nodes=tuple(ps_nodes),
               worker_nodes=tuple(worker_nodes), worker_demand=np.array([1.0, 1.0, 1.0]),
               ps_demand=np.array([1.0, 0.0, 1.0]))


def _admit(snapshot, slots):
    return run_admission(snapshot, registry.make_allocation("drf"),
                         registry.make_placement("load-balance"), displaced={"j": slots})


def test_restore_keeps_ordinals_and_shrinks_from_the_top_when_short():
    # Workers 2 and 3 lost their node; n1 has room for one of them: 3 workers, the kept ones
    # where they were, the new one at ordinal 2.
    decision = _admit(_snapshot([2, 1], _job([0], [0, 0])),
                      {"ps": (0,), "worker": (0, 0, None, None)})
    assert decision.jobs["j"] == JobDecision([0], [0, 0, 1])
    # Worker 1 lost its node and nothing has room: 2 workers, ordinal 2's node taking
    # ordinal 1 (the StatefulSet removes the highest ordinal; no kept task moves node).
    decision = _admit(_snapshot([2, 0], _job([0], [0, 0])),
                      {"ps": (0,), "worker": (0, None, 0)})
    assert decision.jobs["j"] == JobDecision([0], [0, 0])


def test_restore_below_the_starting_gang_decides_the_job_again_as_a_waiting_one():
    # Its only PS lost, and its two workers hold all of the node's CPU: kept as it is, the job
    # cannot get its PS back. It is released and decided again with the waiting jobs, which
    # gives it a smaller gang that fits (a PS job without a PS trains nothing).
    cap = np.array([[2.0, 2.0, 48.0]])
    snap = Snapshot(0.0, 1200.0, ["n0"], cap, [_job([], [0, 0])])
    decision = _admit(snap, {"ps": (None,), "worker": (0, 0)})
    assert decision.jobs["j"] == JobDecision([0], [0])


def _refuse(rt, kube, name, message="0/6 nodes are available: 1 node(s) didn't match pod "
                                     "anti-affinity rules, 5 node(s) didn't match Pod's node "
                                     "affinity/selector."):
    """kube-scheduler refusing a pinned pod: unbound, Pending, PodScheduled=False."""
    from mlsched.controller.app import pod_events

    pod = kube.obj("Pod", NS, name)
    pod["spec"].pop("nodeName", None)
    pod["status"] = {"phase": "Pending", "conditions": [
        {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": message}]}
    run(pod_events.on_pod_event(rt, "MODIFIED", pod, kube.indexes()))
    return pod["spec"]["nodeSelector"]["kubernetes.io/hostname"]


def test_a_pod_kube_scheduler_refuses_where_it_was_pinned_is_placed_elsewhere():
    """A constraint the operator does not plan with (here, as kube-scheduler would report a
    required pod anti-affinity): the refused pod used to stay Pending until the next round,
    which could decide the same node again."""
    rt, kube, before = _placed_job()
    refused_on = _refuse(rt, kube, "bert-worker-1")
    assert "admission" in rt.scheduling.wakeups.peek((NS, "default"))  # woken, not left for the round
    report = admit(rt, kube)
    after = report.targets["bert"]
    assert after.nodes["worker"][1] != refused_on
    assert [n for k, n in enumerate(after.nodes["worker"]) if k != 1] == \
        [n for k, n in enumerate(before.nodes["worker"]) if k != 1]
    events = [e["message"] for e in kube.events("bert") if e["reason"] == "Displaced"]
    assert events and "bert-worker-1 on" in events[0] and "kube-scheduler: 0/6 nodes" in events[0]
    settle(rt, kube)
    assert kube.obj("Pod", NS, "bert-worker-1")["spec"]["nodeName"] == after.nodes["worker"][1]
    assert admit(rt, kube) is None
    assert rt.process.metrics.displaced_tasks.labels(NS, "default", "scheduler")._value.get() == 1


def test_refused_pods_are_moved_a_bounded_number_of_times():
    """What a pod lacks may be lacking everywhere (a volume that cannot bind): after MAX_MOVES
    moves in REFUSAL_TTL_S, refused pods stay, reported Unschedulable, even when every task of
    the role is refused and they outnumber the nodes (no bound by distinct nodes would do)."""
    from mlsched.controller.scheduling.displacement import MAX_MOVES

    rt, kube, before = _placed_job()
    moves = 0
    for _ in range(3 * MAX_MOVES):
        settle(rt, kube)
        for pod in [p for p in kube.of_kind("Pod") if "-worker-" in p["metadata"]["name"]]:
            if pod["spec"].get("nodeSelector"):
                _refuse(rt, kube, pod["metadata"]["name"], "0/6 nodes are available: pod has "
                        "unbound immediate PersistentVolumeClaims")
        if admit(rt, kube) is None:
            break
        moves += 1
    assert moves == MAX_MOVES, moves
    assert rt.pods.refusals.moves((NS, "bert"), "worker", NOW + 30) == MAX_MOVES
    assert rt.pods.refusals.moves((NS, "bert"), "worker", NOW + 30 + 601) == 0  # faded
    assert rt.pods.refusals.of((NS, "bert"), "worker", NOW + 30 + 601) == frozenset()


def test_a_refusal_where_our_own_pod_is_still_terminating_waits_for_it():
    """A round moved a task onto a node another task of ours is leaving: kube-scheduler
    refuses the new pod until the old one's grace period ends. That is not a displacement."""
    rt, kube, before = _placed_job()
    shared = [k for k, n in enumerate(before.nodes["worker"]) if n in before.nodes["ps"]]
    k = shared[0]  # a worker whose node also runs a PS of the job
    node = _refuse(rt, kube, f"bert-worker-{k}", "0/6 nodes are available: 1 Insufficient cpu")
    leaving = next(p for p in kube.of_kind("Pod") if p["spec"].get("nodeName") == node)
    leaving["metadata"]["deletionTimestamp"] = "2023-11-14T22:15:00Z"
    assert admit(rt, kube) is None
    assert rt.pods.refusals.of((NS, "bert"), "worker", NOW + 30) == frozenset()
    del kube.objects[("Pod", NS, leaving["metadata"]["name"])]  # gone: now it is a refusal
    assert admit(rt, kube).targets["bert"].nodes["worker"][k] != node


def test_a_refusal_where_our_pod_is_beyond_its_count_or_just_left_waits_then_is_acted_on():
    """A round shrank a job and gave its room to another at once: the new pod is pinned where
    a pod beyond the shrunk job's count still runs until the StatefulSet removes it, and once
    it is gone the refusal stays in the new pod's status until kube-scheduler tries again.
    Acting on either moved 200-270 pods per 2,000-job settling (bench_e2e (b))."""
    from mlsched.controller.scheduling.displacement import DEPARTURE_SETTLE_S

    rt, kube, before = _placed_job()
    shared = [k for k, n in enumerate(before.nodes["worker"]) if n in before.nodes["ps"]]
    k = shared[0]
    node = _refuse(rt, kube, f"bert-worker-{k}", "0/6 nodes are available: 1 Insufficient cpu")
    beyond = copy.deepcopy(kube.obj("Pod", NS, f"bert-worker-{k}"))
    beyond["metadata"].update(name="bert-worker-9", uid="uid-beyond")
    beyond["spec"]["nodeName"] = node
    beyond["status"] = {"phase": "Running"}
    kube.put(beyond)
    assert admit(rt, kube) is None  # beyond the decided count: it is leaving
    assert rt.pods.refusals.of((NS, "bert"), "worker", NOW + 30) == frozenset()
    del kube.objects[("Pod", NS, "bert-worker-9")]
    rt.pods.refusals.departed(node, NOW + 30)
    assert admit(rt, kube, now=NOW + 30 + DEPARTURE_SETTLE_S - 1) is None  # the refusal may be stale
    after = admit(rt, kube, now=NOW + 30 + DEPARTURE_SETTLE_S + 1)
    assert after is not None and after.targets["bert"].nodes["worker"][k] != node


def test_the_nodes_our_pods_are_leaving_name_the_pod_and_are_worked_out_once_a_second():
    """What a job's conditions read (displacement.Vacating): a pod refused on such a node is
    starting, not Unschedulable (e2e: test_operator_unschedulable)."""
    rt, kube, before = _placed_job()
    node = before.nodes["worker"][0]
    idx = kube.indexes()
    assert rt.pods.vacating.nodes(idx.pods, rt.scheduling.placements.of, (), 100.0) == {}
    leaving = next(p for p in kube.of_kind("Pod") if p["spec"].get("nodeName") == node)
    leaving["metadata"]["deletionTimestamp"] = "2023-11-14T22:15:00Z"
    kube.put(leaving)
    idx = kube.indexes()
    assert rt.pods.vacating.nodes(idx.pods, rt.scheduling.placements.of, (), 100.05, asked={node}) == {}
    assert rt.pods.vacating.nodes(idx.pods, rt.scheduling.placements.of, (), 100.5) == {}  # within the second
    # ... unless asked about a node the last answer does not name (a round may vacate it now)
    assert rt.pods.vacating.nodes(idx.pods, rt.scheduling.placements.of, (), 100.6, asked={node}) == {
        node: leaving["metadata"]["name"]}
    assert rt.pods.vacating.nodes(idx.pods, rt.scheduling.placements.of, ("node-9",), 101.7) == {
        node: leaving["metadata"]["name"], "node-9": ""}  # "": one of ours left it lately
