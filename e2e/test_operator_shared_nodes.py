"""Nodes are shared by every namespace: an operator serving one namespace (--namespace, as
every e2e operator runs) still counts what other namespaces run on them."""

from __future__ import annotations

import uuid

from kubernetes import client

from job_state import placed_as_decided, placement_problems
from mlsched_objects import IMAGE, KWOK_TOLERATION, mljob, scheduling_policy
from waiting import wait_for


def _gpu_hog(name: str, node: str) -> dict:
    gpus = {"nvidia.com/gpu": "2"}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"nodeName": node, "tolerations": [KWOK_TOLERATION],
                     "containers": [{"name": "c", "image": IMAGE,
                                     "resources": {"requests": gpus, "limits": gpus}}]}}


def test_gpus_held_by_another_namespace_are_not_handed_out(api, node_shape, mlsched, operator):
    core = client.CoreV1Api(api)
    other = f"e2e-other-{uuid.uuid4().hex[:6]}"
    core.create_namespace({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": other}})
    free = f"kwok-node-{node_shape.count - 1}"
    try:
        # Another team's pods hold every GPU but those of one node.
        for i in range(node_shape.count - 1):
            core.create_namespaced_pod(other, _gpu_hog(f"hog-{i}", f"kwok-node-{i}"))
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
