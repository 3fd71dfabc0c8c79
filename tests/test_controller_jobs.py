"""MLJob handler contracts against the in-memory API: children, lifecycle and run policy,
bad objects, and pods pinned between rounds."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

from mlsched.controller.app import jobs, pod_events, pod_problems
from mlsched.controller.objects import lifecycle
from mlsched.controller.scheduling import loop
from mlsched.controller.objects.job_records import parse_job
from builders import (
    NOW, NS, cluster, create_jobs, make_runtime, pod, policy, ps_job, run,
)
from controller_steps import cond, scheduled, status, sync


def test_create_makes_a_headless_service_and_one_statefulset_per_role():
    rt, kube = make_runtime(cluster(2))
    kube.put(policy())
    run(create_jobs(rt, kube, ps_job("bert")))
    assert [s["metadata"]["name"] for s in kube.of_kind("Service")] == ["bert"]
    sts = {s["metadata"]["name"]: s for s in kube.of_kind("StatefulSet")}
    assert sorted(sts) == ["bert-ps", "bert-worker"]
    job_uid = kube.obj("MLJob", NS, "bert")["metadata"]["uid"]
    for s in sts.values():
        assert s["spec"]["replicas"] == 0  # the round decides how many
        assert s["metadata"]["ownerReferences"][0]["uid"] == job_uid
    st = status(kube, "bert")
    assert st["phase"] == "Pending" and st["observedGeneration"] == 1
    admitted = cond(kube, "bert", "Admitted")
    assert admitted.status == "False" and admitted.observed_generation == 1
    assert [e["reason"] for e in kube.events("bert")] == ["Created"]


def test_a_new_jobs_children_are_created_once_while_the_index_does_not_show_them_yet():
    """The creates answered before their watch events (bench_e2e, with more create slots):
    the lifecycle check after them took the index's word and created each StatefulSet a
    second time (a 409, then a read to see whose it was)."""
    rt, kube = make_runtime(cluster(2))
    kube.put(policy())
    stored = kube.put(ps_job("bert"))
    lagging = kube.indexes()  # taken before the creates, as the watch is behind them
    run(jobs.reconcile_children(rt, stored, lagging, {}))
    assert sorted(c[3] for c in kube.calls if c[:2] == ("create", "StatefulSet")) == [
        "bert-ps", "bert-worker"]
    assert not [c for c in kube.calls if c[:2] == ("get", "StatefulSet")]


def test_resume_makes_no_calls_when_children_exist():
    rt, kube = make_runtime(cluster(2))
    kube.put(policy())
    run(create_jobs(rt, kube, ps_job("bert")))
    kube.calls.clear()
    patch: dict = {}
    run(jobs.reconcile_children(rt, kube.obj("MLJob", NS, "bert"), kube.indexes(), patch))
    assert kube.writes() == [] and patch == {}


def test_a_resumed_operator_lists_services_once_per_namespace_and_writes_nothing():
    """A new process knows nothing of the Services it made: one metadata-only list of the
    namespace's Services answers for every job whose StatefulSets all exist."""
    _, kube = make_runtime(cluster(2))
    kube.put(policy())
    first, _ = make_runtime(kube)
    run(create_jobs(first, kube, *(ps_job(f"job-{i}") for i in range(5))))
    assert len(kube.of_kind("Service")) == 5
    resumed, _ = make_runtime(kube)
    kube.calls.clear()
    for i in range(5):
        patch: dict = {}
        run(jobs.reconcile_children(resumed, kube.obj("MLJob", NS, f"job-{i}"), kube.indexes(), patch))
        assert patch == {}
    assert [c for c in kube.writes() if c[0] != "dry-run"] == [
        ("list", "Service", NS, "mlsched.io/job-name")]  # (dry runs: preflight.py, once per template)


def test_an_operator_whose_rbac_cannot_list_services_resumes_as_before():
    """An operator upgraded before its RBAC (no `list` on services): a resumed job whose
    StatefulSets exist is taken to have its Service, as before, not failed every sweep."""
    _, kube = make_runtime(cluster(2))
    kube.put(policy())
    first, _ = make_runtime(kube)
    run(create_jobs(first, kube, ps_job("bert")))
    kube.failing[("list", "Service")] = 403
    resumed, _ = make_runtime(kube)
    kube.calls.clear()
    run(jobs.reconcile_if_needed(resumed, kube.obj("MLJob", NS, "bert"), kube.indexes()))
    assert [c for c in kube.writes() if c[0] not in ("dry-run", "patch-status")] == [
        ("list", "Service", NS, "mlsched.io/job-name")]
    assert resumed.jobs.books.reconciled.get((NS, "bert")) is not None
    assert "ChildrenNotCreated" not in [e["reason"] for e in kube.events("bert")]


def test_a_service_lost_between_the_statefulsets_and_it_is_created_on_resume():
    """The StatefulSets come first: an operator stopped before the Service was created leaves
    a job with all its StatefulSets and no Service. The next process creates it."""
    rt, kube = make_runtime(cluster(2))
    kube.put(policy())
    run(create_jobs(rt, kube, ps_job("bert")))
    run(kube.delete("Service", NS, "bert"))  # as if never created
    resumed, _ = make_runtime(kube)
    run(jobs.reconcile_children(resumed, kube.obj("MLJob", NS, "bert"), kube.indexes(), {}))
    assert [s["metadata"]["name"] for s in kube.of_kind("Service")] == ["bert"]
    assert any(e["message"].startswith("Service bert;") for e in kube.events("bert"))


def test_a_job_whose_service_cannot_be_created_gets_no_capacity_until_it_is():
    """The namespace's quota on `services` full: the job's StatefulSets exist (created first)
    but it is not admitted, since its pods would have no DNS names; when the Service can be
    created, its policy's admission runs."""
    rt, kube = make_runtime(cluster(4))
    kube.put(policy())
    kube.object_quota["Service"] = 0
    stored = kube.put(ps_job("bert"))
    try:
        run(jobs.reconcile_children(rt, stored, kube.indexes(), {}))
    except Exception as err:  # noqa: BLE001 - what the handler reports (WaitingForQuota)
        assert "ResourceQuota has room" in str(err)
    assert sorted(s["metadata"]["name"] for s in kube.of_kind("StatefulSet")) == ["bert-ps", "bert-worker"]
    assert rt.scheduling.services.refused(jobs.job_record(stored))
    assert run(loop.run_policy_admission(rt, kube.obj("SchedulingPolicy", NS, "default"),
                                         kube.indexes(), now=NOW)) is None
    assert all(s["spec"]["replicas"] == 0 for s in kube.of_kind("StatefulSet"))
    del kube.object_quota["Service"]
    run(jobs.reconcile_children(rt, kube.obj("MLJob", NS, "bert"), kube.indexes(), {}))
    assert [s["metadata"]["name"] for s in kube.of_kind("Service")] == ["bert"]
    assert "admission" in rt.scheduling.wakeups.peek((NS, "default"))
    report = run(loop.run_policy_admission(rt, kube.obj("SchedulingPolicy", NS, "default"),
                                           kube.indexes(), now=NOW + 1))
    assert report is not None and report.targets["bert"].count("worker") >= 1


