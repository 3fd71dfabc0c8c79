"""One pod per node, on the real control plane. Pods on the host's network (`hostNetwork:
true`, as RDMA/NCCL training runs them) hold their containerPorts on the node, and
kube-scheduler puts one such pod per node and port; a required pod anti-affinity on the
hostname spreads the pods it matches the same way. The operator plans with both
(controller/constraints/host_ports.py, controller/constraints/pod_anti_affinity.py): tasks are placed one per node at
once, a job whose port (or spread) is taken everywhere waits holding nothing, and one whose
minimum needs more nodes than there are is told CannotFit. And topologySpreadConstraints,
which the operator's pin hides from kube-scheduler, are enforced by the planner
(controller/constraints/topology_spread.py)."""

from __future__ import annotations

import json

from kubernetes import client

from mlsched_objects import IMAGE, KWOK_TOLERATION, condition, mljob, scheduling_policy
from job_state import wait_all_running
from node_fixtures import labelled
from waiting import wait_for

PORT = 29500
# A day (432 s at the e2e operator's interval scale): no round re-decides the jobs while a
# test looks (a round may rightly give the waiting job a share of the first one's nodes).
DAY = 86400


def on_host_network(job: dict) -> dict:
    spec = job["spec"]["replicaSpecs"]["worker"]["template"]["spec"]
    spec["hostNetwork"] = True
    spec["containers"][0]["ports"] = [{"containerPort": PORT, "name": "nccl"}]
    return job


def schedulable_nodes(control_plane) -> int:
    """Nodes Ready and not cordoned now (the previous test may have left one recovering)."""
    items = json.loads(control_plane.kubectl("get", "nodes", "-o", "json").stdout)["items"]
    return sum(1 for n in items if not n["spec"].get("unschedulable") and any(
        c["type"] == "Ready" and c["status"] == "True" for c in n["status"].get("conditions", ())))


def _reason(mlsched, name: str, kind: str) -> tuple[str, str] | None:
    c = condition(mlsched.job(name), kind)
    return (c["reason"], c.get("message", "")) if c else None


def test_host_network_jobs_get_one_pod_per_node_and_a_second_one_waits_holding_nothing(
        control_plane, mlsched, operator):
    # Bin-packing puts two 1-GPU workers on each 2-GPU node; with the port, one per node.
    mlsched.create(scheduling_policy("default", interval=DAY, placement="bin-pack"))
    mlsched.create(on_host_network(mljob("nccl-a", ps=None, workers=(4, 40))))

    pods = wait_all_running(mlsched, "nccl-a", 4)
    nodes = [p.spec.node_name for p in pods]
    assert len(nodes) == len(set(nodes)), nodes  # never two on a node
    nodes_total = schedulable_nodes(control_plane)
    assert len(nodes) == nodes_total, (nodes, nodes_total)  # one on every node, not fewer
    # Placed right the first time: kube-scheduler refused nothing, nothing was moved.
    reasons = [e.reason for e in mlsched.events("nccl-a", "MLJob")]
    assert "Displaced" not in reasons and "Unschedulable" not in reasons, reasons

    # The same port on every node is taken: a second such job waits, creates no pod, and
    # says why; it used to be given workers whose pods stayed Pending ("didn't have free
    # ports for the requested pod ports") while holding their GPUs.
    mlsched.create(on_host_network(mljob("nccl-b", ps=None, workers=(2, 4))))
    # A job holding no port uses the GPUs the first one leaves.
    mlsched.create(mljob("plain", ps=None, workers=(2, 4)))
    wait_for(lambda: (r := _reason(mlsched, "plain", "Running")) and r[0] == "AllRolesReady",
             90, "the job without host ports to run",
             describe=lambda: _reason(mlsched, "plain", "Running"))
    reason, message = wait_for(
        lambda: (r := _reason(mlsched, "nccl-b", "Admitted")) and "host port" in r[1] and r,
        60, "nccl-b to say why it waits", describe=lambda: _reason(mlsched, "nccl-b", "Admitted"))
    assert reason == "WaitingForAllocation", (reason, message)
    assert f"needs 2 nodes where host port {PORT}/TCP is free" in message, message
    assert mlsched.pods("nccl-b") == []


def test_a_minimum_wider_than_the_cluster_is_told_cannot_fit(control_plane, mlsched, operator):
    mlsched.create(scheduling_policy("default", interval=DAY))
    nodes_total = schedulable_nodes(control_plane)
    wide = nodes_total + 1  # fewer GPUs than the cluster has, more nodes than it has
    mlsched.create(on_host_network(mljob("nccl-wide", ps=None, workers=(wide, wide))))
    reason, message = wait_for(
        lambda: (r := _reason(mlsched, "nccl-wide", "Running")) and r[0] == "CannotFit" and r,
        60, "the job to be told it cannot fit", describe=lambda: _reason(mlsched, "nccl-wide", "Running"))
    assert (f"its minimum ({wide} worker) holds host port {PORT}/TCP" in message
            and f"only {nodes_total} schedulable nodes can take one" in message), message
    assert mlsched.pods("nccl-wide") == []


