"""A pod template naming a RuntimeClass is planned as the API server will make its pods: the
class's nodeSelector and tolerations keep them on the nodes that have the runtime, its
overhead counts. (A class that does not exist is told up front, its pods would all be refused:
an API server's question, in e2e/apiserver/test_api_operator_refusals.py.)"""

from __future__ import annotations

import contextlib

from kubernetes import client

from mlsched_objects import mljob, scheduling_policy
from node_fixtures import labelled
from waiting import wait_for

KEY = "e2e.mlsched.io/runtime"


@contextlib.contextmanager
def runtime_class(api, name: str, selector: dict | None = None):
    node_api = client.NodeV1Api(api)
    body = {"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass", "metadata": {"name": name},
            "handler": "runsc", "overhead": {"podFixed": {"cpu": "250m", "memory": "256Mi"}}}
    if selector:
        body["scheduling"] = {"nodeSelector": selector}
    node_api.create_runtime_class(body)
    try:
        yield
    finally:
        node_api.delete_runtime_class(name)


def test_a_job_runs_where_its_runtime_class_runs(api, mlsched, operator):
    """Two of the 13 nodes have the runtime. Planned from the template, the workers were
    pinned to the least-loaded nodes, where kube-scheduler refused them (the class's
    nodeSelector, merged into the pods at admission, excludes them): `Displaced`, moved
    node after node until they happened to land right."""
    core = client.CoreV1Api(api)
    gvisor = ["kwok-node-4", "kwok-node-9"]
    with labelled(core, gvisor, KEY, "gvisor"), \
            runtime_class(api, "e2e-gvisor", {KEY: "gvisor"}):
        mlsched.create(scheduling_policy("default", interval=600))
        job = mljob("sandboxed", ps=None, workers=(4, 4))
        job["spec"]["replicaSpecs"]["worker"]["template"]["spec"]["runtimeClassName"] = \
            "e2e-gvisor"
        mlsched.create(job)

        def running():
            pods = mlsched.pods("sandboxed")
            ok = len(pods) == 4 and all(p.status.phase == "Running" for p in pods)
            return pods if ok else None

        pods = wait_for(running, 90, "every worker to run",
                        describe=lambda: [(p.metadata.name, p.status.phase, p.spec.node_name)
                                          for p in mlsched.pods("sandboxed")])
        assert {p.spec.node_name for p in pods} == set(gvisor)
        assert all(p.spec.overhead == {"cpu": "250m", "memory": "256Mi"} for p in pods)
        displaced = [e.message for e in mlsched.events("sandboxed", "MLJob")
                     if e.reason == "Displaced"]
        assert not displaced, displaced