def test_a_service_deleted_by_hand_comes_back_at_once_and_a_deleted_jobs_stays_gone():
    """`kubectl delete service bert` took the pods' DNS names with it (peers stop finding each
    other): nothing made it again before. The Service of a deleted job goes with the job
    (garbage collection) and is not made again, also while the index still shows the job."""
    rt, kube = scheduled()
    deleted = kube.obj("Service", NS, "bert")
    run(kube.delete("Service", NS, "bert"))
    assert run(pod_events.on_service_deleted(rt, deleted, kube.indexes()))
    assert [s["metadata"]["name"] for s in kube.of_kind("Service")] == ["bert"]
    restored = [e for e in kube.events("bert") if e["reason"] == "Restored"]
    assert restored and restored[-1]["message"].startswith("Service bert was deleted")

    deleted, lagging = kube.obj("Service", NS, "bert"), kube.indexes()
    run(kube.delete("MLJob", NS, "bert"))  # its Service collected with it
    assert not run(pod_events.on_service_deleted(rt, deleted, lagging))
    assert not kube.of_kind("Service")


def test_a_service_that_could_not_be_made_again_is_retried_by_the_sweep_and_holds_nothing():
    """A failed re-creation is not the refusal that holds a new job from admission
    (services.py): the running job keeps its workers, and the next sweep tries again."""
    rt, kube = scheduled()
    workers = kube.obj("StatefulSet", NS, "bert-worker")["spec"]["replicas"]
    deleted = kube.obj("Service", NS, "bert")
    run(kube.delete("Service", NS, "bert"))
    kube.failing[("create", "bert")] = 503
    assert not run(pod_events.on_service_deleted(rt, deleted, kube.indexes()))
    assert not kube.of_kind("Service") and not rt.scheduling.services.refused(jobs.job_record(
        kube.obj("MLJob", NS, "bert")))
    run(loop.run_policy_round(rt, kube.obj("SchedulingPolicy", NS, "default"), kube.indexes(),
                              now=NOW + 3600))
    assert kube.obj("StatefulSet", NS, "bert-worker")["spec"]["replicas"] == workers
    del kube.failing[("create", "bert")]
    rt.jobs.books.job_bodies[(NS, "bert")] = kube.obj("MLJob", NS, "bert")  # as its watch events keep it
    run(jobs.sweep(rt, kube.indexes()))
    assert [s["metadata"]["name"] for s in kube.of_kind("Service")] == ["bert"]
    assert "Restored" in [e["reason"] for e in kube.events("bert")]


def test_a_service_deleted_while_the_watches_were_down_is_restored_once_they_are_listed_again():
    """No DELETED event reaches the operator for a Service deleted during an API server outage;
    the watches' listing again (relists.py) makes it ask, and the sweep restores it. The job's
    pods used to lose their peers' DNS names for good."""
    rt, kube = scheduled()
    run(kube.delete("Service", NS, "bert"))  # the watch was down: no event
    rt.jobs.books.job_bodies[(NS, "bert")] = kube.obj("MLJob", NS, "bert")  # as its watch events keep it
    run(jobs.sweep(rt, kube.indexes()))
    assert not kube.of_kind("Service")  # nothing said it went
    rt.scheduling.services.relisted()
    run(jobs.sweep(rt, kube.indexes()))
    assert [s["metadata"]["name"] for s in kube.of_kind("Service")] == ["bert"]
    assert "Restored" in [e["reason"] for e in kube.events("bert")]


def test_deleting_the_job_collects_its_children():
    rt, kube = scheduled()
    assert kube.of_kind("Pod")
    run(kube.delete("MLJob", NS, "bert"))
    assert not kube.of_kind("StatefulSet") and not kube.of_kind("Service") and not kube.of_kind("Pod")


def test_round_then_lifecycle_reaches_running():
    rt, kube = scheduled()
    pods = kube.of_kind("Pod")
    assert pods and all(p["spec"]["nodeName"] and not p["spec"]["schedulingGates"] for p in pods)
    sync(rt, kube, "bert")
    st = status(kube, "bert")
    assert st["phase"] == "Running" and st["startTime"]
    assert st["replicaStatuses"]["worker"]["ready"] == st["replicaStatuses"]["worker"]["desired"] > 0
    assert cond(kube, "bert", "Admitted").status == "True"
    # A second tick with nothing new writes nothing.
    assert not sync(rt, kube, "bert").changed


def test_suspend_scales_to_zero_and_resume_waits_for_the_next_round():
    rt, kube = scheduled()
    sync(rt, kube, "bert")
    run(kube.patch("MLJob", NS, "bert", {"spec": {"runPolicy": {"suspend": True}}}))
    patch: dict = {}
    run(jobs.reconcile_children(rt, kube.obj("MLJob", NS, "bert"), kube.indexes(), patch))
    run(kube.patch("MLJob", NS, "bert", patch, status=True))
    kube.settle()
    assert all(s["spec"]["replicas"] == 0 for s in kube.of_kind("StatefulSet"))
    assert not kube.of_kind("Pod")
    assert status(kube, "bert")["phase"] == "Suspended"
    assert cond(kube, "bert", "Suspended").status == "True"
    # The scheduling loop leaves a suspended job alone.
    report = run(loop.run_policy_round(rt, kube.obj("SchedulingPolicy", NS, "default"), kube.indexes(), now=NOW + 60))
    assert "bert" not in report.targets
    run(kube.patch("MLJob", NS, "bert", {"spec": {"runPolicy": {"suspend": False}}}))
    sync(rt, kube, "bert")
    assert status(kube, "bert")["phase"] == "Pending"
    resumed = cond(kube, "bert", "Suspended")
    assert (resumed.status, resumed.reason) == ("False", "Resumed")


def test_backoff_limit_fails_the_job_and_cleans_up_pods():
    rt, kube = scheduled(run_policy={"backoffLimit": 2})
    sync(rt, kube, "bert")
    for p in kube.of_kind("Pod")[:1]:
        p["status"]["containerStatuses"] = [{"name": "w", "restartCount": 3}]
    sync(rt, kube, "bert")
    st = status(kube, "bert")
    assert st["phase"] == "Failed" and st["completionTime"]
    failed = cond(kube, "bert", "Failed")
    assert failed.reason == "BackoffLimitExceeded"
    assert all(s["spec"]["replicas"] == 0 for s in kube.of_kind("StatefulSet"))  # cleanPodPolicy Running
    assert any(e["type"] == "Warning" and e["reason"] == "BackoffLimitExceeded" for e in kube.events("bert"))
    # Failures of a pod that was replaced keep counting.
    assert rt.scheduling.failures.total((NS, "bert")) == 3


def test_a_job_failed_by_its_backoff_limit_names_the_container_and_its_exit_code():
    """What a user reads in `kubectl describe mljob`: which container exited with which code,
    not only how many failures there were."""
    rt, kube = scheduled(run_policy={"backoffLimit": 1})
    sync(rt, kube, "bert")
    worker = next(p for p in kube.of_kind("Pod") if "-worker-" in p["metadata"]["name"])
    worker["status"]["containerStatuses"] = [{
        "name": "trainer", "restartCount": 2, "state": {"waiting": {"reason": "CrashLoopBackOff"}},
        "lastState": {"terminated": {"exitCode": 3, "reason": "Error"}}}]
    sync(rt, kube, "bert")
    failed = cond(kube, "bert", "Failed")
    assert failed.reason == "BackoffLimitExceeded"
    name = worker["metadata"]["name"]
    assert failed.message == (f"2 pod failures, backoffLimit=1; the last: pod {name}: container "
                              "trainer exited with code 3 (Error)"), failed.message
    warning = [e for e in kube.events("bert") if e["reason"] == "BackoffLimitExceeded"]
    assert warning and "exited with code 3" in warning[0]["message"]