def spread_out(job: dict, label: str, term: bool = True) -> dict:
    template = job["spec"]["replicaSpecs"]["worker"]["template"]
    template.setdefault("metadata", {})["labels"] = {"app": label}
    if term:
        template["spec"]["affinity"] = {"podAntiAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {"labelSelector": {"matchLabels": {"app": label}},
                 "topologyKey": "kubernetes.io/hostname"}]}}
    return job


def test_required_anti_affinity_spreads_workers_one_per_node_at_once(control_plane, mlsched, operator):
    mlsched.create(scheduling_policy("default", interval=DAY, placement="bin-pack"))
    mlsched.create(spread_out(mljob("spread", ps=None, workers=(4, 40)), "spread"))

    pods = wait_all_running(mlsched, "spread", 4)
    nodes = [p.spec.node_name for p in pods]
    nodes_total = schedulable_nodes(control_plane)
    assert len(nodes) == len(set(nodes)) == nodes_total, (nodes, nodes_total)
    reasons = [e.reason for e in mlsched.events("spread", "MLJob")]
    assert "Displaced" not in reasons and "Unschedulable" not in reasons, reasons
    # A job whose pods carry the label the term repels (kube-scheduler refuses them next to
    # the carriers too) waits, holding nothing, and says why.
    mlsched.create(spread_out(mljob("same-label", ps=None, workers=(2, 4)), "spread", term=False))
    reason, message = wait_for(
        lambda: (r := _reason(mlsched, "same-label", "Admitted")) and "anti-affinity" in r[1] and r,
        60, "same-label to say why it waits",
        describe=lambda: _reason(mlsched, "same-label", "Admitted"))
    assert reason == "WaitingForAllocation", (reason, message)
    assert "required pod anti-affinity (app=spread)" in message, message
    assert mlsched.pods("same-label") == []


def test_spread_tasks_keep_off_nodes_where_another_workloads_matching_pod_runs(
        control_plane, mlsched, operator):
    """A pod that is not an MLJob's (a notebook, a Kubeflow job) with the label a job's
    required anti-affinity repels, in the job's namespace: kube-scheduler keeps the job's pods
    off its node, and so does the planner now; it used to pin one there, refused."""
    node = "kwok-node-2"
    mlsched.core.create_namespaced_pod(mlsched.namespace, {
        "metadata": {"name": "notebook", "labels": {"app": "shared"}},
        "spec": {"nodeName": node, "tolerations": [KWOK_TOLERATION],
                 "containers": [{"name": "c", "image": IMAGE}]}})
    wait_for(lambda: mlsched.core.read_namespaced_pod("notebook", mlsched.namespace).status.phase
             == "Running", 60, "the other workload's pod to run")
    mlsched.create(scheduling_policy("default", interval=DAY, placement="bin-pack"))
    mlsched.create(spread_out(mljob("beside", ps=None, workers=(4, 40)), "shared"))
    pods = wait_all_running(mlsched, "beside", 4)
    nodes = [p.spec.node_name for p in pods]
    assert node not in nodes and len(nodes) == len(set(nodes)), nodes
    assert len(nodes) == schedulable_nodes(control_plane) - 1, nodes  # every other node
    reasons = [e.reason for e in mlsched.events("beside", "MLJob")]
    assert "Displaced" not in reasons and "Unschedulable" not in reasons, reasons


def test_tasks_keep_off_the_node_of_a_pod_whose_anti_affinity_repels_them(mlsched, operator):
    """Another workload of the job's namespace keeping training off its node with its own
    required anti-affinity (`mlsched.io/job-name Exists`): kube-scheduler refuses a job pod beside
    it by symmetry. Before, the planner read only the job's own terms: bin-packing pinned
    workers to that node, kube-scheduler refused them, displacement moved them."""
    node = "kwok-node-0"  # bin-packing's first choice on an empty cluster
    mlsched.core.create_namespaced_pod(mlsched.namespace, {
        "metadata": {"name": "latency-critical"},
        "spec": {"nodeName": node, "tolerations": [KWOK_TOLERATION],
                 "affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
                     {"labelSelector": {"matchExpressions": [{"key": "mlsched.io/job-name",
                                                              "operator": "Exists"}]},
                      "topologyKey": "kubernetes.io/hostname"}]}},
                 "containers": [{"name": "c", "image": IMAGE}]}})
    wait_for(lambda: mlsched.core.read_namespaced_pod("latency-critical", mlsched.namespace)
             .status.phase == "Running", 60, "the other workload's pod to run")
    mlsched.create(scheduling_policy("default", interval=DAY, placement="bin-pack"))
    mlsched.create(mljob("repelled", ps=None, workers=(4, 4)))
    pods = wait_all_running(mlsched, "repelled", 4)
    nodes = [p.spec.node_name for p in pods]
    assert node not in nodes, nodes
    reasons = [e.reason for e in mlsched.events("repelled", "MLJob")]
    assert "Displaced" not in reasons and "Unschedulable" not in reasons, reasons


