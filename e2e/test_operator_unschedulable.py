"""Pods that cannot start say why: the scheduler's reason and jobs that can never fit reach
the MLJob's conditions, Events and `kubectl get`."""

from __future__ import annotations

import contextlib
import time

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from mlsched_objects import condition, mljob, scheduling_policy
from signals import wait_for_rounds
from waiting import wait_for


def _reason(mlsched, name: str) -> tuple[str, str] | None:
    running = condition(mlsched.job(name), "Running")
    return (running["reason"], running.get("message", "")) if running else None


def _warnings(mlsched, name: str) -> list[tuple[str, str]]:
    return [(e.reason, e.message) for e in mlsched.events(name, "MLJob") if e.type == "Warning"]


def test_a_pod_the_scheduler_refuses_shows_the_schedulers_reason(control_plane, api, mlsched,
                                                                 operator):
    mlsched.create(scheduling_policy("default", interval=600))
    picky = mljob("picky", ps=None)
    # A volume that cannot bind (a claim no PersistentVolume satisfies, no provisioner): the
    # operator does not plan with volumes, and every node refuses the pods. (A node constraint
    # or an extended resource no node has is foreseen instead: test_operator_node_constraints.)
    core = client.CoreV1Api(api)
    core.create_namespaced_persistent_volume_claim(mlsched.namespace, {
        "metadata": {"name": "dataset"},
        "spec": {"storageClassName": "", "accessModes": ["ReadOnlyMany"],
                 "resources": {"requests": {"storage": "1Ti"}}}})
    spec = picky["spec"]["replicaSpecs"]["worker"]["template"]["spec"]
    spec["volumes"] = [{"name": "dataset", "persistentVolumeClaim": {"claimName": "dataset"}}]
    spec["containers"][0]["volumeMounts"] = [{"name": "dataset", "mountPath": "/data"}]
    mlsched.create(picky)

    # (Refused pods are first placed again on a few other nodes: displacement.py.)
    reason, message = wait_for(lambda: (r := _reason(mlsched, "picky")) and
                               r[0] == "Unschedulable" and "picky-worker-0" in r[1] and r, 60,
                               "the job to say its pods cannot be scheduled",
                               describe=lambda: _reason(mlsched, "picky"))
    assert "nodes are available" in message, message
    assert "unbound immediate PersistentVolumeClaims" in message, message
    assert any(r == "Unschedulable" for r, _ in _warnings(mlsched, "picky"))
    # What `kubectl describe` shows a user, not only the API.
    described = control_plane.kubectl("describe", "mljob", "picky", "-n", mlsched.namespace).stdout
    assert "Unschedulable" in described and "nodes are available" in described


def test_a_job_that_can_never_fit_says_so(mlsched, operator):
    mlsched.create(scheduling_policy("default", interval=600))
    mlsched.create(mljob("huge-gang", ps=None, workers=(1000, 1000)))
    greedy = mljob("greedy-worker", ps=None)
    container = greedy["spec"]["replicaSpecs"]["worker"]["template"]["spec"]["containers"][0]
    container["resources"] = {"requests": {"cpu": "2", "nvidia.com/gpu": "16"},
                              "limits": {"cpu": "2", "nvidia.com/gpu": "16"}}
    mlsched.create(greedy)
    mlsched.create(mljob("fits", ps=None))

    reason, message = wait_for(lambda: (r := _reason(mlsched, "huge-gang")) and
                               r[0] == "CannotFit" and r, 60, "the gang to be reported",
                               describe=lambda: _reason(mlsched, "huge-gang"))
    # 13 nodes x (8 CPU, 2 GPU): the minimum of 1000 workers needs 1000 GPUs, there are 26.
    assert "1000 worker" in message and "1000 GPU" in message and "26 GPU" in message, message
    reason, message = wait_for(lambda: (r := _reason(mlsched, "greedy-worker")) and
                               r[0] == "CannotFit" and r, 60, "the greedy worker to be reported",
                               describe=lambda: _reason(mlsched, "greedy-worker"))
    assert "one worker asks for 2 CPU, 16 GPU" in message, message
    assert any(r == "CannotFit" for r, _ in _warnings(mlsched, "huge-gang"))
    # A job that fits is not told so, and runs beside them.
    wait_for(lambda: (_reason(mlsched, "fits") or ("",))[0] == "AllRolesReady", 90,
             "the job that fits to run", describe=lambda: _reason(mlsched, "fits"))


