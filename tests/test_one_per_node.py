"""Host ports (controller/constraints/host_ports.py) and spreading pod anti-affinity
(controller/constraints/pod_anti_affinity.py) are planned like capacity: one pod holding a port, or
matching the selector, per node, across jobs, so kube-scheduler never has to refuse a pinned
pod for "didn't have free ports for the requested pod ports" or "didn't match pod
anti-affinity rules"."""

from __future__ import annotations

import numpy as np

from mlsched.api import get_condition
from mlsched.cluster.ledger import Ledger
from mlsched.cluster.types import JobDecision, JobView, Snapshot
from mlsched.controller.constraints.host_ports import host_ports, role_host_ports
from mlsched.controller.constraints.pod_anti_affinity import spreading_selectors
from mlsched.controller.constraints.topology_spread import spread_constraints
from mlsched.controller.objects.records import node_record, pod_record
from mlsched.controller.objects.job_records import job_record
from mlsched.controller.scheduling.snapshot import build_snapshot
from mlsched.controller.scheduling.cluster_fit import ClusterFit
from mlsched.controller.scheduling.cluster_state import ClusterState, held_ports
from mlsched.policies import registry
from mlsched.policies.placement.heuristics import FirstFit
from mlsched.policies.round import run_round
from builders import NS, allreduce_job, create_jobs, node, pod, policy, run
from controller_steps import sync
from controller_steps import admit, round_, settle, setup

NCCL = ("TCP", 29500)


def host_network(body: dict, port: int = 29500) -> dict:
    """The job's worker pods on the host's network, listening on `port`."""
    spec = body["spec"]["replicaSpecs"]["worker"]["template"]["spec"]
    spec["hostNetwork"] = True
    spec["containers"][0]["ports"] = [{"containerPort": port, "name": "nccl"}]
    return body


# ---------------------------------------------------------------- which ports a pod holds


def test_host_network_container_ports_are_host_ports_and_plain_container_ports_are_not():
    plain = {"containers": [{"name": "c", "ports": [{"containerPort": 29500}]}]}
    assert host_ports(plain) == frozenset()
    assert host_ports({**plain, "hostNetwork": True}) == {NCCL}
    explicit = {"containers": [{"name": "c", "ports": [
        {"containerPort": 80, "hostPort": 8080}, {"containerPort": 53, "hostPort": 53, "protocol": "UDP"}]}]}
    assert host_ports(explicit) == {("TCP", 8080), ("UDP", 53)}


def test_sidecars_hold_their_ports_and_regular_init_containers_do_not():
    # kube-scheduler 1.34, tried on the e2e control plane: a second pod whose sidecar
    # (restartPolicy Always) declares hostPort 30001 is refused on the same node; two pods
    # whose regular init container declares 30002 both run there.
    spec = {"containers": [{"name": "c"}], "initContainers": [
        {"name": "side", "restartPolicy": "Always", "ports": [{"containerPort": 1, "hostPort": 30001}]},
        {"name": "init", "ports": [{"containerPort": 1, "hostPort": 30002}]}]}
    assert host_ports(spec) == {("TCP", 30001)}


def test_bad_shapes_hold_nothing():
    assert host_ports(None) == frozenset()
    assert host_ports({"containers": [{"name": "c", "ports": ["29500", None, {"hostPort": "x"}]}]}) == frozenset()
    assert role_host_ports({"worker": {"spec": {"hostNetwork": True, "containers": [
        {"name": "c", "ports": [{"containerPort": 29500}]}]}}, "ps": {}}) == {"worker": {NCCL}}


def test_job_and_pod_records_carry_the_ports():
    job = job_record({**host_network(allreduce_job("ring")), "metadata": {
        "name": "ring", "namespace": NS, "uid": "u", "creationTimestamp": "2024-01-01T00:00:00Z"}})
    assert job.host_ports == {"worker": {NCCL}}
    body = pod("ring", "worker", 0, node_name="n0")
    body["spec"]["hostNetwork"] = True
    body["spec"]["containers"][0]["ports"] = [{"containerPort": 29500}]
    assert pod_record(body).host_ports == {NCCL}


