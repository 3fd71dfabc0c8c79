"""A node's pod slots and extended resources, on the real control plane. kube-scheduler
refuses a pod on a node whose allocatable `pods` are taken ("Too many pods") or that has too
little left of an extended resource the pod asks for ("Insufficient example.com/nic"). The
operator counts both per node like CPU (controller/admission/counted_resources.py): tasks are placed
where they fit at once, and a job whose minimum the nodes cannot hold now waits holding
nothing and says why.

Found in the sandbox before: bin-packing pinned eight workers asking one NIC each to a node
with two, and eight half-CPU workers to a node of three pod slots; kube-scheduler refused the
rest and displacement moved them three times over before all ran. A second job of twelve with
ten slots left was admitted: ten pods ran and held their nodes, two stayed Pending for good."""

from __future__ import annotations

from kubernetes import client

from job_state import placed_at_once, wait_all_running, waits_saying
from mlsched_objects import DAY, mljob, scheduling_policy
from node_fixtures import NODES, POOL, labelled, node_allocatable, small_workers


def test_extended_resources_are_counted_per_node(api, mlsched, operator):
    core = client.CoreV1Api(api)
    with labelled(core, NODES, POOL, "yes"), node_allocatable(core, NODES, nic="2"):
        mlsched.create(scheduling_policy("default", interval=DAY, placement="bin-pack"))
        mlsched.create(small_workers(mljob("nics-a", ps=None, workers=(6, 6)), cpu="1", nics=1))
        pods = wait_all_running(mlsched, "nics-a", 6)
        per_node = sorted([p.spec.node_name for p in pods].count(n) for n in NODES)
        assert per_node == [2, 2, 2], [p.spec.node_name for p in pods]  # six on one node before
        placed_at_once(mlsched, "nics-a")
        # Every NIC of the three nodes is taken: a second job waits and creates no pod.
        mlsched.create(small_workers(mljob("nics-b", ps=None, workers=(2, 2)), cpu="1", nics=1))
        message = waits_saying(mlsched, "nics-b", "example.com/nic")
        assert ("needs 2 worker pods taking 1 example.com/nic each; the 3 nodes it may use have "
                "room for 0 such pods now") in message, message


def test_pod_slots_are_counted_per_node(api, mlsched, operator):
    core = client.CoreV1Api(api)
    with labelled(core, NODES, POOL, "yes"), node_allocatable(core, NODES, pods="3"):
        mlsched.create(scheduling_policy("default", interval=DAY, placement="bin-pack"))
        mlsched.create(small_workers(mljob("slots-a", ps=None, workers=(8, 8)), cpu="500m"))
        pods = wait_all_running(mlsched, "slots-a", 8)
        per_node = sorted([p.spec.node_name for p in pods].count(n) for n in NODES)
        assert per_node == [2, 3, 3], [p.spec.node_name for p in pods]  # eight on one node before
        placed_at_once(mlsched, "slots-a")
        # One slot is left: a gang of two waits holding nothing; it used to get one pod Running
        # and one Pending for good.
        mlsched.create(small_workers(mljob("slots-b", ps=None, workers=(2, 2)), cpu="500m"))
        message = waits_saying(mlsched, "slots-b", "pod slots")
        assert "needs 2 worker pods; the 3 nodes it may use have 1 pod slots free now" in message, message