def test_pods_the_api_server_refuses_to_create_say_why(api, control_plane, mlsched, operator):
    """The training ServiceAccount missing from the namespace: every pod would be refused at
    creation (which only the StatefulSet's FailedCreate Events used to say, once the job had
    been given its GPUs). A dry-run create finds it first: the job says why, holds nothing, and
    runs once the account is back."""
    import time

    from kubernetes import client

    core = client.CoreV1Api(api)
    core.delete_namespaced_service_account("mlsched-training", mlsched.namespace)
    mlsched.create(scheduling_policy("default", interval=600))
    mlsched.create(mljob("no-account", ps=None))

    reason, message = wait_for(lambda: (r := _reason(mlsched, "no-account"))
                               and r[0] == "PodsRefused" and r, 60,
                               "the job to say its pods are refused",
                               describe=lambda: _reason(mlsched, "no-account"))
    assert message.startswith('the API server would refuse to create its pods: pods '
                              '"no-account-worker-0" is forbidden: error looking up service '
                              'account'), message
    assert 'serviceaccount "mlsched-training" not found' in message, message
    assert mlsched.job("no-account")["status"]["replicaStatuses"]["worker"]["desired"] == 0
    assert any(r == "PodsRefused" for r, _ in _warnings(mlsched, "no-account"))
    described = control_plane.kubectl("describe", "mljob", "no-account", "-n", mlsched.namespace).stdout
    assert "PodsRefused" in described

    core.create_namespaced_service_account(mlsched.namespace, {"metadata": {"name": "mlsched-training"},
                                                               "automountServiceAccountToken": False})
    back = time.monotonic()
    wait_for(lambda: (_reason(mlsched, "no-account") or ("",))[0] == "AllRolesReady", 180,
             "the job to run once the account exists",
             describe=lambda: _reason(mlsched, "no-account"))
    print(f"account recreated: the job ran {time.monotonic() - back:.1f} s later")


def test_a_running_job_whose_policy_is_deleted_says_so(control_plane, mlsched, operator):
    """Deleting a SchedulingPolicy leaves its running jobs where they are (nothing evicts
    them), but nothing re-decides them any more: the job says so."""
    mlsched.create(scheduling_policy("default", interval=600))
    mlsched.create(mljob("orphan", ps=None))
    wait_for(lambda: (_reason(mlsched, "orphan") or ("",))[0] == "AllRolesReady", 90,
             "the job to run", describe=lambda: _reason(mlsched, "orphan"))
    mlsched.custom.delete_namespaced_custom_object("mlsched.io", "v1alpha1", mlsched.namespace,
                                                   "schedulingpolicies", "default")

    def admitted():
        c = condition(mlsched.job("orphan"), "Admitted")
        return (c["status"], c["reason"], c.get("message", "")) if c else None

    status, reason, message = wait_for(lambda: (a := admitted()) and a[1] == "PolicyNotFound" and a,
                                       30, "the job to say its policy is gone", describe=admitted)
    assert status == "True" and "SchedulingPolicy 'default' does not exist" in message, message
    assert (_reason(mlsched, "orphan") or ("",))[0] == "AllRolesReady"  # still running
    assert any(r == "PolicyNotFound" for r, _ in _warnings(mlsched, "orphan"))
    described = control_plane.kubectl("describe", "mljob", "orphan", "-n", mlsched.namespace).stdout
    assert "PolicyNotFound" in described


