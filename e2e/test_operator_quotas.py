"""A namespace's ResourceQuota is planned within: the operator never scales a job past what the
quota has left (whose pods the API server would refuse: FailedCreate), a job whose minimum the
quota can never hold is told so, one waiting for others' usage says so, and it starts within
seconds of the quota having room."""

from __future__ import annotations

import contextlib
import re
import time

from kubernetes import client

from dl2_model import configmap_ref, model_configmap
from job_state import placed_as_decided, placement_problems, refused_for_good, running_reason
from mlsched.controller.app.jobs import OVER_QUOTA_RETRY_S
from mlsched_objects import GROUP, VERSION, condition, mljob, scheduling_policy
from signals import metric
from waiting import wait_for

DAY = 86400


def test_jobs_are_planned_within_the_namespaces_quota(api, mlsched, operator):
    core = client.CoreV1Api(api)
    core.create_namespaced_resource_quota(mlsched.namespace, {
        "metadata": {"name": "gpus"}, "spec": {"hard": {"requests.nvidia.com/gpu": "4"}}})
    mlsched.create(scheduling_policy("daily", allocation="drf", interval=DAY))
    # DRF would give this job 8 GPUs of the 26 free; the quota leaves it 4.
    mlsched.create(mljob("first", ps=None, workers=(2, 8), epochs=1e9, policy="daily"))
    status = wait_for(lambda: placed_as_decided(mlsched, "first"), 60, "the first job to run",
                      describe=lambda: placement_problems(mlsched, "first"))
    assert status["replicaStatuses"]["worker"]["desired"] <= 4

    mlsched.create(mljob("too-big", ps=None, workers=(6, 6), epochs=1e9, policy="daily"))
    reason, message = wait_for(lambda: (r := running_reason(mlsched, "too-big")) and r[0] == "CannotFit"
                               and r, 30, "the job the quota can never hold to be told so",
                               describe=lambda: running_reason(mlsched, "too-big"))
    assert message == "its minimum requests 6 GPU; the namespace's ResourceQuota 'gpus' " \
                      "allows 4 in all", message

    # Fill the quota, then a job that must wait for it.
    used = status["replicaStatuses"]["worker"]["desired"]
    if used < 4:
        mlsched.create(mljob("filler", ps=None, workers=(4 - used, 4 - used), epochs=1e9,
                             policy="daily"))
        wait_for(lambda: placed_as_decided(mlsched, "filler"), 60, "the filler to run",
                 describe=lambda: placement_problems(mlsched, "filler"))
    mlsched.create(mljob("waiter", ps=None, workers=(2, 2), epochs=1e9, policy="daily"))
    reason, message = wait_for(lambda: (r := running_reason(mlsched, "waiter"))
                               and r[0] == "WaitingForQuota" and r, 30,
                               "the waiting job to say it waits for quota",
                               describe=lambda: running_reason(mlsched, "waiter"))
    assert "ResourceQuota 'gpus' has 0 of 4 left" in message, message
    assert mlsched.pods("waiter") == []
    # No pod was refused by the quota: the operator did not ask for one past it.
    refused = refused_for_good(mlsched)
    assert not refused, refused

    deleted = time.monotonic()
    mlsched.custom.delete_namespaced_custom_object("mlsched.io", "v1alpha1", mlsched.namespace,
                                                   "mljobs", "first")
    # The quota counts terminating pods until they are gone (about 40 s here: garbage
    # collection and the pods' grace period); the operator cannot admit before that.
    wait_for(lambda: not mlsched.pods("first"), 90, "the deleted job's pods to go")
    gone = time.monotonic()
    wait_for(lambda: placed_as_decided(mlsched, "waiter"), 30,
             "the waiting job to run once the quota has room",
             describe=lambda: placement_problems(mlsched, "waiter"))
    print(f"the deleted job's pods went {gone - deleted:.1f} s after the delete; the waiting "
          f"job ran {time.monotonic() - gone:.1f} s after that")


