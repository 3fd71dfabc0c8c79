"""A job's phase follows its pods, not the lifecycle sweep, in a burst too (issue 55).

300 small MLJobs created at once. Two watches, on the same clock, see each job's pods turn
Ready and the job turn `Running`. The operator runs with its lifecycle sweep every 600 s, so
only the jobs' own pod events can make them Running in time: every job must be Running within
FOLLOW_S of its pods (the check), and the spread is printed (the figure: p50 0.13-0.17 s, p99
2.2-3.0 s over four runs on 2 cores shared with the whole control plane; 2.4-9.7 s over eleven
before the late watch bodies and status tiers of docs/e2e.md; issue 55 asks p99 <= 5 s). A
wall-clock p99 is not asserted: the machine's noise decides it, not the operator. Each job
has one `Running` Event.
Before, the phase came only from the sweep (every --job-sync-seconds, 10 by default): with it
every 600 s no job turns Running within the test's wait. And Ready pods were counted from the
StatefulSets' status, which the StatefulSet controller updates late in a burst (it writes at
20 requests/s by default): with that count, p50 41 s and p99 56 s here even with the sweep
every second and the pod events marking jobs due."""

from __future__ import annotations

import copy
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from kubernetes import client, watch

from mlsched_objects import JOB_LABEL, mljob, scheduling_policy
from waiting import wait_for

BURST = 300
FOLLOW_S = 30.0  # far above any p99 measured, far below the sweep's 600 s
SMALL = {"cpu": "100m", "memory": "128Mi"}


def _small_job(name: str) -> dict:
    job = mljob(name, ps=None, workers=(1, 1))
    container = job["spec"]["replicaSpecs"]["worker"]["template"]["spec"]["containers"][0]
    container["resources"] = {"requests": dict(SMALL), "limits": dict(SMALL)}
    return job


class Seen:
    """When (the test's monotonic clock) each pod was first seen Ready and each job Running."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.pod_ready: dict[str, dict[str, float]] = {}  # job -> pod -> when
        self.running: dict[str, float] = {}
        self.stop = threading.Event()

    def watch_pods(self, core: client.CoreV1Api, namespace: str) -> None:
        w = watch.Watch()
        while not self.stop.is_set():
            for event in w.stream(core.list_namespaced_pod, namespace, timeout_seconds=5,
                                  label_selector=JOB_LABEL):
                pod = event["object"]
                ready = any(c.type == "Ready" and c.status == "True"
                            for c in (pod.status.conditions or []))
                if ready:
                    job = pod.metadata.labels[JOB_LABEL]
                    with self.lock:
                        self.pod_ready.setdefault(job, {}).setdefault(pod.metadata.name,
                                                                      time.monotonic())
                if self.stop.is_set():
                    return

    def watch_jobs(self, custom: client.CustomObjectsApi, namespace: str) -> None:
        w = watch.Watch()
        while not self.stop.is_set():
            for event in w.stream(custom.list_namespaced_custom_object, "mlsched.io", "v1alpha1",
                                  namespace, "mljobs", timeout_seconds=5):
                job = event["object"]
                if (job.get("status") or {}).get("phase") == "Running":
                    with self.lock:
                        self.running.setdefault(job["metadata"]["name"], time.monotonic())
                if self.stop.is_set():
                    return


def test_a_burst_of_jobs_turns_running_within_seconds_of_their_pods(api, mlsched,
                                                                    start_operator):
    # The sweep out of the way (600 s): only pod events can make the jobs Running. Rounds
    # every 60 s (the e2e's 6 s rewrite 300 status records each round, a load no real
    # interval makes).
    start_operator(job_sync_seconds=600.0, interval_scale=0.05)
    mlsched.create(scheduling_policy("default", allocation="drf"))
    seen = Seen()
    watchers = [threading.Thread(target=seen.watch_pods, args=(client.CoreV1Api(api),
                                                                mlsched.namespace), daemon=True),
                threading.Thread(target=seen.watch_jobs, args=(client.CustomObjectsApi(api),
                                                                mlsched.namespace), daemon=True)]
    for thread in watchers:
        thread.start()
    time.sleep(1)  # the watches are open before the first job
    names = [f"burst-{i:03d}" for i in range(BURST)]
    created = time.monotonic()
    with ThreadPoolExecutor(20) as pool:
        list(pool.map(lambda n: mlsched.create(copy.deepcopy(_small_job(n))), names))
    print(f"{BURST} MLJobs created in {time.monotonic() - created:.1f} s")
    try:
        # Both sides seen for every job: the test's pod watch may run behind the operator's
        # (a job seen Running before its pod was seen Ready here).
        wait_for(lambda: len(seen.running) == BURST and all(seen.pod_ready.get(n) for n in names),
                 300, "every job of the burst to be Running",
                 describe=lambda: f"{len(seen.running)} Running, "
                                  f"{sum(1 for j in seen.pod_ready.values() if j)} with a pod Ready")
    finally:
        seen.stop.set()
    with seen.lock:
        lags = sorted(seen.running[n] - max(seen.pod_ready[n].values()) for n in names)
    p50, p99 = lags[len(lags) // 2], lags[int(0.99 * (len(lags) - 1))]
    print(f"pods Ready -> job Running over {BURST} jobs: p50 {p50:.2f} s, p99 {p99:.2f} s, "
          f"max {lags[-1]:.2f} s; last job Running {max(seen.running.values()) - created:.1f} s "
          f"after the burst began")
    try:
        assert lags[-1] <= FOLLOW_S, (p50, p99, lags[-10:])
        # And none Running before its pods were Ready, by the API server's own timestamps
        # (to the second): the two watches here may deliver a second or more apart under
        # load, so their arrival times cannot say which came first.
        ready_at: dict[str, str] = {}
        for pod in mlsched.pods():
            for c in pod.status.conditions or ():
                if c.type == "Ready" and c.status == "True":
                    job = pod.metadata.labels[JOB_LABEL]
                    ready_at[job] = max(ready_at.get(job, ""), c.last_transition_time.isoformat())
        for body in mlsched.jobs():
            running = next(c for c in body["status"]["conditions"] if c["type"] == "Running")
            name = body["metadata"]["name"]
            assert running["status"] == "True", body["status"]
            assert running["lastTransitionTime"].replace("Z", "+00:00") >= ready_at[name], \
                (name, running, ready_at[name])
        # One `Running` Event per job, as `kubectl describe mljob` shows them: a watch body
        # from before the operator's own status patch, arriving late in the burst, made most
        # jobs Running twice (two Events, two patches).
        events = client.CoreV1Api(api).list_namespaced_event(
            mlsched.namespace, field_selector="reason=Running,involvedObject.kind=MLJob").items
        per_job: dict[str, int] = {}
        for event in events:
            per_job[event.involved_object.name] = per_job.get(event.involved_object.name, 0) + 1
        twice = {name: n for name, n in per_job.items() if n != 1}
        assert not twice and len(per_job) == BURST, (len(per_job), sorted(twice.items())[:10])
    finally:  # the 300 jobs' children in two calls, not the garbage collector's 600
        mlsched.delete_all_now()
        wait_for(lambda: not mlsched.pods(), 300, "the burst's pods to be deleted",
                 describe=lambda: len(mlsched.pods()))
