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

import contextlib

from kubernetes import client

from mlsched_objects import condition, mljob, scheduling_policy
from test_operator_node_constraints import labelled
from test_operator_one_per_node import wait_all_running
from waiting import wait_for

NIC = "example.com/nic"
POOL = "e2e.mlsched.io/counted"
NODES = ["kwok-node-4", "kwok-node-5", "kwok-node-6"]
# A day (432 s at the e2e operator's interval scale): no round re-decides the jobs while a
# test looks (a round may rightly give the waiting job a share of the first one's nodes).
DAY = 86400


@contextlib.contextmanager
def node_allocatable(core: client.CoreV1Api, names: list[str], **allocatable: str | None):
    """Nodes of the session's shared plane advertising other allocatable amounts for one test
    (as a kubelet or device plugin would), restored after it. Keys use `_` for `/` and `.`."""
    before = {}
    for name in names:
        status = core.read_node_status(name).status
        before[name] = {k: (status.allocatable or {}).get(k) for k in _keys(allocatable)}
    try:
        for name in names:
            amounts = dict(zip(_keys(allocatable), allocatable.values()))
            core.patch_node_status(name, {"status": {"capacity": amounts, "allocatable": amounts}})
        yield
    finally:
        for name, amounts in before.items():
            core.patch_node_status(name, {"status": {"capacity": amounts, "allocatable": amounts}})


def _keys(allocatable: dict) -> list[str]:
    return [NIC if k == "nic" else k for k in allocatable]


def small_workers(job: dict, *, cpu: str, nics: int = 0) -> dict:
    """Workers asking for `cpu`, 1Gi, no GPU (and `nics` NICs each), kept on the test's nodes."""
    spec = job["spec"]["replicaSpecs"]["worker"]["template"]["spec"]
    want = {"cpu": cpu, "memory": "1Gi", **({NIC: str(nics)} if nics else {})}
    spec["containers"][0]["resources"] = {"requests": want, "limits": dict(want)}
    spec["nodeSelector"] = {POOL: "yes"}
    return job


def _reason(mlsched, name: str, kind: str) -> tuple[str, str] | None:
    c = condition(mlsched.job(name), kind)
    return (c["reason"], c.get("message", "")) if c else None


def _placed_at_once(mlsched, name: str) -> None:
    reasons = [e.reason for e in mlsched.events(name, "MLJob")]
    assert "Displaced" not in reasons and "Unschedulable" not in reasons, reasons


def _waits_saying(mlsched, name: str, words: str) -> str:
    reason, message = wait_for(
        lambda: (r := _reason(mlsched, name, "Admitted")) and words in r[1] and r, 60,
        f"{name} to say why it waits", describe=lambda: _reason(mlsched, name, "Admitted"))
    assert reason == "WaitingForAllocation", (reason, message)
    assert mlsched.pods(name) == []
    return message


def test_extended_resources_are_counted_per_node(api, mlsched, operator):
    core = client.CoreV1Api(api)
    with labelled(core, NODES, POOL, "yes"), node_allocatable(core, NODES, nic="2"):
        mlsched.create(scheduling_policy("default", interval=DAY, placement="bin-pack"))
        mlsched.create(small_workers(mljob("nics-a", ps=None, workers=(6, 6)), cpu="1", nics=1))
        pods = wait_all_running(mlsched, "nics-a", 6)
        per_node = sorted([p.spec.node_name for p in pods].count(n) for n in NODES)
        assert per_node == [2, 2, 2], [p.spec.node_name for p in pods]  # six on one node before
        _placed_at_once(mlsched, "nics-a")
        # Every NIC of the three nodes is taken: a second job waits and creates no pod.
        mlsched.create(small_workers(mljob("nics-b", ps=None, workers=(2, 2)), cpu="1", nics=1))
        message = _waits_saying(mlsched, "nics-b", "example.com/nic")
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
        _placed_at_once(mlsched, "slots-a")
        # One slot is left: a gang of two waits holding nothing; it used to get one pod Running
        # and one Pending for good.
        mlsched.create(small_workers(mljob("slots-b", ps=None, workers=(2, 2)), cpu="500m"))
        message = _waits_saying(mlsched, "slots-b", "pod slots")
        assert "needs 2 worker pods; the 3 nodes it may use have 1 pod slots free now" in message, message
