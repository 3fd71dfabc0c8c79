"""Pods the API server would refuse are found with a dry run before the job is given anything.

Pod Security admission, a missing ServiceAccount, a ValidatingAdmissionPolicy or a webhook
judge a pod only when it is created, never its StatefulSet. A job whose pods they refuse used
to be admitted, its StatefulSets scaled and every pod refused (`FailedCreate`), its capacity
held until its policy's next round (a day under these tests' policies). The operator now
creates one pod of each role with `dryRun=All` first (controller/objects/preflight.py), and asks again
when an admitted job's pods are all refused. The refusals quoted are kube-apiserver 1.34's.
"""

from __future__ import annotations

import time

from kubernetes import client

from job_state import placed_as_decided, placement_problems
from mlsched_objects import GROUP, VERSION, condition, mljob, scheduling_policy
from waiting import wait_for

RESTRICTED = {"pod-security.kubernetes.io/enforce": "restricted"}
# What Pod Security's `restricted` level asks of every pod and container.
RESTRICTED_POD = {"runAsNonRoot": True, "runAsUser": 1000, "seccompProfile": {"type": "RuntimeDefault"}}
RESTRICTED_CONTAINER = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}


def _reason(mlsched, name: str) -> tuple[str, str] | None:
    running = condition(mlsched.job(name), "Running")
    return (running["reason"], running.get("message", "")) if running else None


def _desired(mlsched, name: str) -> int:
    return ((mlsched.job(name).get("status") or {}).get("replicaStatuses") or {}) \
        .get("worker", {}).get("desired", 0)


def _failed_creates(core: client.CoreV1Api, namespace: str, job: str) -> list[str]:
    return [e.message for e in core.list_namespaced_event(namespace).items
            if e.reason == "FailedCreate" and e.involved_object.name.startswith(job + "-")]


def _label_namespace(core: client.CoreV1Api, namespace: str, labels: dict) -> None:
    core.patch_namespace(namespace, {"metadata": {"labels": labels}})


def test_a_job_pod_security_refuses_is_told_so_and_holds_nothing(api, control_plane, mlsched,
                                                                   operator):
    """The namespace enforces Pod Security `restricted`; the job's template runs as root. It is
    told why before anything is scaled, while a compliant job beside it runs; relabelled
    `baseline`, the namespace takes its pods and it runs at once (the relabelling asks again)."""
    core = client.CoreV1Api(api)
    _label_namespace(core, mlsched.namespace, RESTRICTED)
    mlsched.create(scheduling_policy("default", interval=86400))
    mlsched.create(mljob("rooted", ps=None, workers=(2, 2), epochs=1e9))
    compliant = mljob("compliant", ps=None, workers=(2, 2), epochs=1e9)
    spec = compliant["spec"]["replicaSpecs"]["worker"]["template"]["spec"]
    spec["securityContext"] = RESTRICTED_POD
    spec["containers"][0]["securityContext"] = RESTRICTED_CONTAINER
    mlsched.create(compliant)

    reason, message = wait_for(lambda: (r := _reason(mlsched, "rooted")) and r[0] == "PodsRefused"
                               and r, 30, "the job to be told Pod Security refuses its pods",
                               describe=lambda: _reason(mlsched, "rooted"))
    assert message.startswith('the API server would refuse to create its pods: pods '
                              '"rooted-worker-0" is forbidden: violates PodSecurity '
                              '"restricted:latest": '), message
    assert "runAsNonRoot != true" in message, message
    admitted = condition(mlsched.job("rooted"), "Admitted")
    assert (admitted["status"], admitted["reason"]) == ("False", "PodsRefused")
    assert any(e.reason == "PodsRefused" and e.type == "Warning"
               for e in mlsched.events("rooted", "MLJob"))
    got = control_plane.kubectl("get", "mljob", "rooted", "-n", mlsched.namespace).stdout
    assert "PodsRefused" in got, got
    wait_for(lambda: placed_as_decided(mlsched, "compliant"), 60, "the compliant job to run",
             describe=lambda: placement_problems(mlsched, "compliant"))
    assert _desired(mlsched, "rooted") == 0 and mlsched.pods("rooted") == []
    assert _failed_creates(core, mlsched.namespace, "rooted") == []  # nothing was ever scaled

    _label_namespace(core, mlsched.namespace, {"pod-security.kubernetes.io/enforce": "baseline"})
    relabelled = time.monotonic()
    wait_for(lambda: placed_as_decided(mlsched, "rooted"), 90,
             "the job to run once the namespace takes its pods",
             describe=lambda: (_reason(mlsched, "rooted"), placement_problems(mlsched, "rooted")))
    print(f"namespace relabelled: the job ran {time.monotonic() - relabelled:.1f} s later")


def test_a_waiting_job_whose_pods_become_refused_gives_its_capacity_back(api, mlsched, operator,
                                                                         node_shape):
    """The job's pods would have been created when it arrived, and it waited for GPUs. Meanwhile
    the namespace started enforcing `restricted`. When the GPUs freed, it was admitted and
    every pod refused: it said PodsRefused but held its 2 GPUs for the rest of the day. Now it
    is asked again, gives them back, and says why."""
    core = client.CoreV1Api(api)
    gpus = node_shape.count * node_shape.gpu
    mlsched.create(scheduling_policy("default", interval=86400))
    mlsched.create(mljob("filler", ps=None, workers=(gpus, gpus), epochs=1e9))
    wait_for(lambda: _desired(mlsched, "filler") == gpus, 60, "the filler to take every GPU")
    mlsched.create(mljob("waiter", ps=None, workers=(2, 2), epochs=1e9))
    wait_for(lambda: (_reason(mlsched, "waiter") or ("",))[0] == "WaitingForAllocation", 30,
             "the second job to wait for GPUs", describe=lambda: _reason(mlsched, "waiter"))

    _label_namespace(core, mlsched.namespace, RESTRICTED)
    mlsched.custom.delete_namespaced_custom_object(GROUP, VERSION, mlsched.namespace, "mljobs",
                                                   "filler")
    wait_for(lambda: _failed_creates(core, mlsched.namespace, "waiter"), 90,
             "the waiting job to be admitted and its pods refused")
    reason, message = wait_for(
        lambda: (r := _reason(mlsched, "waiter")) and "would refuse" in r[1] and r, 90,
        "the job to be asked again and give its GPUs back", describe=lambda: (
            _reason(mlsched, "waiter"), _desired(mlsched, "waiter")))
    assert reason == "PodsRefused" and "violates PodSecurity" in message, message
    assert _desired(mlsched, "waiter") == 0
    released = [e.message for e in mlsched.events("waiter", "MLJob") if e.reason == "Released"]
    assert released == ["gave back 2 worker: the API server refuses to create its pods"], released
    sts = client.AppsV1Api(api).read_namespaced_stateful_set("waiter-worker", mlsched.namespace)
    assert sts.spec.replicas == 0