# ---------------------------------------------------------------- the ledger


def _view(name: str, workers: tuple[int, int], ports=frozenset({NCCL}), arrival: float = 0.0) -> JobView:
    return JobView(name=name, model="resnet-50", arch="allreduce", arrival_s=arrival, total_epochs=10,
                   min_workers=workers[0], max_workers=workers[1],
                   worker_demand=np.array([2.0, 1.0, 8.0]),
                   exclusive={"worker": frozenset(ports)} if ports else {})


def _snapshot(jobs, nodes: int = 6, ports_in_use=None) -> Snapshot:
    return Snapshot(time_s=0.0, interval_s=600.0, node_names=[f"n{i}" for i in range(nodes)],
                    capacity=np.array([[8.0, 2.0, 48.0]] * nodes), jobs=jobs,
                    exclusive_in_use=ports_in_use)


def test_a_node_takes_one_task_per_port_whoever_holds_it():
    a, b, free = _view("a", (1, 8)), _view("b", (1, 4)), _view("free", (1, 6), ports=())
    ledger = Ledger(_snapshot([a, b, free]), FirstFit())
    while ledger.grow(a, "worker"):
        pass
    # 2 GPUs per node would take 12 tasks; the port allows 6, one per node.
    assert sorted(ledger.jobs["a"].worker_nodes) == list(range(6))
    assert not ledger.grow(b, "worker")  # the same port everywhere: nothing
    while ledger.grow(free, "worker"):  # a job holding no port uses the GPUs left
        pass
    assert ledger.jobs["free"].workers == 6
    last = ledger.jobs["a"].worker_nodes[-1]
    ledger.release(a, [("worker", last)])
    assert ledger.grow(b, "worker") and ledger.jobs["b"].worker_nodes == [last]  # freed there only
    ledger2 = Ledger(_snapshot([b]), FirstFit())
    ledger2.book(a, "worker", 0)
    ledger2.book(a, "worker", 0)  # kept where they were (book_held), even in conflict
    ledger2.release(a, [("worker", 0)])
    assert not ledger2.fits_on(b.worker_demand, 0, b, "worker")  # one holder is left
    assert ledger2.fits_on(b.worker_demand, 1, b, "worker")


def test_ports_held_by_other_pods_keep_tasks_off_their_nodes():
    a = _view("a", (1, 8))
    other_port = frozenset({("TCP", 9090)})
    held = [frozenset({NCCL}), frozenset(), other_port, frozenset({NCCL}), frozenset(), frozenset()]
    ledger = Ledger(_snapshot([a], ports_in_use=held), FirstFit())
    while ledger.grow(a, "worker"):
        pass
    assert sorted(ledger.jobs["a"].worker_nodes) == [1, 2, 4, 5]
    assert list(ledger.exclusive_free_nodes(a, "worker")) == [False] * 6


# Every allocation x every placement plans with host ports and anti-affinity:
# test_policy_constraints_contract.py.


# ---------------------------------------------------------------- the cluster's view


def _ported_pod(job: str, ordinal: int, node_name: str, *, labelled: bool = True) -> dict:
    body = pod(job, "worker", ordinal, node_name=node_name)
    body["spec"]["hostNetwork"] = True
    body["spec"]["containers"][0]["ports"] = [{"containerPort": 29500}]
    if not labelled:
        body["metadata"]["labels"] = {}
    return body