def test_a_policy_that_comes_a_second_after_its_job_leaves_no_warning_behind(control_plane,
                                                                             mlsched, operator):
    """`kubectl apply -k manifests/samples` creates the jobs a moment before their policies
    (kustomize orders custom kinds by name): the dl2 sample used to keep a PolicyNotFound
    Warning in `kubectl describe` although its policy came a second later."""
    mlsched.create(mljob("early", ps=None, policy="later"))
    wait_for(lambda: _reason(mlsched, "early"), 30, "the job to get a Running condition")
    assert _reason(mlsched, "early")[0] == "WaitingForPolicy", _reason(mlsched, "early")
    time.sleep(1)
    mlsched.create(scheduling_policy("later", interval=600))
    wait_for(lambda: (_reason(mlsched, "early") or ("",))[0] == "AllRolesReady", 90,
             "the job to run", describe=lambda: _reason(mlsched, "early"))
    reasons = {c["reason"] for c in mlsched.job("early")["status"]["conditions"]}
    assert "PolicyNotFound" not in reasons and "WaitingForPolicy" not in reasons, reasons
    assert _warnings(mlsched, "early") == []
    described = control_plane.kubectl("describe", "mljob", "early", "-n", mlsched.namespace).stdout
    assert "PolicyNotFound" not in described, described


def test_a_missing_policy_clears_when_it_comes(control_plane, mlsched, operator):
    """A job whose policy stays missing says PolicyNotFound (a Warning); when the policy comes,
    no condition keeps saying so, and an Event beside the Warning says it was found."""
    mlsched.create(mljob("patient", ps=None, policy="eventually"))
    wait_for(lambda: (_reason(mlsched, "patient") or ("",))[0] == "PolicyNotFound", 45,
             "the job to say its policy is missing", describe=lambda: _reason(mlsched, "patient"))
    assert [r for r, _ in _warnings(mlsched, "patient")] == ["PolicyNotFound"]
    mlsched.create(scheduling_policy("eventually", interval=600))
    wait_for(lambda: (_reason(mlsched, "patient") or ("",))[0] == "AllRolesReady", 90,
             "the job to run", describe=lambda: _reason(mlsched, "patient"))
    reasons = {c["reason"] for c in mlsched.job("patient")["status"]["conditions"]}
    assert "PolicyNotFound" not in reasons, reasons
    found = [e for e in mlsched.events("patient", "MLJob") if e.reason == "PolicyFound"]
    assert [e.type for e in found] == ["Normal"], found
    assert "SchedulingPolicy 'eventually' exists now" in found[0].message
    described = control_plane.kubectl("describe", "mljob", "patient", "-n", mlsched.namespace).stdout
    assert "PolicyFound" in described, described


def test_pods_whose_scheduler_does_not_run_here_are_reported(mlsched, start_operator):
    """A template brought over from Volcano names `schedulerName: volcano`, and no Volcano
    runs here: the operator pins and ungates the pods, nothing ever binds them, and
    `kubectl get` keeps showing them SchedulingGated. The job said PodsStarting forever while
    its GPUs stayed held; now it is Unschedulable naming the scheduler after the grace
    (3 s here, 60 s by default)."""
    start_operator(extra_env={"MLSCHED_SCHEDULER_GRACE_SECONDS": "3",
                              "MLSCHED_JOB_SYNC_SECONDS": "2"})
    mlsched.create(scheduling_policy("default", interval=600))
    job = mljob("brought-over", ps=None, workers=(2, 2))
    job["spec"]["replicaSpecs"]["worker"]["template"]["spec"]["schedulerName"] = "volcano"
    mlsched.create(job)
    reason, message = wait_for(lambda: (r := _reason(mlsched, "brought-over"))
                               and r[0] == "Unschedulable" and r, 60,
                               "the job to say no scheduler acts on its pods",
                               describe=lambda: _reason(mlsched, "brought-over"))
    assert "its scheduler 'volcano' (spec.schedulerName) has not acted on it" in message, message
    assert any(r == "Unschedulable" and "volcano" in m for r, m in _warnings(mlsched, "brought-over"))
    assert all(not p.spec.node_name for p in mlsched.pods("brought-over"))


