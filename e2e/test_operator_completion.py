"""When a job has succeeded: its reported epochs reached spec.epochs (the samples test), or
every worker exited 0. StatefulSet pods restart whatever the exit code, so a worker that exits
0 must not count toward backoffLimit; one that exits non-zero must.

kwok runs no containers: the test plays the kubelet and writes what it would report after
a container exited and was restarted (restartCount and lastState)."""

from __future__ import annotations

from datetime import UTC, datetime

from kubernetes import client

from mlsched_objects import condition, mljob, phase, scheduling_policy
from waiting import wait_for


def _exited(core: client.CoreV1Api, namespace: str, pod_name: str, code: int) -> None:
    pod = core.read_namespaced_pod(pod_name, namespace)
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    statuses = []
    for c in pod.status.container_statuses:
        statuses.append({
            "name": c.name, "image": c.image, "ready": True, "started": True,
            "restartCount": (c.restart_count or 0) + 1,
            "state": {"running": {"startedAt": now}},
            "lastState": {"terminated": {"exitCode": code,
                                         "reason": "Completed" if code == 0 else "Error",
                                         "startedAt": now, "finishedAt": now}}})
    core.patch_namespaced_pod_status(pod_name, namespace, {"status": {"containerStatuses": statuses}})


def _running_job(mlsched, name: str, **kw) -> None:
    mlsched.create(scheduling_policy("default", interval=600))
    mlsched.create(mljob(name, ps=None, workers=(2, 2), **kw))
    wait_for(lambda: phase(mlsched.job(name)) == "Running", 90, f"{name} to run",
             describe=lambda: (mlsched.job(name) or {}).get("status"))


def test_workers_that_exit_0_complete_the_job_and_are_no_failures(api, mlsched, operator):
    core = client.CoreV1Api(api)
    _running_job(mlsched, "finisher", run_policy={"backoffLimit": 0})

    _exited(core, mlsched.namespace, "finisher-worker-0", 0)
    # Restarted after exit 0: with backoffLimit 0 this would fail the job were it counted.
    wait_for(lambda: core.read_namespaced_pod("finisher-worker-0", mlsched.namespace)
             .status.container_statuses[0].restart_count == 1, 10, "the restart to be visible")
    job = mlsched.job("finisher")
    assert phase(job) == "Running", job["status"]

    _exited(core, mlsched.namespace, "finisher-worker-1", 0)
    job = wait_for(lambda: phase(j := mlsched.job("finisher")) == "Succeeded" and j, 30,
                   "the job to succeed once every worker exited 0",
                   describe=lambda: (mlsched.job("finisher") or {}).get("status"))
    done = condition(job, "Succeeded")
    assert done["reason"] == "WorkersCompleted" and "2 workers exited 0" in done["message"]
    # cleanPodPolicy Running (the default): the pods still running are deleted.
    wait_for(lambda: not mlsched.pods("finisher"), 60, "the finished job's pods to go")


def test_a_worker_that_exits_non_zero_counts_toward_backoff_limit(api, mlsched, operator):
    core = client.CoreV1Api(api)
    _running_job(mlsched, "crasher", run_policy={"backoffLimit": 0})
    _exited(core, mlsched.namespace, "crasher-worker-1", 1)
    job = wait_for(lambda: phase(j := mlsched.job("crasher")) == "Failed" and j, 30,
                   "the job to fail", describe=lambda: (mlsched.job("crasher") or {}).get("status"))
    assert condition(job, "Failed")["reason"] == "BackoffLimitExceeded"