def test_ports_of_pods_the_round_does_not_redecide_are_held():
    nodes = [node_record(node(f"n{i}")) for i in range(3)]
    mine = pod_record(_ported_pod("ring", 0, "n0"))
    theirs = pod_record(_ported_pod("other", 0, "n1"))
    state = ClusterState(nodes=nodes, pods={(NS, "ring"): [mine], (NS, "other"): [theirs]},
                         foreign_ports={"n2": [frozenset({("UDP", 53)})]})
    held = held_ports(state, own_jobs={(NS, "ring")})
    assert held == {"n1": {NCCL}, "n2": {("UDP", 53)}}
    snap = build_snapshot([], state, now_s=0, interval_s=60, ports=held)
    assert snap.exclusive_in_use == [frozenset(), {NCCL}, {("UDP", 53)}]
    assert build_snapshot([], state, now_s=0, interval_s=60).exclusive_in_use is None


def test_a_minimum_needing_more_nodes_than_there_are_is_told_cannot_fit():
    fit = ClusterFit.of([node_record(node(f"n{i}")) for i in range(6)])
    body = host_network(allreduce_job("wide", max_workers=8))
    body["spec"]["replicaSpecs"]["worker"]["min"] = 8
    job = job_record({**body, "metadata": {**body["metadata"], "uid": "u",
                                           "creationTimestamp": "2024-01-01T00:00:00Z"}})
    assert fit.why_not(job) == (
        "its minimum (8 worker) holds host port 29500/TCP (a hostPort, or a containerPort under "
        "hostNetwork): one such pod per node, and only 6 schedulable nodes can take one")
    body["spec"]["replicaSpecs"]["worker"]["min"] = 6
    job = job_record({**body, "metadata": {**body["metadata"], "uid": "u",
                                           "creationTimestamp": "2024-01-01T00:00:00Z"}})
    assert fit.why_not(job) is None


# ---------------------------------------------------------------- through the operator


def test_the_operator_places_one_port_holding_pod_per_node_and_a_second_job_waits_saying_why():
    first = host_network(allreduce_job("first", max_workers=8))
    rt, kube = setup(nodes=4, policies=(policy(placement="bin-pack"),), job_bodies=[first])
    report = round_(rt, kube)
    nodes = report.targets["first"].nodes["worker"]
    assert len(nodes) == 4 and len(set(nodes)) == 4, nodes  # bin-packing put 2 per node before
    settle(rt, kube)
    second = host_network(allreduce_job("second", max_workers=4))
    second["spec"]["replicaSpecs"]["worker"]["min"] = 2
    run(create_jobs(rt, kube, second))
    settle(rt, kube)
    report = admit(rt, kube)
    assert report is None or "second" not in report.targets  # it used to be given 2 workers
    assert not [p for p in kube.of_kind("Pod") if p["metadata"]["name"].startswith("second-")]
    sync(rt, kube, "second")
    admitted = get_condition(kube.obj("MLJob", NS, "second")["status"]["conditions"], "Admitted")
    assert admitted.reason == "WaitingForAllocation", admitted
    assert "needs 2 nodes where host port 29500/TCP is free" in admitted.message, admitted.message
    assert "other pods hold it on 4 of the 4 nodes" in admitted.message, admitted.message


# ---------------------------------------------------------------- required pod anti-affinity


def spread(body: dict, label: str = "trainer", term: bool = True) -> dict:
    """The job's worker pods labelled app=<label>, and (with `term`) kept one per node from
    every pod so labelled by a required anti-affinity."""
    template = body["spec"]["replicaSpecs"]["worker"]["template"]
    template.setdefault("metadata", {})["labels"] = {"app": label}
    if term:
        template["spec"]["affinity"] = {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
            {"labelSelector": {"matchLabels": {"app": label}}, "topologyKey": "kubernetes.io/hostname"}]}}
    return body


def _record(body: dict):
    return job_record({**body, "metadata": {**body["metadata"], "uid": "u-" + body["metadata"]["name"],
                                            "creationTimestamp": "2024-01-01T00:00:00Z"}})