def test_pods_whose_image_cannot_be_pulled_are_reported(mlsched, operator):
    """A typo in an image tag: the pods are bound and hold their GPUs, the kubelet backs off
    pulling, and the job said PodsStarting for as long as it lasted."""
    from mlsched_objects import MISSING_IMAGE

    mlsched.create(scheduling_policy("default", interval=600))
    job = mljob("typo", ps=None, workers=(2, 2))
    job["spec"]["replicaSpecs"]["worker"]["template"]["spec"]["containers"][0]["image"] = \
        MISSING_IMAGE
    mlsched.create(job)
    reason, message = wait_for(lambda: (r := _reason(mlsched, "typo"))
                               and r[0] == "PodsCannotStart" and r, 60,
                               "the job to say its pods cannot start",
                               describe=lambda: _reason(mlsched, "typo"))
    assert message.startswith("pod typo-worker-"), message
    assert f'ImagePullBackOff: Back-off pulling image "{MISSING_IMAGE}"' in message, message
    assert any(r == "PodsCannotStart" for r, _ in _warnings(mlsched, "typo"))


def test_pods_whose_volume_cannot_be_mounted_are_reported(mlsched, start_operator):
    """A typo in a ConfigMap volume's name: the pods are bound and hold their GPUs, status
    says only ContainerCreating, and only the pods' FailedMount Events say why. The job said
    PodsStarting for as long as it lasted; now it says why after the grace (3 s here, 60 s by
    default)."""
    from mlsched_objects import MISSING_CONFIGMAP

    start_operator(extra_env={"MLSCHED_CREATING_GRACE_SECONDS": "3",
                              "MLSCHED_JOB_SYNC_SECONDS": "2"})
    mlsched.create(scheduling_policy("default", interval=600))
    job = mljob("unmounted", ps=None, workers=(2, 2))
    spec = job["spec"]["replicaSpecs"]["worker"]["template"]["spec"]
    spec["volumes"] = [{"name": "settings", "configMap": {"name": MISSING_CONFIGMAP}}]
    spec["containers"][0]["volumeMounts"] = [{"name": "settings", "mountPath": "/etc/settings"}]
    mlsched.create(job)
    reason, message = wait_for(lambda: (r := _reason(mlsched, "unmounted"))
                               and r[0] == "PodsCannotStart" and r, 60,
                               "the job to say its pods cannot start",
                               describe=lambda: _reason(mlsched, "unmounted"))
    assert message.startswith("pod unmounted-worker-"), message
    assert (f'FailedMount: MountVolume.SetUp failed for volume "settings" : configmap '
            f'"{MISSING_CONFIGMAP}" not found') in message, message
    assert any(r == "PodsCannotStart" for r, _ in _warnings(mlsched, "unmounted"))
    assert all(p.spec.node_name for p in mlsched.pods("unmounted"))  # bound, holding their GPUs


HOLD = "e2e.mlsched.io/hold"  # a finalizer that keeps a pod terminating, as a long checkpoint does
POOL = "e2e.mlsched.io/shrink"