def test_active_deadline_fails_with_deadline_exceeded():
    rt, kube = scheduled(run_policy={"activeDeadlineSeconds": 60})
    start = datetime.now(UTC).replace(microsecond=0)
    sync(rt, kube, "bert", now=start)
    sync(rt, kube, "bert", now=start + timedelta(seconds=61))
    assert status(kube, "bert")["phase"] == "Failed"
    assert cond(kube, "bert", "Failed").reason == "DeadlineExceeded"


def test_epochs_reached_succeeds_keeps_pods_with_clean_pod_policy_none_then_ttl_deletes():
    rt, kube = scheduled(run_policy={"cleanPodPolicy": "None", "ttlSecondsAfterFinished": 30})
    kube.obj("MLJob", NS, "bert")["status"]["progress"] = {"epochsDone": 100.0}
    t0 = datetime.now(UTC).replace(microsecond=0)
    out = sync(rt, kube, "bert", now=t0)
    assert status(kube, "bert")["phase"] == "Succeeded" and not out.scale_to_zero
    assert cond(kube, "bert", "Succeeded").reason == "EpochsReached"
    assert kube.of_kind("Pod")  # None: pods stay
    assert not sync(rt, kube, "bert", now=t0 + timedelta(seconds=10)).delete_job
    sync(rt, kube, "bert", now=t0 + timedelta(seconds=31))
    assert ("MLJob", NS, "bert") not in kube.objects
    assert not kube.of_kind("StatefulSet")


def test_clean_pod_policy_all_scales_down_on_success():
    rt, kube = scheduled(run_policy={"cleanPodPolicy": "All"})
    kube.obj("MLJob", NS, "bert")["status"]["progress"] = {"epochsDone": 100.0}
    sync(rt, kube, "bert")
    kube.settle()
    assert not kube.of_kind("Pod")


def test_missing_policy_is_reported():
    rt, kube = make_runtime(cluster(1))
    run(create_jobs(rt, kube, ps_job("bert", policy="nonexistent")))
    admitted = cond(kube, "bert", "Admitted")
    assert admitted.reason == "PolicyNotFound"
    assert admitted.message == "SchedulingPolicy 'nonexistent' does not exist in this namespace"
    # A Warning Event, once: the user must act (create the policy or fix the name).
    warnings = [e for e in kube.events("bert") if e["type"] == "Warning"]
    assert [e["reason"] for e in warnings] == ["PolicyNotFound"]
    sync(rt, kube, "bert")
    assert len([e for e in kube.events("bert") if e["type"] == "Warning"]) == 1


def test_bad_mljob_is_reported_and_does_not_stall_the_others():
    rt, kube = make_runtime(cluster(2))
    kube.put(policy())
    bad = ps_job("broken")
    bad["spec"]["replicaSpecs"]["worker"].update(min=5, max=2)  # CEL would refuse; an old CRD may not
    run(create_jobs(rt, kube, bad, ps_job("good")))
    st = status(kube, "broken")
    assert st["phase"] == "Failed"
    failed = cond(kube, "broken", "Failed")
    assert failed.reason == "InvalidSpec" and "replicaSpecs.worker.max" in failed.message
    assert [e["reason"] for e in kube.events("broken")] == ["InvalidSpec"]
    assert not any(s["metadata"]["name"].startswith("broken") for s in kube.of_kind("StatefulSet"))
    report = run(loop.run_policy_round(rt, kube.obj("SchedulingPolicy", NS, "default"), kube.indexes(), now=NOW))
    assert "broken" not in report.targets and report.targets["good"].count("worker") > 0
    # Fixing the spec clears the failure.
    run(kube.patch("MLJob", NS, "broken", {"spec": {"replicaSpecs": {"worker": {"min": 1}}}}))
    sync(rt, kube, "broken")
    assert status(kube, "broken")["phase"] == "Pending"
    assert cond(kube, "broken", "Failed").status == "False"


def test_lifecycle_is_stable_for_an_unchanged_job():
    spec = parse_job(ps_job("bert") | {"metadata": {"name": "bert"}}).spec
    now = datetime(2024, 1, 1, tzinfo=UTC)
    first = lifecycle.evaluate(spec, 3, {}, lifecycle.Observed(now=now))
    again = lifecycle.evaluate(spec, 3, first.status, lifecycle.Observed(now=now + timedelta(hours=1)))
    assert first.changed and not again.changed and not again.events


def test_a_gated_pod_created_between_rounds_is_pinned_once():
    rt, kube = make_runtime(cluster(2))
    rt.scheduling.placements.set((NS, "bert"), {"ps": ("node-1",), "worker": ("node-0",)})
    late = pod("bert", "worker", 0, gated=True, phase="Pending")
    kube.put(late)
    run(pod_events.on_pod_event(rt, "ADDED", late, kube.indexes()))
    run(pod_events.on_pod_event(rt, "MODIFIED", late, kube.indexes()))  # stale event: no second patch
    spec = kube.obj("Pod", NS, "bert-worker-0")["spec"]
    assert spec["nodeSelector"] == {"kubernetes.io/hostname": "node-0"} and spec["schedulingGates"] == []
    assert [c[0] for c in kube.writes()] == ["patch"]


def test_a_gated_pod_without_a_decision_stays_gated():
    rt, kube = make_runtime(cluster(1))
    late = kube.put(pod("bert", "worker", 5, gated=True, phase="Pending"))
    run(pod_events.on_pod_event(rt, "ADDED", late, kube.indexes()))
    assert kube.writes() == []


def test_after_a_restart_pods_are_pinned_from_the_status_placement():
    rt, kube = make_runtime(cluster(2))
    job = ps_job("bert")
    job["status"] = {"placement": {"ps": ["node-1"], "worker": ["node-0"]}}
    kube.put(job)
    late = kube.put(pod("bert", "ps", 0, gated=True, phase="Pending"))
    run(pod_events.on_pod_event(rt, "ADDED", late, kube.indexes()))
    assert kube.obj("Pod", NS, "bert-ps-0")["spec"]["nodeSelector"] == {"kubernetes.io/hostname": "node-1"}


def test_a_template_the_api_server_refuses_fails_the_job_until_fixed():
    rt, kube = make_runtime(cluster(1))
    kube.put(policy())
    kube.failing[("create", "bert-worker")] = 422
    run(create_jobs(rt, kube, ps_job("bert")))  # no exception: nothing for kopf to retry
    failed = cond(kube, "bert", "Failed")
    assert status(kube, "bert")["phase"] == "Failed" and failed.reason == "InvalidSpec"
    assert "refused" in failed.message and "injected failure" in failed.message
    assert any(e["type"] == "Warning" for e in kube.events("bert"))
    # It gets no tasks, and timer ticks retry nothing until the spec is edited.
    report = run(loop.run_policy_round(rt, kube.obj("SchedulingPolicy", NS, "default"), kube.indexes(), now=NOW))
    assert "bert" not in report.targets
    kube.calls.clear()
    assert not sync(rt, kube, "bert").changed and kube.writes() == []
    # An edit the server accepts brings the job back to Pending.
    del kube.failing[("create", "bert-worker")]
    run(kube.patch("MLJob", NS, "bert", {"spec": {"epochs": 90}}))
    patch: dict = {}
    run(jobs.reconcile_children(rt, kube.obj("MLJob", NS, "bert"), kube.indexes(), patch))
    run(kube.patch("MLJob", NS, "bert", patch, status=True))
    assert status(kube, "bert")["phase"] == "Pending"
    assert {s["metadata"]["name"] for s in kube.of_kind("StatefulSet")} == {"bert-ps", "bert-worker"}