def test_only_per_node_terms_matching_the_pods_own_labels_are_planned():
    own = {"app": "trainer", "mlsched.io/role": "worker"}

    def selectors(**term):
        spec = {"affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
            {"topologyKey": "kubernetes.io/hostname", **term}]}}}
        return spreading_selectors(spec, own)

    (found,) = selectors(labelSelector={"matchLabels": {"app": "trainer"}})
    assert str(found) == "app=trainer"
    (found,) = selectors(labelSelector={"matchExpressions": [
        {"key": "app", "operator": "In", "values": ["trainer", "eval"]}]})
    assert found.matches(own) and not found.matches({"app": "web"})
    assert selectors(labelSelector={"matchLabels": {"app": "web"}}) == ()  # repels others only
    assert selectors(labelSelector={"matchLabels": {"app": "trainer"}}, namespaces=["x"]) == ()
    assert selectors() == ()  # no labelSelector: matches no pod
    zone = {"affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"labelSelector": {"matchLabels": {"app": "trainer"}}, "topologyKey": "topology.kubernetes.io/zone"}]}}}
    assert spreading_selectors(zone, own) == ()


def test_a_selector_spreads_every_job_whose_pods_match_it():
    nodes = [node_record(node(f"n{i}")) for i in range(3)]
    carrier = _record(spread(allreduce_job("carrier", max_workers=8)))
    copy = _record(spread(allreduce_job("copy", max_workers=8), term=False))  # same label, no term
    other = _record(allreduce_job("other", max_workers=8))
    snap = build_snapshot([carrier, copy, other], ClusterState(nodes=nodes), now_s=0, interval_s=60)
    held = {v.name: v.exclusive for v in snap.jobs}
    assert held["carrier"] == held["copy"] and len(held["carrier"]["worker"]) == 1
    assert held["other"] == {}
    decision = run_round(snap, registry.make_allocation("drf"), registry.make_placement("bin-pack"))
    spread_nodes = decision.jobs["carrier"].worker_nodes + (decision.jobs.get("copy") or JobDecision()).worker_nodes
    assert len(spread_nodes) == len(set(spread_nodes)) == 3, decision.jobs
    assert decision.jobs["other"].workers >= 3  # the GPUs left are used


def test_a_spread_minimum_wider_than_the_cluster_is_told_cannot_fit():
    fit = ClusterFit.of([node_record(node(f"n{i}")) for i in range(6)])
    body = spread(allreduce_job("wide", max_workers=8))
    body["spec"]["replicaSpecs"]["worker"]["min"] = 7
    assert fit.why_not(_record(body)) == (
        "its minimum (7 worker) is spread one pod per node by its required pod anti-affinity "
        "(app=trainer): one such pod per node, and only 6 schedulable nodes can take one")


def test_the_operator_spreads_a_job_with_anti_affinity_and_a_matching_job_waits():
    rt, kube = setup(nodes=4, policies=(policy(placement="bin-pack"),),
                     job_bodies=[spread(allreduce_job("first", max_workers=8))])
    report = round_(rt, kube)
    nodes = report.targets["first"].nodes["worker"]
    assert len(nodes) == 4 and len(set(nodes)) == 4, nodes
    settle(rt, kube)
    second = spread(allreduce_job("second", max_workers=4), term=False)
    second["spec"]["replicaSpecs"]["worker"]["min"] = 2
    run(create_jobs(rt, kube, second))
    settle(rt, kube)
    report = admit(rt, kube)
    assert report is None or "second" not in report.targets
    sync(rt, kube, "second")
    admitted = get_condition(kube.obj("MLJob", NS, "second")["status"]["conditions"], "Admitted")
    assert admitted.reason == "WaitingForAllocation", admitted
    assert ("needs 2 nodes without a pod its required pod anti-affinity (app=trainer) keeps its "
            "worker pods from; such pods are on 4 of the 4 nodes") in admitted.message, admitted.message


# ---------------------------------------------------------------- topology spread constraints


def topology_spread(body: dict, key: str = "kubernetes.io/hostname", skew: int = 1, **extra) -> dict:
    template = body["spec"]["replicaSpecs"]["worker"]["template"]
    template.setdefault("metadata", {})["labels"] = {"app": "spread"}
    template["spec"]["topologySpreadConstraints"] = [{
        "maxSkew": skew, "topologyKey": key, "whenUnsatisfiable": "DoNotSchedule",
        "labelSelector": {"matchLabels": {"app": "spread"}}, **extra}]
    return body


def test_which_spread_constraints_are_enforced():
    own = {"app": "spread"}

    def found(**c):
        return spread_constraints({"topologySpreadConstraints": [c]}, own)

    base = dict(maxSkew=2, topologyKey="topology.kubernetes.io/zone", whenUnsatisfiable="DoNotSchedule",
                labelSelector={"matchLabels": own})
    (c,) = found(**base, minDomains=3, nodeAffinityPolicy="Ignore")
    assert (c.max_skew, c.topology_key, c.min_domains, c.honor_affinity) == (2, "topology.kubernetes.io/zone", 3, False)
    assert found(**{**base, "whenUnsatisfiable": "ScheduleAnyway"}) == ()  # a preference
    assert found(**base, matchLabelKeys=["pod-template-hash"]) == ()
    assert found(**{**base, "labelSelector": {"matchLabels": {"app": "other"}}}) == ()
    assert found(**{**base, "maxSkew": 0}) == ()


def _zoned(n: int, zones: int) -> list:
    return [node_record(node(f"n{i}", labels={"topology.kubernetes.io/zone": f"z{i % zones}"}))
            for i in range(n)]


def test_tasks_spread_by_hostname_and_by_zone_as_the_template_asks():
    # Bin-packing would put two 1-GPU workers per 2-GPU node: n0, n0, n1, n1.
    job = _record(topology_spread(allreduce_job("spread", max_workers=4)))
    snap = build_snapshot([job], ClusterState(nodes=_zoned(6, 3)), now_s=0, interval_s=60)
    decision = run_round(snap, registry.make_allocation("drf"), registry.make_placement("bin-pack"))
    nodes = decision.jobs["spread"].worker_nodes
    assert len(nodes) == 4 and len(set(nodes)) == 4, nodes  # skew 1 over 6 nodes: one each
    # By zone, skew 1: six workers on three zones of two nodes, two per zone.
    job = _record(topology_spread(allreduce_job("zonal", max_workers=6), key="topology.kubernetes.io/zone"))
    snap = build_snapshot([job], ClusterState(nodes=_zoned(6, 3)), now_s=0, interval_s=60)
    decision = run_round(snap, registry.make_allocation("drf"), registry.make_placement("bin-pack"))
    zones = [i % 3 for i in decision.jobs["zonal"].worker_nodes]
    assert sorted(zones) == [0, 0, 1, 1, 2, 2], decision.jobs
    # Skew 2 by hostname lets bin-packing put two per node.
    job = _record(topology_spread(allreduce_job("loose", max_workers=4), skew=2))
    snap = build_snapshot([job], ClusterState(nodes=_zoned(6, 3)), now_s=0, interval_s=60)
    decision = run_round(snap, registry.make_allocation("drf"), registry.make_placement("bin-pack"))
    assert sorted(decision.jobs["loose"].worker_nodes) == [0, 0, 1, 1]


def test_nodes_without_the_topology_key_are_not_used_and_dl2_respects_the_spread():
    nodes = _zoned(4, 2) + [node_record(node("bare"))]
    job = _record(topology_spread(allreduce_job("zonal", max_workers=8), key="topology.kubernetes.io/zone"))
    snap = build_snapshot([job], ClusterState(nodes=nodes), now_s=0, interval_s=60)
    for allocation in ("drf", "dl2"):
        decision = run_round(snap, registry.make_allocation(allocation), registry.make_placement("bin-pack"))
        placed = decision.jobs["zonal"].worker_nodes
        bare = snap.node_names.index("bare")
        assert placed and bare not in placed, (allocation, placed)
        zones = [snap.node_names[i] for i in placed]
        per_zone = [sum(1 for n in zones if int(n[1:]) % 2 == z) for z in (0, 1)]
        assert abs(per_zone[0] - per_zone[1]) <= 1, (allocation, zones)


def test_the_operator_spreads_a_bin_packed_job_as_its_template_asks():
    rt, kube = setup(nodes=4, policies=(policy(placement="bin-pack"),),
                     job_bodies=[topology_spread(allreduce_job("first", max_workers=4))])
    report = round_(rt, kube)
    nodes = report.targets["first"].nodes["worker"]
    assert len(nodes) == 4 and len(set(nodes)) == 4, nodes  # it used to be node-0, node-0, node-1, node-1


def test_matching_pods_the_round_does_not_decide_count_toward_the_spread():
    """kube-scheduler counts every pod of the namespace matching a spread constraint's selector
    (another workload's, another policy's job's); the planner counted only the tasks it decided
    itself, so a zone holding two such pods still got half of a new job's workers (skew 3)."""
    job = _record(topology_spread(allreduce_job("zonal", max_workers=2), key="topology.kubernetes.io/zone"))
    nodes = _zoned(4, 2)  # n0, n2 in z0; n1, n3 in z1
    cordoned = node("n4", labels={"topology.kubernetes.io/zone": "z0"})
    cordoned["spec"]["unschedulable"] = True
    labelled = [("n0", {"app": "spread"}, 1), ("n4", {"app": "spread"}, 1),  # z0, twice
                ("n1", {"app": "web"}, 3), ("elsewhere", {"app": "spread"}, 1)]
    snap = build_snapshot([job], ClusterState(nodes=nodes + [node_record(cordoned)]), now_s=0,
                          interval_s=60, labelled=labelled)
    assert "n4" not in snap.node_names
    (counts,) = snap.spread_held.values()
    z0 = int(snap.topology["topology.kubernetes.io/zone"][snap.node_names.index("n0")])
    assert counts[z0] == 2 and counts.sum() == 2, counts  # the cordoned node's pod counts in z0
    for placement in ("bin-pack", "load-balance"):
        decision = run_round(snap, registry.make_allocation("drf"), registry.make_placement(placement))
        zones = {snap.node_names[i] for i in decision.jobs["zonal"].worker_nodes}
        assert zones <= {"n1", "n3"} and len(decision.jobs["zonal"].worker_nodes) == 2, (placement, zones)


def test_the_operator_counts_another_workloads_matching_pods_toward_the_spread():
    rt, kube = setup(nodes=4, policies=(policy(placement="bin-pack"),),
                     job_bodies=[topology_spread(allreduce_job("first", max_workers=2))])
    for i, node_name in enumerate(("node-0", "node-1")):
        web = pod("web", "worker", i, node_name=node_name)
        web["metadata"]["labels"] = {"app": "spread"}  # not an MLJob's pod, the same label
        web["metadata"]["name"] = f"notebook-{i}"
        kube.put(web)
    nodes = round_(rt, kube).targets["first"].nodes["worker"]
    assert sorted(nodes) == ["node-2", "node-3"], nodes  # node-0 and node-1 were taken before


def test_ports_of_tasks_another_policy_decided_count_before_their_pods_exist():
    first = host_network(allreduce_job("first", max_workers=4))
    second = host_network(allreduce_job("second", max_workers=4))
    first["spec"]["replicaSpecs"]["worker"]["min"] = 4
    second["spec"]["replicaSpecs"]["worker"]["min"] = 2
    first["spec"]["schedulingPolicy"], second["spec"]["schedulingPolicy"] = "a", "b"
    rt, kube = setup(nodes=4, policies=(policy("a", placement="bin-pack"),
                                        policy("b", placement="bin-pack")),
                     job_bodies=[first, second])
    nodes = admit(rt, kube, name="a").targets["first"].nodes["worker"]
    assert len(set(nodes)) == 4
    report = admit(rt, kube, name="b")
    assert not kube.of_kind("Pod")  # the first job's pods do not exist yet
    assert report is None or report.targets["second"].nodes["worker"] == ()  # given 2 before


def test_pods_the_round_does_not_redecide_hold_the_selectors_they_match():
    """kube-scheduler keeps a pod with a required anti-affinity (no namespaces named) off nodes
    where a matching pod of its namespace runs, whoever runs it; the round used to match only
    the jobs it decided, so it pinned a task next to another workload's matching pod and
    kube-scheduler refused it."""
    from mlsched.controller.constraints.pod_anti_affinity import token
    from mlsched.controller.scheduling.cluster_state import held_labelled, held_selected

    carrier = _record(spread(allreduce_job("carrier", max_workers=8)))
    (selector,) = carrier.anti_affinity["worker"]
    other = pod_record({**pod("other", "worker", 0, node_name="n2"), "metadata": {
        **pod("other", "worker", 0)["metadata"],
        "labels": {"app": "trainer", "mlsched.io/job-name": "other", "mlsched.io/role": "worker"}}})
    state = ClusterState(nodes=[node_record(node(f"n{i}")) for i in range(4)],
                         pods={(NS, "other"): [other]},
                         foreign_labels={NS: [("n1", {"app": "trainer"}), ("n3", {"app": "web"})],
                                         "elsewhere": [("n0", {"app": "trainer"})]})
    held = held_selected(held_labelled(state, {carrier.key}, NS), [selector])
    assert held == {"n1": {token(selector)}, "n2": {token(selector)}}
    assert held_selected(held_labelled(state, {carrier.key, (NS, "other")}, NS), [selector]) == \
        {"n1": {token(selector)}}


def test_the_operator_keeps_spread_tasks_off_nodes_where_another_workloads_matching_pod_runs():
    rt, kube = setup(nodes=4, policies=(policy(placement="bin-pack"),),
                     job_bodies=[spread(allreduce_job("spread", max_workers=4))])
    web = pod("web", "worker", 0, node_name="node-0")
    web["metadata"]["labels"] = {"app": "trainer"}  # not an MLJob's pod, same label
    web["metadata"]["name"] = "notebook-0"
    kube.put(web)
    report = round_(rt, kube)
    nodes = report.targets["spread"].nodes["worker"]
    assert "node-0" not in nodes and len(nodes) == len(set(nodes)) == 3, nodes  # 4, node-0 too, before


def _repelling(name: str, node_name: str, namespace: str = NS, key: str = "mlsched.io/job-name") -> dict:
    """Another workload's pod keeping pods with label `key` off its node."""
    body = pod(name, "worker", 0, node_name=node_name, namespace=namespace)
    body["metadata"]["labels"] = {}
    body["metadata"]["name"] = name
    body["spec"]["affinity"] = {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"labelSelector": {"matchExpressions": [{"key": key, "operator": "Exists"}]},
         "topologyKey": "kubernetes.io/hostname"}]}}
    return body


def test_the_operator_keeps_tasks_off_the_node_of_a_pod_whose_anti_affinity_repels_them():
    # Found on the plane: a workload keeping training off its node (`mlsched.io/job-name
    # Exists`) was ignored; bin-packing pinned workers there, kube-scheduler refused them
    # (symmetry), displacement moved them.
    rt, kube = setup(nodes=4, policies=(policy(placement="bin-pack"),),
                     job_bodies=[allreduce_job("packed", max_workers=4)])
    kube.put(_repelling("latency-critical", "node-0"))
    kube.put(_repelling("elsewhere", "node-1", namespace="team-b"))  # repels only team-b's pods
    kube.put(_repelling("unrelated", "node-2", key="app"))  # matches no job pod
    report = round_(rt, kube)
    nodes = report.targets["packed"].nodes["worker"]
    assert len(nodes) == 4 and "node-0" not in nodes and "node-1" in nodes, nodes