def test_a_pod_given_the_room_a_shrunk_jobs_pod_is_leaving_waits_without_an_alarm(api, mlsched,
                                                                                 operator):
    """A round shrinks one job to give another its room. The shrunk job's pod takes its time to
    go (a training container saves a checkpoint in its termination grace period), and
    kube-scheduler refuses the newcomer's pod on that node meanwhile ("Insufficient
    nvidia.com/gpu"). That is the plan working, not a job that cannot be scheduled: it used to
    turn the job Unschedulable with a Warning Event (and the monitoring alert's count) after
    every round that re-shared a full cluster, 258 jobs in bench_e2e's 2,000-job round."""
    core = client.CoreV1Api(api)
    node = "kwok-node-5"  # one node, 2 GPUs, for both jobs' workers
    core.patch_node(node, {"metadata": {"labels": {POOL: "yes"}}})
    held: list[str] = []
    try:
        mlsched.create(scheduling_policy("default", interval=600))
        first = mljob("first", ps=None, workers=(1, 2))
        first["spec"]["replicaSpecs"]["worker"]["template"]["spec"]["nodeSelector"] = {POOL: "yes"}
        mlsched.create(first)
        wait_for(lambda: (_reason(mlsched, "first") or ("",))[0] == "AllRolesReady"
                 and len(mlsched.pods("first")) == 2, 90, "the first job to run both GPUs' workers",
                 describe=lambda: (_reason(mlsched, "first"), len(mlsched.pods("first"))))
        for pod in mlsched.pods("first"):  # whichever the scale-down or the restart takes
            core.patch_namespaced_pod(pod.metadata.name, mlsched.namespace,
                                      {"metadata": {"finalizers": [HOLD]}})
            held.append(pod.metadata.name)
        second = mljob("second", ps=None, workers=(1, 1))
        second["spec"]["replicaSpecs"]["worker"]["template"]["spec"]["nodeSelector"] = {POOL: "yes"}
        mlsched.create(second)

        # DRF's next round gives each job one GPU: "first" shrinks, its pod leaves slowly, and
        # whichever pod is pinned on the node next is refused until it has gone.
        def refused():
            return [p.metadata.name for p in mlsched.pods()
                    if not p.metadata.deletion_timestamp and not p.spec.node_name
                    and any(c.type == "PodScheduled" and c.reason == "Unschedulable"
                            for c in p.status.conditions or ())]

        wait_for(refused, 90, "a pod pinned on the node to be refused while a pod leaves it",
                 describe=lambda: [(p.metadata.name, p.spec.node_name, p.metadata.deletion_timestamp)
                                   for p in mlsched.pods()])
        seen: set[tuple[str, str]] = set()

        def waiting_named():
            for name in ("first", "second"):
                reason = _reason(mlsched, name)
                if reason:
                    seen.add(reason[:1] + (name,))
            found = [r for n in ("first", "second") if (r := _reason(mlsched, n))
                     and r[0] == "PodsStarting" and "is leaving" in r[1]]
            return found

        reason, message = wait_for(waiting_named, 30, "the refused pod's job to say what it waits for",
                                   describe=lambda: [_reason(mlsched, n) for n in ("first", "second")])[0]
        assert any(name in message for name in held), message
        # It stays so while the pod is held: sampled over two rounds of the policy (every 3 s)
        # and the sweeps between them (every second), counted, not a fixed sleep.
        wait_for_rounds(mlsched, "default", 2, timeout=30, interval=0.5, sample=waiting_named)
        assert not [s for s in seen if s[0] == "Unschedulable"], seen
        for name in ("first", "second"):
            assert not [w for w in _warnings(mlsched, name) if w[0] == "Unschedulable"], \
                _warnings(mlsched, name)
        _release(core, mlsched.namespace, held)
        for name in ("first", "second"):
            wait_for(lambda n=name: (_reason(mlsched, n) or ("",))[0] == "AllRolesReady", 90,
                     f"{name} to run once the pod has gone",
                     describe=lambda n=name: _reason(mlsched, n))
    finally:
        _release(core, mlsched.namespace, held)
        core.patch_node(node, {"metadata": {"labels": {POOL: None}}})


def _release(core: client.CoreV1Api, namespace: str, pods: list[str]) -> None:
    for name in pods:
        with contextlib.suppress(ApiException):  # 404 once it is gone
            core.patch_namespaced_pod(name, namespace, {"metadata": {"finalizers": None}})