def with_spread(job: dict, label: str, key: str = "kubernetes.io/hostname") -> dict:
    template = job["spec"]["replicaSpecs"]["worker"]["template"]
    template.setdefault("metadata", {})["labels"] = {"app": label}
    template["spec"]["topologySpreadConstraints"] = [{
        "maxSkew": 1, "topologyKey": key, "whenUnsatisfiable": "DoNotSchedule",
        "labelSelector": {"matchLabels": {"app": label}}}]
    return job


def test_topology_spread_constraints_are_kept_though_the_pin_makes_kube_scheduler_blind_to_them(
        control_plane, mlsched, operator):
    # kube-scheduler counts matching pods only over the nodes a pod's nodeSelector allows
    # (nodeAffinityPolicy: Honor); the operator's hostname pin makes that one node, so it
    # never refuses a pinned pod for spread. Before the planner enforced the constraint, this
    # bin-packed job ran 2 workers on each of 2 nodes, silently breaking maxSkew 1.
    mlsched.create(scheduling_policy("default", interval=DAY, placement="bin-pack"))
    mlsched.create(with_spread(mljob("even", ps=None, workers=(4, 4)), "even"))

    pods = wait_all_running(mlsched, "even", 4)
    nodes = [p.spec.node_name for p in pods]
    assert len(set(nodes)) == 4, nodes  # maxSkew 1 over 13 nodes: one per node


def test_workers_spread_over_zones_and_never_on_nodes_without_one(control_plane, api, mlsched, operator):
    zone = "topology.kubernetes.io/zone"
    core = client.CoreV1Api(api)
    with labelled(core, ["kwok-node-0", "kwok-node-1"], zone, "e2e-a"), \
            labelled(core, ["kwok-node-2", "kwok-node-3"], zone, "e2e-b"):
        mlsched.create(scheduling_policy("default", interval=DAY, placement="bin-pack"))
        mlsched.create(with_spread(mljob("zonal", ps=None, workers=(4, 6)), "zonal", key=zone))

        pods = wait_all_running(mlsched, "zonal", 4)
        nodes = [p.spec.node_name for p in pods]
        a = sum(n in ("kwok-node-0", "kwok-node-1") for n in nodes)
        b = sum(n in ("kwok-node-2", "kwok-node-3") for n in nodes)
        assert a + b == len(nodes), nodes  # only nodes with a zone
        assert abs(a - b) <= 1, nodes  # maxSkew 1


def test_another_workloads_matching_pods_count_toward_a_zone_spread(control_plane, api, mlsched, operator):
    """kube-scheduler counts every pod of the namespace that a spread constraint's selector
    matches, whoever runs it. Blind to the pinned pods, it leaves the count to the planner,
    which counted only the tasks it decided itself: with two notebook pods labelled like the
    job's in zone a, the job's two workers went one to each zone (3 to 1, maxSkew 1)."""
    zone = "topology.kubernetes.io/zone"
    core = client.CoreV1Api(api)
    with labelled(core, ["kwok-node-0", "kwok-node-1"], zone, "e2e-a"), \
            labelled(core, ["kwok-node-2", "kwok-node-3"], zone, "e2e-b"):
        for i, node in enumerate(("kwok-node-0", "kwok-node-1")):
            core.create_namespaced_pod(mlsched.namespace, {
                "metadata": {"name": f"notebook-{i}", "labels": {"app": "shared-zones"}},
                "spec": {"nodeName": node, "tolerations": [KWOK_TOLERATION],
                         "containers": [{"name": "c", "image": IMAGE}]}})
        wait_for(lambda: all(core.read_namespaced_pod(f"notebook-{i}", mlsched.namespace).status.phase
                             == "Running" for i in range(2)), 60, "the notebooks to run")
        mlsched.create(scheduling_policy("default", interval=DAY, placement="bin-pack"))
        mlsched.create(with_spread(mljob("beside", ps=None, workers=(2, 2)), "shared-zones", key=zone))

        pods = wait_all_running(mlsched, "beside", 2)
        nodes = [p.spec.node_name for p in pods]
        assert set(nodes) <= {"kwok-node-2", "kwok-node-3"}, nodes  # zone b: 2 and 2