def test_transient_api_errors_are_left_to_kopf_to_retry():
    import pytest
    from mlsched.controller.kube.kube import KubeError

    rt, kube = make_runtime(cluster(1))
    kube.failing[("create", "bert")] = 503
    body = kube.put(ps_job("bert"))
    with pytest.raises(KubeError):
        run(jobs.reconcile_children(rt, body, kube.indexes(), {}))


def test_the_lifecycle_sweep_lets_the_event_loop_turn_while_it_checks_thousands_of_jobs(monkeypatch):
    """Gathered all at once, a sweep of thousands of jobs ran back to back before the loop
    polled its sockets: watch events, admissions and /healthz waited for all of it (a 10 s
    stall with 2,000 jobs in bench_e2e). In batches, other tasks run in between. (Ten batches
    of 5 here: what is checked, a turn of the loop per batch, does not depend on their size.)"""
    import asyncio

    monkeypatch.setattr(jobs, "SWEEP_BATCH", 5)
    rt, kube = make_runtime(cluster(4))
    kube.put(policy())
    n = 10 * jobs.SWEEP_BATCH

    async def scenario():
        for i in range(n):  # as the watch delivers them
            await jobs.on_job_event(rt, "ADDED", kube.put(ps_job(f"job-{i:03d}")), kube.indexes())
        assert len(rt.jobs.books.job_bodies) == n
        turns = 0

        async def ticker():
            nonlocal turns
            while True:
                turns += 1
                await asyncio.sleep(0)

        ticking = asyncio.create_task(ticker())
        await asyncio.sleep(0)
        turns = 0
        await jobs.sweep(rt, kube.indexes())
        ticking.cancel()
        return turns

    assert run(scenario()) >= n // jobs.SWEEP_BATCH


def test_pods_the_api_server_refuses_to_create_are_reported(monkeypatch):
    """A StatefulSet short of its pods (a missing ServiceAccount, Pod Security, a webhook)
    says why only in its FailedCreate Events: after a grace period the job shows it."""
    rt, kube = make_runtime(cluster(4))
    kube.put(policy())
    run(create_jobs(rt, kube, ps_job("bert")))
    run(loop.run_policy_round(rt, kube.obj("SchedulingPolicy", NS, "default"), kube.indexes(), now=NOW))
    # The StatefulSet controller could create no pod: status.replicas stays 0.
    for sts in kube.of_kind("StatefulSet"):
        sts["status"] = {"replicas": 0, "readyReplicas": 0,
                         "observedGeneration": sts["metadata"]["generation"]}
    refusal = ('create Pod bert-worker-0 in StatefulSet bert-worker failed error: pods '
               '"bert-worker-0" is forbidden: error looking up service account '
               'team-a/mlsched-training: serviceaccount "mlsched-training" not found')
    kube.put({"apiVersion": "v1", "kind": "Event", "type": "Warning", "reason": "FailedCreate",
              "message": refusal, "metadata": {"name": "bert-worker.1", "namespace": NS},
              "involvedObject": {"kind": "StatefulSet", "name": "bert-worker", "namespace": NS}})
    clock = [1000.0]
    monkeypatch.setattr(jobs.time, "monotonic", lambda: clock[0])
    sync(rt, kube, "bert")
    assert cond(kube, "bert", "Running").reason == "PodsStarting"  # within the grace period
    assert not [c for c in kube.calls if c[:2] == ("list", "Event")]
    clock[0] += pod_problems.REFUSAL_GRACE_S
    sync(rt, kube, "bert")
    running = cond(kube, "bert", "Running")
    assert running.reason == "PodsRefused" and status(kube, "bert")["phase"] == "Pending"
    assert running.message == f"the API server refuses to create its pods: bert-worker: {refusal}"
    warnings = [e for e in kube.events("bert") if e["type"] == "Warning"]
    assert [e["reason"] for e in warnings] == ["PodsRefused"]
    # Once the pods exist, the report goes and nothing more is read.
    kube.settle()
    kube.calls.clear()
    sync(rt, kube, "bert")
    assert cond(kube, "bert", "Running").reason != "PodsRefused"
    assert not [c for c in kube.calls if c[:2] == ("list", "Event")] and not rt.pods.clocks.short_since


def test_a_statefulset_still_gaining_pods_is_not_asked_why_it_is_short(monkeypatch):
    """The StatefulSet controller creating a burst's pods slowly is not a refusal: its Events
    are read only once a StatefulSet has gained no pod for the grace period."""
    rt, kube = make_runtime(cluster(4))
    kube.put(policy())
    run(create_jobs(rt, kube, ps_job("bert", min_workers=3, max_workers=3)))
    run(loop.run_policy_round(rt, kube.obj("SchedulingPolicy", NS, "default"), kube.indexes(), now=NOW))
    worker = kube.obj("StatefulSet", NS, "bert-worker")
    assert worker["spec"]["replicas"] == 3
    clock = [1000.0]
    monkeypatch.setattr(jobs.time, "monotonic", lambda: clock[0])
    for created in (0, 1, 2):  # one more pod every grace period
        for sts in kube.of_kind("StatefulSet"):
            sts["status"] = {"replicas": min(created, sts["spec"]["replicas"]), "readyReplicas": 0,
                             "observedGeneration": sts["metadata"]["generation"]}
        sync(rt, kube, "bert")
        clock[0] += pod_problems.REFUSAL_GRACE_S
    assert not [c for c in kube.calls if c[:2] == ("list", "Event")]
    # Scaled again, and not yet acted on by the StatefulSet controller: waiting in its queue.
    run(kube.patch("StatefulSet", NS, "bert-worker", {"spec": {"replicas": 4}}))
    sync(rt, kube, "bert")
    clock[0] += pod_problems.REFUSAL_GRACE_S
    sync(rt, kube, "bert")
    assert not [c for c in kube.calls if c[:2] == ("list", "Event")]
    kube.obj("StatefulSet", NS, "bert-worker")["status"]["observedGeneration"] += 1
    sync(rt, kube, "bert")
    clock[0] += pod_problems.REFUSAL_GRACE_S
    sync(rt, kube, "bert")  # acted on, no pod for a grace period now: asked
    assert [c for c in kube.calls if c[:2] == ("list", "Event")]


def test_pods_the_watch_has_seen_count_before_the_statefulset_status_does(monkeypatch):
    """The StatefulSet controller's status counts the pods it had seen when its sync began:
    right after creating them it still shows none, for as long as it takes to sync again
    (seconds in a burst). The pods the operator's own watch has seen count."""
    rt, kube = make_runtime(cluster(4))
    kube.put(policy())
    run(create_jobs(rt, kube, ps_job("bert", min_workers=2, max_workers=2)))
    run(loop.run_policy_round(rt, kube.obj("SchedulingPolicy", NS, "default"), kube.indexes(), now=NOW))
    kube.settle()  # the pods exist
    for sts in kube.of_kind("StatefulSet"):  # as the controller's first status said
        sts["status"] = {"replicas": 0, "readyReplicas": 0,
                         "observedGeneration": sts["metadata"]["generation"]}
    clock = [1000.0]
    monkeypatch.setattr(jobs.time, "monotonic", lambda: clock[0])
    for _ in range(3):
        sync(rt, kube, "bert")
        clock[0] += pod_problems.REFUSAL_GRACE_S
    assert not [c for c in kube.calls if c[:2] == ("list", "Event")]
    assert cond(kube, "bert", "Running").reason != "PodsRefused"