def test_a_quota_on_limits_and_pods_is_planned_within(api, mlsched, operator):
    """`limits.cpu` and `pods` quotas, with the LimitRange that gives containers their default
    limit (the usual pair in multi-tenant clusters). They were not planned with: DRF scaled the
    job to 8 workers, the API server refused 4 pods (FailedCreate), and the job showed Running
    with half its workers while the other half's GPUs stayed reserved."""
    core = client.CoreV1Api(api)
    core.create_namespaced_limit_range(mlsched.namespace, {
        "metadata": {"name": "defaults"},
        "spec": {"limits": [{"type": "Container", "default": {"cpu": "2"},
                             "defaultRequest": {"cpu": "1"}}]}})
    core.create_namespaced_resource_quota(mlsched.namespace, {
        "metadata": {"name": "limits"}, "spec": {"hard": {"limits.cpu": "8", "pods": "6"}}})
    mlsched.create(scheduling_policy("daily", allocation="drf", interval=DAY))
    job = mljob("limited", ps=None, workers=(2, 8), epochs=1e9, policy="daily")
    worker = job["spec"]["replicaSpecs"]["worker"]["template"]["spec"]["containers"][0]
    worker["resources"] = {"requests": {"nvidia.com/gpu": "1", "memory": "8Gi"},
                           "limits": {"nvidia.com/gpu": "1"}}  # CPU: the LimitRange's
    mlsched.create(job)
    wait_for(lambda: placed_as_decided(mlsched, "limited"), 60, "the job to run",
             describe=lambda: placement_problems(mlsched, "limited"))
    workers = wait_for(lambda: (w := mlsched.job("limited")["status"]["replicaStatuses"]["worker"])
                       ["ready"] == w["desired"] and w, 30, "its pods to be ready")
    assert workers == {"desired": 4, "ready": 4}, workers
    # Within the pod count too: 4 of 6 used, so a 3-worker minimum waits for it.
    mlsched.create(mljob("second", ps=None, workers=(3, 3), epochs=1e9, policy="daily"))
    reason, message = wait_for(lambda: (r := running_reason(mlsched, "second"))
                               and r[0] in ("WaitingForQuota", "CannotFit") and r, 30,
                               "the second job to say it waits for quota",
                               describe=lambda: running_reason(mlsched, "second"))
    assert reason == "WaitingForQuota" and "ResourceQuota 'limits' has 0 of 8 left" in message, \
        (reason, message)
    refused = refused_for_good(mlsched)
    assert not refused, refused


def test_two_policies_of_one_namespace_share_its_quota(api, mlsched, operator):
    """Two SchedulingPolicies in one namespace, a quota of 4 GPUs, a job of 2 to 4 workers
    under each, created together. The quota counts a pod only once it exists, and the second
    policy's step booked what the first had just been given: both jobs were scaled past the
    quota, pods of both were refused (FailedCreate), and neither ran whole."""
    core = client.CoreV1Api(api)
    core.create_namespaced_resource_quota(mlsched.namespace, {
        "metadata": {"name": "gpus"}, "spec": {"hard": {"requests.nvidia.com/gpu": "4"}}})
    for name in ("team-x", "team-y"):
        mlsched.create(scheduling_policy(name, allocation="fixed", interval=DAY))
    for name, policy in (("x1", "team-x"), ("y1", "team-y")):
        mlsched.create(mljob(name, ps=None, workers=(2, 4), epochs=1e9, policy=policy))

    def one_runs():
        for name in ("x1", "y1"):
            status = placed_as_decided(mlsched, name)
            workers = (status or {}).get("replicaStatuses", {}).get("worker", {})
            if workers.get("desired") and workers.get("ready") == workers["desired"]:
                return name, status
        return None

    winner, status = wait_for(one_runs, 60, "one of the jobs to run",
                              describe=lambda: [placement_problems(mlsched, n) for n in ("x1", "y1")])
    assert status["replicaStatuses"]["worker"] == {"desired": 4, "ready": 4}
    other = "y1" if winner == "x1" else "x1"
    reason, message = wait_for(lambda: (r := running_reason(mlsched, other))
                               and r[0] == "WaitingForQuota" and r, 30,
                               "the other job to wait for the quota",
                               describe=lambda: running_reason(mlsched, other))
    assert mlsched.pods(other) == []
    # The other job was never scaled: none of its pods was asked for, let alone refused. (The
    # winner's StatefulSet may meet a transient quota refusal of Kubernetes' own accounting
    # while its pods are created in parallel, which the StatefulSet controller retries.)
    replicas = mlsched.apps.read_namespaced_stateful_set(f"{other}-worker", mlsched.namespace)
    assert replicas.spec.replicas == 0
    refused = [e.message for e in core.list_namespaced_event(mlsched.namespace).items
               if e.reason == "FailedCreate" and e.involved_object.name == f"{other}-worker"]
    assert not refused, refused


