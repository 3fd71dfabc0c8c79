"""Nothing gets stuck: objects delete without the operator, large specs work, and a job
recreated under an old name never adopts its predecessor's children.

Each test is written from the user's side: what the API server stores and what
`kubectl delete` does.
"""

from __future__ import annotations

import contextlib
import time

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from mlsched_objects import GROUP, VERSION, condition, mljob, phase, scheduling_policy
from signals import utc_now, wait_for_rounds
from waiting import wait_for

HOLD = "e2e.mlsched.io/hold"  # a finalizer the test puts on a child to keep it terminating


def _running(mlsched, name: str, timeout: float = 90) -> dict:
    return wait_for(lambda: phase(j := mlsched.job(name)) == "Running" and j, timeout,
                    f"{name} to be Running", describe=lambda: (mlsched.job(name) or {}).get("status"))


def test_objects_carry_no_finalizer_and_delete_while_the_operator_is_down(mlsched, operator):
    mlsched.create(scheduling_policy("default", interval=600))
    mlsched.create(mljob("doomed"))
    job = _running(mlsched, "doomed")
    policy = mlsched.policy("default")
    # Nothing the operator runs needs to see a deletion before it happens.
    assert not job["metadata"].get("finalizers"), job["metadata"]
    assert not policy["metadata"].get("finalizers"), policy["metadata"]

    operator.kill()
    started = time.monotonic()
    mlsched.custom.delete_namespaced_custom_object(GROUP, VERSION, mlsched.namespace, "mljobs",
                                                   "doomed")
    mlsched.custom.delete_namespaced_custom_object(GROUP, VERSION, mlsched.namespace,
                                                   "schedulingpolicies", "default")
    wait_for(lambda: not mlsched.remaining(), 10, "both objects to be gone with no operator",
             describe=mlsched.remaining)
    # The children go with the owner references (the garbage collector, not the operator).
    wait_for(lambda: not mlsched.statefulsets("doomed"), 60,
             "the StatefulSets to be garbage-collected")
    assert time.monotonic() - started < 60


def test_a_spec_over_256_kib_runs_is_edited_and_deleted(mlsched, operator):
    mlsched.create(scheduling_policy("default", interval=600))
    big = mljob("big")
    # 300 KB of configuration in the pod template: more than an annotation may hold.
    worker = big["spec"]["replicaSpecs"]["worker"]["template"]["spec"]["containers"][0]
    worker["env"] = [{"name": "CONFIG", "value": "x" * 300_000}]
    mlsched.create(big)
    _running(mlsched, "big")
    assert sum(len(v) for v in (mlsched.job("big")["metadata"].get("annotations") or {}).values()) \
        < 10_000

    # An edit of the template reaches the StatefulSet.
    edited = mlsched.job("big")
    edited["spec"]["replicaSpecs"]["worker"]["template"]["spec"]["containers"][0]["env"] = [
        {"name": "CONFIG", "value": "y" * 300_000}]
    mlsched.patch_job("big", edited["spec"])

    def template_value():
        sts = mlsched.statefulsets("big")["worker"]
        return sts.spec.template.spec.containers[0].env[0].value[:1]

    wait_for(lambda: template_value() == "y", 30, "the edit to reach the StatefulSet",
             describe=template_value)
    mlsched.custom.delete_namespaced_custom_object(GROUP, VERSION, mlsched.namespace, "mljobs",
                                                   "big")
    wait_for(lambda: mlsched.job("big") is None, 10, "the job to be deleted")


def test_a_job_recreated_under_the_same_name_waits_for_the_old_children(api, mlsched, operator):
    apps = client.AppsV1Api(api)
    mlsched.create(scheduling_policy("default", interval=600))
    mlsched.create(mljob("again", ps=None))
    old = _running(mlsched, "again")
    old_sts = mlsched.statefulsets("again")["worker"]
    # Keep the old StatefulSet terminating (as the garbage collector may, for a while).
    apps.patch_namespaced_stateful_set(old_sts.metadata.name, mlsched.namespace,
                                       {"metadata": {"finalizers": [HOLD]}})
    mlsched.custom.delete_namespaced_custom_object(GROUP, VERSION, mlsched.namespace, "mljobs",
                                                   "again")
    wait_for(lambda: mlsched.job("again") is None, 10, "the old job to be deleted")
    wait_for(lambda: mlsched.statefulsets("again")["worker"].metadata.deletion_timestamp, 30,
             "the old StatefulSet to be terminating")

    try:
        _recreate_while_the_old_statefulset_stays(apps, mlsched, old, old_sts.metadata.name)
    finally:
        with contextlib.suppress(ApiException):  # 404 once the test let it go
            apps.patch_namespaced_stateful_set(old_sts.metadata.name, mlsched.namespace,
                                               {"metadata": {"finalizers": None}})


def _recreate_while_the_old_statefulset_stays(apps, mlsched, old: dict, old_sts: str) -> None:
    new = mlsched.create(mljob("again", ps=None))
    assert new["metadata"]["uid"] != old["metadata"]["uid"]
    # The new job says what it waits for, and does not count the old job's pods as its own.
    wait_for(lambda: any(e.reason == "WaitingForOldChildren"
                         for e in mlsched.events("again", "MLJob")), 30,
             "an Event saying the job waits for its predecessor's StatefulSet",
             describe=lambda: [(e.reason, e.message) for e in mlsched.events("again", "MLJob")])
    # Two rounds of its policy (every 3 s) and the sweeps between them (every second) have
    # looked at it since (a positive signal before asserting what did not happen).
    wait_for_rounds(mlsched, "default", 2, since=utc_now(), timeout=30)
    job = mlsched.job("again")
    assert phase(job) != "Running", job.get("status")
    sts = mlsched.statefulsets("again")["worker"]
    assert sts.metadata.owner_references[0].uid == old["metadata"]["uid"]

    apps.patch_namespaced_stateful_set(old_sts, mlsched.namespace, {"metadata": {"finalizers": None}})
    job = _running(mlsched, "again", timeout=120)
    owners = {s.metadata.owner_references[0].uid for s in mlsched.statefulsets("again").values()}
    assert owners == {new["metadata"]["uid"]}
    assert condition(job, "Running")["status"] == "True"