def test_a_running_job_short_of_pods_the_api_server_refuses_says_so(monkeypatch):
    """On its minimum with the rest refused (an admission webhook, say): Running, but not
    "AllRolesReady" as it used to, with a Warning Event naming the refusal."""
    rt, kube = make_runtime(cluster(4))
    kube.put(policy())
    run(create_jobs(rt, kube, ps_job("bert", min_workers=1, max_workers=4)))
    run(loop.run_policy_round(rt, kube.obj("SchedulingPolicy", NS, "default"), kube.indexes(), now=NOW))
    kube.settle()
    ps = kube.obj("StatefulSet", NS, "bert-ps")
    ps["status"] = {"replicas": ps["spec"]["replicas"], "readyReplicas": ps["spec"]["replicas"],
                    "observedGeneration": ps["metadata"]["generation"]}
    worker = kube.obj("StatefulSet", NS, "bert-worker")
    assert worker["spec"]["replicas"] >= 2
    worker["status"] = {"replicas": 1, "readyReplicas": 1,
                        "observedGeneration": worker["metadata"]["generation"]}
    for k in range(1, worker["spec"]["replicas"]):  # refused: never created
        del kube.objects[("Pod", NS, f"bert-worker-{k}")]
    for name in ("bert-ps-0", "bert-worker-0"):  # the minimum runs
        kube.obj("Pod", NS, name)["status"] = {
            "phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}
    kube.put({"apiVersion": "v1", "kind": "Event", "type": "Warning", "reason": "FailedCreate",
              "message": "admission webhook denied the request: at most 1 GPU pod per user",
              "metadata": {"name": "bert-worker.1", "namespace": NS},
              "involvedObject": {"kind": "StatefulSet", "name": "bert-worker", "namespace": NS}})
    clock = [1000.0]
    monkeypatch.setattr(jobs.time, "monotonic", lambda: clock[0])
    sync(rt, kube, "bert")
    clock[0] += pod_problems.REFUSAL_GRACE_S
    sync(rt, kube, "bert")
    running = cond(kube, "bert", "Running")
    assert status(kube, "bert")["phase"] == "Running" and running.status == "True"
    assert running.reason == "PodsRefused", running
    assert f"1/{worker['spec']['replicas']} worker ready;" in running.message
    assert running.message.endswith("at most 1 GPU pod per user")
    assert "PodsRefused" in [e["reason"] for e in kube.events("bert") if e["type"] == "Warning"]


def test_pods_no_scheduler_acts_on_are_reported(monkeypatch):
    """A template naming a scheduler that does not run here: the operator pins and ungates
    its pods, nothing binds them, and `kubectl get` keeps saying SchedulingGated. The job
    said PodsStarting forever while its GPUs stayed held; after the grace it is Unschedulable
    naming the scheduler, and the report goes once a scheduler binds the pods."""
    body = ps_job("bert", min_workers=1, max_workers=2)
    for role in body["spec"]["replicaSpecs"].values():
        role["template"]["spec"]["schedulerName"] = "volcano"
    rt, kube = make_runtime(cluster(4))
    kube.put(policy())
    run(create_jobs(rt, kube, body))
    run(loop.run_policy_round(rt, kube.obj("SchedulingPolicy", NS, "default"), kube.indexes(), now=NOW))
    kube.run_statefulsets()
    for p in kube.of_kind("Pod"):
        run(pod_events.on_pod_event(rt, "ADDED", p, kube.indexes()))
        p["status"] = {"phase": "Pending", "conditions": [{
            "type": "PodScheduled", "status": "False", "reason": "SchedulingGated",
            "message": "Scheduling is blocked due to non-empty scheduling gates"}]}
    pods = kube.of_kind("Pod")
    assert pods and all(not p["spec"].get("schedulingGates") and p["spec"]["nodeSelector"]
                        for p in pods)
    clock = [1000.0]
    monkeypatch.setattr(jobs.time, "monotonic", lambda: clock[0])
    sync(rt, kube, "bert")
    assert cond(kube, "bert", "Running").reason == "PodsStarting"
    clock[0] += rt.process.config.scheduler_grace_seconds
    sync(rt, kube, "bert")
    running = cond(kube, "bert", "Running")
    assert running.reason == "Unschedulable", running
    assert "its scheduler 'volcano' (spec.schedulerName) has not acted on it in 60 s" in \
        running.message, running.message
    assert "Unschedulable" in [e["reason"] for e in kube.events("bert") if e["type"] == "Warning"]
    kube.run_scheduler()  # it turns out to run after all
    sync(rt, kube, "bert")
    assert cond(kube, "bert", "Running").reason != "Unschedulable" and not rt.pods.clocks.unseen_since


def test_a_pod_held_by_a_gate_of_its_template_s_own_says_so(monkeypatch):
    """A template carrying another controller's scheduling gate: the operator removes only
    its own, and the pod waits for the other. That is no scheduler's fault: say which gate."""
    body = ps_job("bert", min_workers=1, max_workers=1)
    for role in body["spec"]["replicaSpecs"].values():
        role["template"]["spec"]["schedulingGates"] = [{"name": "example.com/quota-check"}]
    rt, kube = make_runtime(cluster(4))
    kube.put(policy())
    run(create_jobs(rt, kube, body))
    run(loop.run_policy_round(rt, kube.obj("SchedulingPolicy", NS, "default"), kube.indexes(), now=NOW))
    kube.run_statefulsets()
    for p in kube.of_kind("Pod"):
        run(pod_events.on_pod_event(rt, "ADDED", p, kube.indexes()))
    assert all(p["spec"]["schedulingGates"] == [{"name": "example.com/quota-check"}]
               for p in kube.of_kind("Pod"))
    clock = [1000.0]
    monkeypatch.setattr(jobs.time, "monotonic", lambda: clock[0])
    sync(rt, kube, "bert")
    clock[0] += rt.process.config.scheduler_grace_seconds
    sync(rt, kube, "bert")
    running = cond(kube, "bert", "Running")
    assert running.reason == "Unschedulable"
    assert "still carries the scheduling gate example.com/quota-check" in running.message


def test_pods_whose_containers_cannot_start_are_reported():
    """An image that cannot be pulled: the pods are bound and hold their GPUs, and never
    start. The job said PodsStarting for as long as that lasted."""
    rt, kube = scheduled()
    for p in kube.of_kind("Pod"):
        p["status"] = {"phase": "Pending", "containerStatuses": [{
            "name": "worker", "ready": False, "restartCount": 0, "state": {"waiting": {
                "reason": "ImagePullBackOff",
                "message": 'Back-off pulling image "registry.example.com/trainer:2.l"'}}}]}
    for sts in kube.of_kind("StatefulSet"):
        sts["status"] = {**sts["status"], "readyReplicas": 0}
    sync(rt, kube, "bert")
    running = cond(kube, "bert", "Running")
    assert running.reason == "PodsCannotStart" and status(kube, "bert")["phase"] == "Pending"
    assert running.message.startswith("pod bert-") and running.message.count("cannot start") == 1
    assert 'ImagePullBackOff: Back-off pulling image "registry.example.com/trainer:2.l"' in \
        running.message and "more pod" in running.message
    assert "PodsCannotStart" in [e["reason"] for e in kube.events("bert") if e["type"] == "Warning"]
    for p in kube.of_kind("Pod"):  # fixed: the image is there now
        p["status"] = {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}
    kube.settle()
    sync(rt, kube, "bert")
    assert cond(kube, "bert", "Running").reason == "AllRolesReady"


def test_pods_whose_volumes_cannot_be_mounted_are_reported(monkeypatch):
    """A ConfigMap volume whose ConfigMap does not exist: the kubelet never creates the
    containers, status only says `ContainerCreating`, and the pod's FailedMount Events say why.
    The job said PodsStarting for ever, its GPUs held. Now, after creating_grace_seconds, it says
    why; the Events are read once per CREATING_RECHECK_S, not every sweep."""
    clock = [1000.0]
    monkeypatch.setattr(jobs.time, "monotonic", lambda: clock[0])
    rt, kube = scheduled()
    for p in kube.of_kind("Pod"):
        p["status"] = {"phase": "Pending", "containerStatuses": [{
            "name": "worker", "ready": False, "restartCount": 0,
            "state": {"waiting": {"reason": "ContainerCreating"}}}]}
    for sts in kube.of_kind("StatefulSet"):
        sts["status"] = {**sts["status"], "readyReplicas": 0}
    stuck = sorted(p["metadata"]["name"] for p in kube.of_kind("Pod"))[0]
    mount = 'MountVolume.SetUp failed for volume "settings" : configmap "settngs" not found'
    kube.put({"apiVersion": "v1", "kind": "Event", "type": "Warning", "reason": "FailedMount",
              "message": mount, "metadata": {"name": f"{stuck}.1", "namespace": NS},
              "involvedObject": {"kind": "Pod", "name": stuck, "namespace": NS}})
    sync(rt, kube, "bert")
    assert cond(kube, "bert", "Running").reason == "PodsStarting"  # pulling an image takes time
    assert not [c for c in kube.calls if c[:2] == ("list", "Event")]
    clock[0] += rt.process.config.creating_grace_seconds
    sync(rt, kube, "bert")
    running = cond(kube, "bert", "Running")
    assert running.reason == "PodsCannotStart", running
    assert running.message == f"pod {stuck} cannot start: FailedMount: {mount}"
    assert "PodsCannotStart" in [e["reason"] for e in kube.events("bert") if e["type"] == "Warning"]
    sync(rt, kube, "bert")
    assert len([c for c in kube.calls if c[:2] == ("list", "Event")]) == 1
    for p in kube.of_kind("Pod"):  # the ConfigMap was created: the kubelet mounts it
        p["status"] = {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}
    kube.settle()
    sync(rt, kube, "bert")
    assert cond(kube, "bert", "Running").reason == "AllRolesReady"
    assert not rt.pods.clocks.creating_since and not rt.pods.clocks.creating_checks


def test_pods_whose_resource_claims_cannot_be_made_are_reported(monkeypatch):
    """Pods naming a ResourceClaimTemplate whose claims kube-controller-manager cannot make (a
    quota on claims, a webhook): kube-scheduler waits for the claims and says nothing, the
    pod's FailedResourceClaimCreation Events say why. They sat Pending for good while the job
    said AllRolesReady on its minimum (on the e2e plane) or PodsStarting; now, after
    CLAIMS_GRACE_S, PodsCannotStart quoting the Event, and kube-scheduler is not blamed."""
    clock = [1000.0]
    monkeypatch.setattr(jobs.time, "monotonic", lambda: clock[0])
    rt, kube = scheduled()
    names = sorted(p["metadata"]["name"] for p in kube.of_kind("Pod"))
    for p in kube.of_kind("Pod"):
        p["spec"].pop("nodeName", None)
        p["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}]
        p["status"] = {"phase": "Pending", "conditions": [
            {"type": "PodScheduled", "status": "False", "reason": "SchedulingGated"}]}
        if p["metadata"]["name"] != names[0]:
            p["status"]["resourceClaimStatuses"] = [
                {"name": "gpu", "resourceClaimName": p["metadata"]["name"] + "-gpu-x1"}]
    for sts in kube.of_kind("StatefulSet"):
        sts["status"] = {**sts["status"], "readyReplicas": 0}
    refused = ('PodResourceClaim gpu: create ResourceClaim : resourceclaims.resource.k8s.io '
               f'"{names[0]}-gpu-ab12c" is forbidden: exceeded quota: claims')
    kube.put({"apiVersion": "v1", "kind": "Event", "type": "Warning",
              "reason": "FailedResourceClaimCreation", "message": refused,
              "metadata": {"name": f"{names[0]}.1", "namespace": NS},
              "involvedObject": {"kind": "Pod", "name": names[0], "namespace": NS}})
    sync(rt, kube, "bert")
    assert cond(kube, "bert", "Running").reason == "PodsStarting"  # claims take a second
    clock[0] += pod_problems.CLAIMS_GRACE_S
    sync(rt, kube, "bert")
    running = cond(kube, "bert", "Running")
    assert running.reason == "PodsCannotStart", running
    assert running.message == f"pod {names[0]} cannot start: FailedResourceClaimCreation: {refused}"
    clock[0] += rt.process.config.scheduler_grace_seconds  # not "kube-scheduler has not acted on it"
    sync(rt, kube, "bert")
    assert cond(kube, "bert", "Running").reason == "PodsCannotStart"
    for p in kube.of_kind("Pod"):  # the quota raised: the claims are made, the pods run
        p["status"] = {"phase": "Running", "resourceClaimStatuses": [
            {"name": "gpu", "resourceClaimName": p["metadata"]["name"] + "-gpu-x1"}]}
    kube.settle()
    sync(rt, kube, "bert")
    assert cond(kube, "bert", "Running").reason == "AllRolesReady"
    assert not rt.pods.clocks.claims_since and not rt.pods.clocks.claims_checks


def test_a_running_job_whose_policy_is_deleted_says_nothing_re_decides_it():
    rt, kube = scheduled()
    sync(rt, kube, "bert")
    assert cond(kube, "bert", "Admitted").reason == "Allocated"
    del kube.objects[("SchedulingPolicy", NS, "default")]
    sync(rt, kube, "bert")
    admitted = cond(kube, "bert", "Admitted")
    assert admitted.status == "True" and admitted.reason == "PolicyNotFound"
    assert "kept: SchedulingPolicy 'default' does not exist" in admitted.message
    assert status(kube, "bert")["phase"] == "Running"  # its pods run on
    sync(rt, kube, "bert")
    warnings = [e["reason"] for e in kube.events("bert") if e["type"] == "Warning"]
    assert warnings == ["PolicyNotFound"]  # once
    kube.put(policy())
    sync(rt, kube, "bert")
    assert cond(kube, "bert", "Admitted").reason == "Allocated"


def test_an_admitted_job_still_starting_whose_policy_is_deleted_is_warned_once():
    rt, kube = make_runtime(cluster(4))
    kube.put(policy())
    run(create_jobs(rt, kube, ps_job("bert")))
    run(loop.run_policy_round(rt, kube.obj("SchedulingPolicy", NS, "default"), kube.indexes(), now=NOW))
    del kube.objects[("SchedulingPolicy", NS, "default")]
    sync(rt, kube, "bert")  # admitted, no pod ready yet: Pending
    assert cond(kube, "bert", "Running").reason == "PolicyNotFound"
    assert cond(kube, "bert", "Admitted").reason == "PolicyNotFound"
    assert [e["reason"] for e in kube.events("bert") if e["type"] == "Warning"] == ["PolicyNotFound"]


def reason_column(kube, name) -> str:
    """What `kubectl get mljobs` shows under REASON: the printer column's JSONPath (a filter on
    the conditions' type, then a field), evaluated on the stored object as the API server does."""
    import re

    from mlsched.api.mljob import CRD

    (column,) = [c for c in CRD.columns if c.name == "Reason"]
    match = re.fullmatch(r'\.status\.conditions\[\?\(@\.type=="(\w+)"\)\]\.(\w+)', column.json_path)
    assert match, f"the test reads only a condition-field column, not {column.json_path}"
    type_, field = match.groups()
    found = [c.get(field) for c in status(kube, name).get("conditions") or [] if c["type"] == type_]
    return found[0] if found else ""


def test_every_failed_job_shows_its_reason_in_kubectl_get():
    # backoffLimit
    rt, kube = scheduled(run_policy={"backoffLimit": 0})
    sync(rt, kube, "bert")
    kube.of_kind("Pod")[0]["status"]["containerStatuses"] = [{"name": "w", "restartCount": 1}]
    sync(rt, kube, "bert")
    assert (status(kube, "bert")["phase"], reason_column(kube, "bert")) == \
        ("Failed", "BackoffLimitExceeded")
    # activeDeadlineSeconds
    rt, kube = scheduled(run_policy={"activeDeadlineSeconds": 60})
    start = datetime.now(UTC).replace(microsecond=0)
    sync(rt, kube, "bert", now=start)
    sync(rt, kube, "bert", now=start + timedelta(seconds=61))
    assert (status(kube, "bert")["phase"], reason_column(kube, "bert")) == \
        ("Failed", "DeadlineExceeded")
    # A spec the operator cannot use, refused at creation (it used to show an empty REASON) ...
    rt, kube = make_runtime(cluster(2))
    kube.put(policy())
    bad = ps_job("broken")
    bad["spec"]["replicaSpecs"]["worker"].update(min=5, max=2)
    run(create_jobs(rt, kube, bad))
    assert (status(kube, "broken")["phase"], reason_column(kube, "broken")) == \
        ("Failed", "InvalidSpec")
    # ... and a running job whose template the API server refuses after an edit (it kept
    # AllRolesReady beside Failed).
    rt, kube = scheduled()
    sync(rt, kube, "bert")
    assert reason_column(kube, "bert") == "AllRolesReady"
    kube.failing[("create", "bert-worker")] = 422
    for sts in list(kube.of_kind("StatefulSet")):
        del kube.objects[("StatefulSet", NS, sts["metadata"]["name"])]
    run(kube.patch("MLJob", NS, "bert", {"spec": {"epochs": 90}}))
    sync(rt, kube, "bert")
    assert (status(kube, "bert")["phase"], reason_column(kube, "bert")) == \
        ("Failed", "InvalidSpec")


def test_a_job_created_with_its_policy_is_not_warned_and_a_missing_policy_clears_when_found():
    """`kubectl apply -k manifests/samples` creates the jobs a moment before their policies:
    no PolicyNotFound (condition, Warning) for that moment; and a job that did say
    PolicyNotFound says the policy was found when it comes, and no condition keeps the cause."""
    rt, kube = make_runtime(cluster(4))
    created = datetime.now(UTC).replace(microsecond=0)
    job = ps_job("bert")
    job["metadata"]["creationTimestamp"] = created.strftime("%Y-%m-%dT%H:%M:%SZ")
    run(create_jobs(rt, kube, job))
    sync(rt, kube, "bert", now=created + timedelta(seconds=1))
    running = cond(kube, "bert", "Running")
    assert running.reason == "WaitingForPolicy" and "does not exist in this namespace yet" in \
        running.message
    assert cond(kube, "bert", "Admitted").reason == "WaitingForPolicy"
    assert not [e for e in kube.events("bert") if e["type"] == "Warning"]
    kube.put(policy())
    sync(rt, kube, "bert", now=created + timedelta(seconds=2))
    assert {c["reason"] for c in status(kube, "bert")["conditions"]} == {"WaitingForAllocation"}
    assert not [e for e in kube.events("bert") if e["type"] == "Warning"]

    # Missing past the grace: PolicyNotFound, warned once; then the policy comes.
    rt, kube = make_runtime(cluster(4))
    job = ps_job("bert")
    job["metadata"]["creationTimestamp"] = created.strftime("%Y-%m-%dT%H:%M:%SZ")
    run(create_jobs(rt, kube, job))
    late = created + timedelta(seconds=lifecycle.POLICY_GRACE_S)
    sync(rt, kube, "bert", now=late)
    assert cond(kube, "bert", "Running").reason == "PolicyNotFound"
    assert [e["reason"] for e in kube.events("bert") if e["type"] == "Warning"] == ["PolicyNotFound"]
    kube.put(policy())
    sync(rt, kube, "bert", now=late + timedelta(seconds=1))
    reasons = {c["reason"] for c in status(kube, "bert")["conditions"]}
    assert "PolicyNotFound" not in reasons, reasons
    found = [e for e in kube.events("bert") if e["reason"] == "PolicyFound"]
    assert [e["type"] for e in found] == ["Normal"]
    assert "SchedulingPolicy 'default' exists now" in found[0]["message"]
    sync(rt, kube, "bert", now=late + timedelta(seconds=2))
    assert len([e for e in kube.events("bert") if e["reason"] == "PolicyFound"]) == 1  # once


def _set_ready(kube, pod_name: str, ready: bool) -> None:
    kube.obj("Pod", NS, pod_name)["status"]["conditions"] = [
        {"type": "Ready", "status": "True" if ready else "False"}]


def test_a_pod_events_change_of_counts_waits_to_share_a_patch_and_a_phase_change_does_not(
        monkeypatch):
    """In a burst each pod turning Ready was a status patch of its own ("1/3 worker ready",
    six per job), and they held back the phase changes users wait for. A change of counts
    alone brought by a pod event now waits COUNTS_DELAY_S to be written with the next one; the
    phase turning Running is written at once."""
    rt, kube = scheduled(min_workers=2, max_workers=2)
    pods = sorted(p["metadata"]["name"] for p in kube.of_kind("Pod"))
    for name in pods:
        _set_ready(kube, name, False)
    run(jobs.sync_job(rt, kube.obj("MLJob", NS, "bert"), kube.indexes()))  # the sweep writes
    assert cond(kube, "bert", "Running").reason == "PodsStarting"
    assert status(kube, "bert")["replicaStatuses"]["worker"]["ready"] == 0

    def patches():
        return sum(1 for c in kube.calls if c[:2] == ("patch-status", "MLJob"))

    written = patches()
    *first, last = pods
    for name in first:  # each a change of counts alone: none written yet
        _set_ready(kube, name, True)
        run(jobs.sync_job(rt, kube.obj("MLJob", NS, "bert"), kube.indexes(), prompt=True))
    assert patches() == written
    assert status(kube, "bert")["replicaStatuses"]["worker"]["ready"] == 0
    # The wait over (none here), the counts are written.
    monkeypatch.setattr(jobs, "COUNTS_DELAY_S", 0.0)
    rt.jobs.books.counts_due.clear()
    for _ in range(2):  # the first starts the wait, the second finds it over
        run(jobs.sync_job(rt, kube.obj("MLJob", NS, "bert"), kube.indexes(), prompt=True))
    assert patches() == written + 1
    assert status(kube, "bert")["replicaStatuses"]["worker"]["ready"] == 1
    assert cond(kube, "bert", "Running").reason == "PodsStarting"
    monkeypatch.setattr(jobs, "COUNTS_DELAY_S", 60.0)
    _set_ready(kube, last, True)  # every pod Ready: Running, written at once
    run(jobs.sync_job(rt, kube.obj("MLJob", NS, "bert"), kube.indexes(), prompt=True))
    assert patches() == written + 2
    assert status(kube, "bert")["phase"] == "Running"
    assert status(kube, "bert")["replicaStatuses"]["worker"]["ready"] == 2
    assert {e["reason"] for e in kube.events("bert")} >= {"Running"}
    assert jobs.COUNTS_DELAY_S and not rt.jobs.books.counts_due  # written: nothing waits any more


def test_only_counts_tells_counts_from_phase_and_reason_changes():
    before = {"phase": "Pending", "replicaStatuses": {"worker": {"desired": 3, "ready": 1}},
              "conditions": [{"type": "Running", "status": "False", "reason": "PodsStarting",
                              "message": "1/3 worker ready"}]}
    counts = {"phase": "Pending", "replicaStatuses": {"worker": {"desired": 3, "ready": 2}},
              "conditions": [{"type": "Running", "status": "False", "reason": "PodsStarting",
                              "message": "2/3 worker ready"}]}
    assert lifecycle.only_counts(before, counts)
    assert not lifecycle.only_counts(before, {**counts, "phase": "Running"})
    assert not lifecycle.only_counts(before, {**counts, "conditions": [
        {"type": "Running", "status": "True", "reason": "AllRolesReady"}]})
    assert not lifecycle.only_counts(before, {**counts, "startTime": "2026-11-29T00:00:00Z"})


def test_a_watch_body_from_before_the_running_patch_does_not_make_the_job_running_twice():
    """In a burst the MLJob watch delivers bodies seconds after the operator's own status
    patches. Such a body, kept as the job's latest, made the lifecycle decide `Running` again:
    a second Running Event and status patch (bench_e2e, issue 55)."""
    rt, kube = scheduled()
    key = (NS, "bert")
    stale = kube.obj("MLJob", NS, "bert")  # before its lifecycle saw the pods Ready
    run(jobs.on_job_event(rt, "MODIFIED", stale, kube.indexes()))

    async def evaluate() -> None:
        await jobs.sync_job(rt, rt.jobs.books.job_bodies[key], kube.indexes())
        await rt.writers.events.settled()

    run(evaluate())
    assert status(kube, "bert")["phase"] == "Running"
    assert [e["reason"] for e in kube.events("bert")].count("Running") == 1
    patches = len([c for c in kube.calls if c[:2] == ("patch-status", "MLJob")])
    run(jobs.on_job_event(rt, "MODIFIED", stale, kube.indexes()))  # the late echo
    run(evaluate())
    assert [e["reason"] for e in kube.events("bert")].count("Running") == 1
    assert len([c for c in kube.calls if c[:2] == ("patch-status", "MLJob")]) == patches > 0
    # Its own echo shows the patch: from then on the watch's bodies are taken as they are.
    run(jobs.on_job_event(rt, "MODIFIED", kube.obj("MLJob", NS, "bert"), kube.indexes()))
    assert not rt.jobs.written_status


def test_the_lifecycles_events_do_not_hold_up_its_status_patch():
    """Events go out through the create slots after a burst's StatefulSets: the job's phase
    used to be written only once its Running Event had been created (up to 10 s late)."""
    rt, kube = scheduled()
    key = (NS, "bert")
    run(jobs.on_job_event(rt, "MODIFIED", kube.obj("MLJob", NS, "bert"), kube.indexes()))
    posted = asyncio.Event()  # never set while the status is written: Event creates hang
    create = kube.create

    async def slow_create(body):
        if body["kind"] == "Event":
            await posted.wait()
        return await create(body)

    kube.create = slow_create

    async def evaluate() -> None:
        await asyncio.wait_for(jobs.sync_job(rt, rt.jobs.books.job_bodies[key], kube.indexes()), 5)
        assert status(kube, "bert")["phase"] == "Running"
        assert "Running" not in [e["reason"] for e in kube.events("bert")]
        posted.set()
        await rt.writers.events.settled()

    run(evaluate())
    assert [e["reason"] for e in kube.events("bert")].count("Running") == 1


def test_a_watch_body_arriving_while_the_running_patch_is_out_does_not_make_it_running_twice():
    rt, kube = scheduled()
    key = (NS, "bert")
    stale = kube.obj("MLJob", NS, "bert")
    run(jobs.on_job_event(rt, "MODIFIED", stale, kube.indexes()))
    patch = kube.patch

    async def patch_meanwhile(kind, namespace, name, body, **kw):
        if kind == "MLJob" and kw.get("status"):  # the watch delivers an older body now
            await jobs.on_job_event(rt, "MODIFIED", stale, kube.indexes())
        return await patch(kind, namespace, name, body, **kw)

    kube.patch = patch_meanwhile

    async def evaluate() -> None:
        await jobs.sync_job(rt, rt.jobs.books.job_bodies[key], kube.indexes())
        await rt.writers.events.settled()

    run(evaluate())
    run(evaluate())
    assert status(kube, "bert")["phase"] == "Running"
    assert [e["reason"] for e in kube.events("bert")].count("Running") == 1


def test_a_job_marked_due_during_its_evaluation_is_evaluated_once_after_it():
    """It used to be marked due again at once, and again every 0.3 s until the evaluation
    under way ended: 13,789 evaluations that did nothing in a 300-job burst (bench_e2e)."""
    rt, kube = scheduled()
    key = (NS, "bert")
    run(jobs.on_job_event(rt, "MODIFIED", kube.obj("MLJob", NS, "bert"), kube.indexes()))
    patch = kube.patch
    answered, out = asyncio.Event(), asyncio.Event()

    async def slow_patch(kind, namespace, name, body, **kw):
        if kind == "MLJob" and kw.get("status"):
            out.set()
            await answered.wait()
        return await patch(kind, namespace, name, body, **kw)

    kube.patch = slow_patch

    async def meanwhile() -> list:
        rt.jobs.due._due.clear()
        first = asyncio.create_task(jobs.sync_job(rt, rt.jobs.books.job_bodies[key], kube.indexes()))
        await asyncio.wait_for(out.wait(), 10)  # its status patch is out
        assert key in rt.jobs.books.syncing
        again = await jobs.sync_job(rt, rt.jobs.books.job_bodies[key], kube.indexes(), prompt=True)
        due_before = list(rt.jobs.due._due)
        answered.set()
        await first
        return [again, due_before, list(rt.jobs.due._due)]

    again, due_before, due_after = run(meanwhile())
    assert again is False and due_before == [] and due_after == [key] and not rt.jobs.books.syncing
