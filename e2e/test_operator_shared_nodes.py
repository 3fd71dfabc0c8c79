"""Nodes are shared by every namespace: an operator serving one namespace (--namespace, as
every e2e operator runs) still counts what other namespaces run on them."""

from __future__ import annotations

import time
import uuid

from kubernetes import client

from job_state import placed_as_decided, placement_problems
from mlsched_objects import mljob, scheduling_policy
from other_workloads import every_gpu_held_and_a_job_waiting, gpu_hog
from waiting import wait_for


def test_gpus_held_by_another_namespace_are_not_handed_out(api, node_shape, mlsched, operator):
    core = client.CoreV1Api(api)
    other = f"e2e-other-{uuid.uuid4().hex[:6]}"
    core.create_namespace({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": other}})
    free = f"kwok-node-{node_shape.count - 1}"
    try:
        # Another team's pods hold every GPU but those of one node.
        for i in range(node_shape.count - 1):
            core.create_namespaced_pod(other, gpu_hog(f"hog-{i}", f"kwok-node-{i}"))
        wait_for(lambda: sum(p.status.phase == "Running"
                             for p in core.list_namespaced_pod(other).items)
                 == node_shape.count - 1, 60, "the other namespace's pods to run")

        mlsched.create(scheduling_policy("default", interval=600))
        mlsched.create(mljob("squeezed", ps=None, workers=(2, 2)))
        wait_for(lambda: placed_as_decided(mlsched, "squeezed"), 90,
                 "the job to run where it was placed",
                 describe=lambda: placement_problems(mlsched, "squeezed"))
        nodes = {p.spec.node_name for p in mlsched.pods("squeezed")}
        assert nodes == {free}, nodes
    finally:
        core.delete_namespace(other)


def test_capacity_a_completed_pod_held_is_handed_out(api, node_shape, mlsched, operator):
    """A pod of another workload in the job's namespace (a batch Job's, say) that completes
    but is kept (as Jobs keep theirs) holds nothing, for kube-scheduler as for the operator.
    Before, the operator went on counting its requests until it was deleted: a job waited for
    capacity that was free (the index kept the pod's entry when it stopped being indexed)."""
    core = client.CoreV1Api(api)
    hogs = every_gpu_held_and_a_job_waiting(core, node_shape, mlsched, "batch", "Never")
    for name in hogs:  # they finish, and stay
        core.patch_namespaced_pod_status(name, mlsched.namespace, {"status": {"phase": "Succeeded"}})
    done = time.monotonic()
    wait_for(lambda: placed_as_decided(mlsched, "after"), 30,
             "the job to run on the GPUs the completed pods no longer hold",
             describe=lambda: placement_problems(mlsched, "after"))
    print(f"placed {time.monotonic() - done:.1f} s after the batch pods completed")
    assert all(core.read_namespaced_pod(n, mlsched.namespace).status.phase == "Succeeded"
               for n in hogs)
