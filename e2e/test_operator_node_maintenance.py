"""A node drained for maintenance (`kubectl drain`: cordoned, its pods evicted): the job's
tasks there are placed again within seconds, on other nodes, its other pods untouched.

Before, the StatefulSets recreated the evicted pods and the operator pinned them back to the
cordoned node, where they stayed Pending until the policy's next round (20 minutes by
default; a day here), while a parameter-server job missing a PS trained nothing.
"""

from __future__ import annotations

import contextlib
import time

from kubernetes import client

from job_state import placed_as_decided, placement_problems
from mlsched_objects import mljob, scheduling_policy
from waiting import wait_for

DAY = 86400


@contextlib.contextmanager
def drained(core: client.CoreV1Api, node: str, namespace: str):
    """Cordon the node and evict our namespace's pods from it through the Eviction API, as
    `kubectl drain` does; uncordoned after the test (the plane is shared)."""
    core.patch_node(node, {"spec": {"unschedulable": True}})
    try:
        for pod in core.list_namespaced_pod(namespace, field_selector=f"spec.nodeName={node}").items:
            core.create_namespaced_pod_eviction(pod.metadata.name, namespace, client.V1Eviction(
                metadata=client.V1ObjectMeta(name=pod.metadata.name, namespace=namespace)))
        yield
    finally:
        core.patch_node(node, {"spec": {"unschedulable": False}})


def test_tasks_of_a_drained_node_are_placed_again_within_seconds(api, mlsched, operator, emulator):
    core = client.CoreV1Api(api)
    mlsched.create(scheduling_policy("daily", allocation="fixed", interval=DAY))
    mlsched.create(mljob("tenant", ps=(2, 2), workers=(4, 4), epochs=1e9, policy="daily"))
    status = wait_for(lambda: placed_as_decided(mlsched, "tenant"), 60, "the job to be placed",
                      describe=lambda: placement_problems(mlsched, "tenant"))
    last_round = mlsched.policy("daily")["status"].get("lastRoundTime")
    node = status["placement"]["ps"][0]  # a node holding a PS: the job trains nothing without it
    on_node = {p.metadata.name for p in mlsched.pods("tenant") if p.spec.node_name == node}
    others = {p.metadata.name: p.metadata.uid for p in mlsched.pods("tenant")
              if p.spec.node_name != node}

    with drained(core, node, mlsched.namespace):
        started = time.monotonic()

        def repaired():
            s = placed_as_decided(mlsched, "tenant")
            placed = s and [n for role in ("ps", "worker") for n in s["placement"][role]]
            return s if placed and node not in placed else None

        status = wait_for(repaired, 30, f"the tasks evicted from {node} to run elsewhere",
                          describe=lambda: placement_problems(mlsched, "tenant"))
        print(f"drained {node}: {sorted(on_node)} running elsewhere "
              f"{time.monotonic() - started:.1f} s after the drain")
        assert status["replicaStatuses"]["ps"]["desired"] == 2
        assert status["replicaStatuses"]["worker"]["desired"] == 4
        # The pods on other nodes were not restarted.
        assert {p.metadata.name: p.metadata.uid for p in mlsched.pods("tenant")
                if p.metadata.name in others} == others
        events = [e.message for e in mlsched.events("tenant", "MLJob") if e.reason == "Displaced"]
        assert events and f"on {node} (cordoned)" in events[0], events
        assert all(name in events[0] for name in on_node), events
        assert mlsched.policy("daily")["status"].get("lastRoundTime") == last_round  # no round


def test_a_pod_kube_scheduler_refuses_is_placed_again_elsewhere(mlsched, operator):
    """A constraint the operator does not plan with, here a required pod anti-affinity (one
    worker per node) that names its namespaces (controller/constraints/pod_anti_affinity.py plans only
    terms that do not; without `namespaces` the workers are spread before they are pinned,
    test_operator_one_per_node.py): bin-packing puts two workers on a node, kube-scheduler
    refuses the second. It used to stay Pending until the next round (a day here), which would
    decide the same; now the refused task is placed again, never back on a node that refused
    it."""
    mlsched.create(scheduling_policy("packed", allocation="fixed", placement="bin-pack",
                                     interval=DAY))
    job = mljob("spread", ps=None, workers=(4, 4), epochs=1e9, policy="packed")
    job["spec"]["replicaSpecs"]["worker"]["template"]["spec"]["affinity"] = {"podAntiAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": [{
            "topologyKey": "kubernetes.io/hostname", "namespaces": [mlsched.namespace],
            "labelSelector": {"matchLabels": {"mlsched.io/job-name": "spread",
                                              "mlsched.io/role": "worker"}}}]}}
    started = time.monotonic()
    mlsched.create(job)
    status = wait_for(lambda: placed_as_decided(mlsched, "spread"), 60,
                      "every worker to run, one per node",
                      describe=lambda: placement_problems(mlsched, "spread"))
    print(f"4 workers running on {len(set(status['placement']['worker']))} nodes "
          f"{time.monotonic() - started:.1f} s after the create")
    assert len(set(status["placement"]["worker"])) == 4
    events = [e.message for e in mlsched.events("spread", "MLJob") if e.reason == "Displaced"]
    assert events and "kube-scheduler" in events[0] and "anti-affinity" in events[0], events
