"""A namespace's LimitRanges are planned with as the API server applies them: the default
requests every container that sets none is given (LimitRanger, when the pod is created), and
the checks it refuses pods for, which the operator now tells the job up front instead of
admitting it and holding its capacity while every pod gets FailedCreate."""

from __future__ import annotations

from collections import Counter

from kubernetes import client

from job_state import placed_as_decided, placement_problems
from mlsched_objects import condition, mljob, scheduling_policy
from waiting import wait_for


def test_a_template_without_requests_is_planned_with_its_namespace_s_limit_range(
        mlsched, operator, node_shape):
    """The namespace's LimitRange defaults every container to 3 CPU, and the job's template
    requests nothing: each pod asks kube-scheduler for 3 CPU. The operator planned the
    template as requesting nothing, so bin-packing pinned all four workers to one node and
    kube-scheduler refused two of them (`Displaced`, moved only after the refusal)."""
    mlsched.core.create_namespaced_limit_range(mlsched.namespace, {
        "apiVersion": "v1", "kind": "LimitRange", "metadata": {"name": "defaults"},
        "spec": {"limits": [{"type": "Container", "defaultRequest": {"cpu": "3", "memory": "1Gi"},
                             "default": {"cpu": "3", "memory": "1Gi"}}]}})
    mlsched.create(scheduling_policy("packed", allocation="fixed", placement="bin-pack"))
    job = mljob("defaulted", model="my-net", ps=None, workers=(4, 4), epochs=1e9, policy="packed")
    job["spec"]["replicaSpecs"]["worker"]["template"]["spec"]["containers"][0].pop("resources")
    mlsched.create(job)
    status = wait_for(lambda: placed_as_decided(mlsched, "defaulted"), 90,
                      "every worker to run where its policy placed it",
                      describe=lambda: placement_problems(mlsched, "defaulted"))
    per_node = Counter(status["placement"]["worker"])
    assert sum(per_node.values()) == 4
    assert all(3 * n <= node_shape.cpu for n in per_node.values()), per_node
    pods = mlsched.core.list_namespaced_pod(mlsched.namespace,
                                            label_selector="mlsched.io/job-name=defaulted").items
    assert {p.spec.containers[0].resources.requests["cpu"] for p in pods} == {"3"}  # LimitRanger's
    assert not [e.message for e in mlsched.events("defaulted", "MLJob") if e.reason == "Displaced"]


def test_a_job_whose_pods_a_limit_range_refuses_is_told_so_and_holds_nothing(api, mlsched,
                                                                               operator):
    """A LimitRange allows 16Gi of memory per container, and the job's workers ask a 32Gi
    limit. It used to be admitted: its StatefulSet was scaled, every pod got FailedCreate,
    and its GPUs stayed reserved. Now it is CannotFit naming the LimitRange and runs within
    seconds of the admin raising the limit."""
    core = client.CoreV1Api(api)
    core.create_namespaced_limit_range(mlsched.namespace, {
        "metadata": {"name": "caps"},
        "spec": {"limits": [{"type": "Container", "max": {"memory": "16Gi"}}]}})
    mlsched.create(scheduling_policy("default", interval=86400))
    job = mljob("greedy", ps=None, workers=(2, 2), epochs=1e9)
    big = {"cpu": "2", "memory": "32Gi", "nvidia.com/gpu": "1"}
    job["spec"]["replicaSpecs"]["worker"]["template"]["spec"]["containers"][0]["resources"] = {
        "requests": big, "limits": big}
    mlsched.create(job)

    def running():
        c = condition(mlsched.job("greedy"), "Running")
        return (c["reason"], c.get("message", "")) if c else None

    reason, message = wait_for(lambda: (r := running()) and r[0] == "CannotFit" and r, 30,
                               "the job to be told its pods are refused", describe=running)
    assert message == ("the namespace's LimitRange 'caps' refuses its worker pods: maximum "
                       "memory usage per Container is 16Gi, but limit is 32Gi"), message
    assert mlsched.job("greedy")["status"]["replicaStatuses"]["worker"]["desired"] == 0
    assert mlsched.pods("greedy") == []
    refused = [e.message for e in core.list_namespaced_event(mlsched.namespace).items
               if e.reason == "FailedCreate"]
    assert not refused, refused

    core.patch_namespaced_limit_range("caps", mlsched.namespace, {
        "spec": {"limits": [{"type": "Container", "max": {"memory": "64Gi"}}]}})
    status = wait_for(lambda: placed_as_decided(mlsched, "greedy"), 30,
                      "the job to run once the LimitRange allows its pods",
                      describe=lambda: placement_problems(mlsched, "greedy"))
    assert status["replicaStatuses"]["worker"]["desired"] == 2