def test_a_job_whose_children_an_object_count_quota_refuses_waits_and_starts_when_it_has_room(
        api, mlsched, operator):
    """A quota on object counts (`services`, `count/statefulsets.apps`) full: the job's Service
    cannot be created. It used to show no phase and no condition at all while its create was
    retried every second."""
    core = client.CoreV1Api(api)
    core.create_namespaced_resource_quota(mlsched.namespace, {
        "metadata": {"name": "objects"}, "spec": {"hard": {"services": "1"}}})
    mlsched.create(scheduling_policy("default", interval=DAY))
    mlsched.create(mljob("holder", ps=None, workers=(1, 2), epochs=1e9))
    wait_for(lambda: placed_as_decided(mlsched, "holder"), 60, "the first job to run",
             describe=lambda: placement_problems(mlsched, "holder"))
    mlsched.create(mljob("second", ps=None, workers=(1, 2), epochs=1e9))

    def admitted():
        c = condition(mlsched.job("second"), "Admitted")
        return (c["reason"], c.get("message", "")) if c else None

    reason, message = wait_for(lambda: (r := admitted()) and r[0] == "WaitingForQuota" and r, 30,
                               "the second job to say why it waits", describe=admitted)
    assert message.startswith(
        "its Service second cannot be created until the namespace's ResourceQuota has room (services "
        '"second" is forbidden: exceeded quota: objects'), message
    assert mlsched.job("second")["status"]["phase"] == "Pending"
    # Not a create call every second: one Event, and the holder is not told its children
    # were not created (a full quota refuses even the create of an object that exists).
    # Asserted once the operator has tried the Service again (its retry, every 30 s while the
    # quota stays full, or at a change of the quota): a positive signal that it has acted. The
    # change here is a label on the quota, which leaves it as full as it was: the retry within
    # a sweep (1 s), not the 30 s timer that used to be most of this test.
    services = 'verb="create",resource="services"'
    tried = metric(operator.metrics(), "mlsched_api_requests_total", services)
    core.patch_namespaced_resource_quota("objects", mlsched.namespace,
                                         {"metadata": {"labels": {"e2e.mlsched.io/nudge": "1"}}})
    wait_for(lambda: metric(operator.metrics(), "mlsched_api_requests_total", services) > tried,
             20 + OVER_QUOTA_RETRY_S, "the operator to try the Service again",
             describe=lambda: metric(operator.metrics(), "mlsched_api_requests_total", services))
    # Its StatefulSet comes before its Service (controller/objects/services.py), and is not scaled:
    # without the Service its pods would have no DNS names.
    assert {r: s.spec.replicas for r, s in mlsched.statefulsets("second").items()} == {"worker": 0}
    assert mlsched.pods("second") == []
    assert [e.reason for e in mlsched.events("second", "MLJob")].count("WaitingForQuota") == 1
    assert "ChildrenNotCreated" not in [e.reason for e in mlsched.events("holder", "MLJob")]
    # What an alert on stuck jobs watches.
    waiting = re.search(rf'^mlsched_jobs_by_reason\{{namespace="{mlsched.namespace}",phase="Pending",'
                        r'reason="WaitingForQuota"\} (\S+)$', operator.metrics(), re.M)
    assert waiting and float(waiting.group(1)) >= 1, waiting

    # The first job deleted: its Service goes, the quota recounts, the second one starts.
    mlsched.custom.delete_namespaced_custom_object(GROUP, VERSION, mlsched.namespace, "mljobs",
                                                   "holder")
    wait_for(lambda: placed_as_decided(mlsched, "second"), 90, "the second job to run",
             describe=lambda: (admitted(), placement_problems(mlsched, "second")))
    assert mlsched.service("second") is not None


@contextlib.contextmanager
def two_gpus_for_a_class(api, namespace: str, prefix: str, global_default: bool = False):
    """A PriorityClass of its own (the cluster's globalDefault if asked; removed afterwards)
    and a 2-GPU ResourceQuota 'high' in `namespace` scoped to it. Yields the class's name."""
    import uuid
    scheduling = client.SchedulingV1Api(api)
    name = f"{prefix}-{uuid.uuid4().hex[:6]}"
    scheduling.create_priority_class({"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
                                      "metadata": {"name": name}, "value": 1000,
                                      "globalDefault": global_default})
    try:
        client.CoreV1Api(api).create_namespaced_resource_quota(namespace, {
            "metadata": {"name": "high"},
            "spec": {"hard": {"requests.nvidia.com/gpu": "2"},
                     "scopeSelector": {"matchExpressions": [
                         {"scopeName": "PriorityClass", "operator": "In", "values": [name]}]}}})
        yield name
    finally:
        scheduling.delete_priority_class(name)


def test_a_quota_scoped_to_a_priority_class_bounds_that_class_only(api, mlsched, operator):
    """A ResourceQuota with a PriorityClass scopeSelector (how platform teams cap what a
    namespace may run at high priority) counts only the pods of that class. It was left out of
    planning: DRF scaled a high-priority job to 4 one-GPU workers under a 2-GPU quota of its
    class and the API server refused two pods (`PodsRefused`)."""
    with two_gpus_for_a_class(api, mlsched.namespace, "e2e-high") as high:
        mlsched.create(scheduling_policy("daily", allocation="drf", interval=DAY))

        def at(job: dict) -> dict:
            for role in job["spec"]["replicaSpecs"].values():
                role["template"]["spec"]["priorityClassName"] = high
            return job

        mlsched.create(at(mljob("urgent", ps=None, workers=(1, 4), epochs=1e9, policy="daily")))
        status = wait_for(lambda: placed_as_decided(mlsched, "urgent"), 60, "the urgent job to run",
                          describe=lambda: placement_problems(mlsched, "urgent"))
        assert status["replicaStatuses"]["worker"]["desired"] == 2, status["replicaStatuses"]
        # Pods of no priority class are not the quota's: a job of them gets all it asks.
        mlsched.create(mljob("routine", ps=None, workers=(1, 4), epochs=1e9, policy="daily"))
        status = wait_for(lambda: placed_as_decided(mlsched, "routine"), 60, "the routine job to run",
                          describe=lambda: placement_problems(mlsched, "routine"))
        assert status["replicaStatuses"]["worker"]["desired"] == 4, status["replicaStatuses"]
        mlsched.create(at(mljob("urgent-too", ps=None, workers=(1, 1), epochs=1e9, policy="daily")))
        reason, message = wait_for(lambda: (r := running_reason(mlsched, "urgent-too"))
                                   and r[0] == "WaitingForQuota" and r, 30,
                                   "the second urgent job to wait for its class's quota",
                                   describe=lambda: running_reason(mlsched, "urgent-too"))
        assert message == ("its minimum requests 1 GPU; the namespace's ResourceQuota 'high' has "
                           "0 of 2 left"), message
        refused = refused_for_good(mlsched)
        assert not refused, refused


def test_a_learned_policy_starts_a_job_whose_class_the_spent_quota_does_not_bound(
        api, mlsched, operator, dl2_files):
    """DL² under a quota scoped to one PriorityClass: with that class's quota spent and a job
    of the class waiting for it, a job of no class asking for the same resources must still
    start. DL²'s window checked one job per distinct demand against the quota, so the waiting
    job's charge stood for both and the other job waited too, with nothing bounding it."""
    model, card, _ = dl2_files
    client.CoreV1Api(api).create_namespaced_config_map(
        mlsched.namespace, model_configmap("dl2-policy", model, card))
    with two_gpus_for_a_class(api, mlsched.namespace, "e2e-learned") as high:
        mlsched.create(scheduling_policy("learned", allocation="dl2", interval=DAY,
                                         models={"allocation": {"dl2": configmap_ref("dl2-policy")}}))

        def at(job: dict) -> dict:
            for role in job["spec"]["replicaSpecs"].values():
                role["template"]["spec"]["priorityClassName"] = high
            return job

        mlsched.create(at(mljob("high-1", ps=None, workers=(2, 2), epochs=1e9, policy="learned")))
        wait_for(lambda: placed_as_decided(mlsched, "high-1"), 60, "the urgent job to run",
                 describe=lambda: placement_problems(mlsched, "high-1"))
        mlsched.create(at(mljob("high-2", ps=None, workers=(1, 1), epochs=1e9, policy="learned")))
        wait_for(lambda: (r := running_reason(mlsched, "high-2")) and r[0] == "WaitingForQuota", 30,
                 "the second urgent job to wait for its class's quota",
                 describe=lambda: running_reason(mlsched, "high-2"))
        # Created within a second of high-2 (creationTimestamp's resolution), it comes after
        # it in the policy's order by its name.
        mlsched.create(mljob("low", ps=None, workers=(1, 4), epochs=1e9, policy="learned"))
        status = wait_for(lambda: placed_as_decided(mlsched, "low"), 60,
                          "the job of no class to run beside the one waiting for its class's quota",
                          describe=lambda: (running_reason(mlsched, "low"),
                                            placement_problems(mlsched, "low")))
        assert status["replicaStatuses"]["worker"]["desired"] >= 1, status["replicaStatuses"]
        assert running_reason(mlsched, "high-2")[0] == "WaitingForQuota"
        refused = refused_for_good(mlsched)
        assert not refused, refused


def test_a_new_global_default_priority_class_is_planned_with_at_once(api, mlsched, operator):
    """The globalDefault PriorityClass decides which quota counts the pods of templates naming
    no class. When an admin moves it away from a class whose quota is full, a job waiting for
    that quota no longer needs it and starts at once. Before, nothing woke the policy: the
    job stayed `WaitingForQuota` until the next round (a day here)."""
    scheduling = client.SchedulingV1Api(api)
    with two_gpus_for_a_class(api, mlsched.namespace, "e2e-default", global_default=True) as high:
        mlsched.create(scheduling_policy("daily", allocation="drf", interval=DAY))
        mlsched.create(mljob("first", ps=None, workers=(1, 4), epochs=1e9, policy="daily"))
        status = wait_for(lambda: placed_as_decided(mlsched, "first"), 60, "the first job to run",
                          describe=lambda: placement_problems(mlsched, "first"))
        assert status["replicaStatuses"]["worker"]["desired"] == 2, status["replicaStatuses"]
        mlsched.create(mljob("second", ps=None, workers=(1, 1), epochs=1e9, policy="daily"))
        reason, message = wait_for(lambda: (r := running_reason(mlsched, "second"))
                                   and r[0] == "WaitingForQuota" and r, 30,
                                   "the second job to wait for the default class's quota",
                                   describe=lambda: running_reason(mlsched, "second"))
        assert "ResourceQuota 'high' has 0 of 2 left" in message, message
        scheduling.patch_priority_class(high, {"globalDefault": False})
        moved = time.monotonic()
        wait_for(lambda: placed_as_decided(mlsched, "second"), 30,
                 "the second job to run once its pods are of no class",
                 describe=lambda: (running_reason(mlsched, "second"), placement_problems(mlsched, "second")))
        print(f"second placed {time.monotonic() - moved:.1f} s after the default moved")
        refused = refused_for_good(mlsched)
        assert not refused, refused


def test_pods_made_before_a_global_default_keep_their_own_priority_class(api, mlsched, operator):
    """The API server gives a pod its PriorityClass once, when it is created: the template's,
    else the globalDefault of that moment. Pods made before an admin named a default keep no
    class, and a quota scoped to the new default does not count them. The operator planned them
    as if they had the new default: a running job's two GPU pods filled the class's 2-GPU quota
    in the plan, and a new job of that class waited, told `WaitingForAllocation` ("its minimum
    (2 worker: 2 GPU, ...) does not fit what is free now: 24 GPU, ...") while the quota showed
    none of it used."""
    mlsched.create(scheduling_policy("daily", allocation="drf", interval=DAY))
    mlsched.create(mljob("early", ps=None, workers=(2, 2), epochs=1e9, policy="daily"))
    wait_for(lambda: placed_as_decided(mlsched, "early"), 60, "the early job to run",
             describe=lambda: placement_problems(mlsched, "early"))
    early = {p.metadata.name: p.metadata.uid for p in mlsched.pods()}
    assert all(not p.spec.priority_class_name for p in mlsched.pods()), "a default existed already"
    with two_gpus_for_a_class(api, mlsched.namespace, "e2e-later", global_default=True):
        mlsched.create(mljob("later", ps=None, workers=(2, 2), epochs=1e9, policy="daily"))
        status = wait_for(lambda: placed_as_decided(mlsched, "later"), 30,
                          "the later job to run within its class's quota, which counts nothing yet",
                          describe=lambda: (running_reason(mlsched, "later"), placement_problems(mlsched, "later")))
        assert status["replicaStatuses"]["worker"]["desired"] == 2, status["replicaStatuses"]
        kept = {p.metadata.name: p.metadata.uid for p in mlsched.pods() if p.metadata.name in early}
        assert kept == early, "the early job's pods were replaced"
        refused = refused_for_good(mlsched)
        assert not refused, refused
