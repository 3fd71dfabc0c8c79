"""Work conservation in the operator (controller/scheduling/conservation.py, issue 51), as a user sees it
on the SchedulingPolicy: every round's amounts in status.workConservation and the metrics;
from the third round in a row that leaves a waiting job's minimum unstarted, Ready=True
says NotWorkConserving with the amounts, and a Warning Event says so once; the first work
conserving round clears it, with a Normal Event."""

from __future__ import annotations

from mlsched.api import get_condition
from mlsched.controller.scheduling import conservation, loop
from mlsched.controller.serving.models import Verdict
from mlsched.policies.work_conservation import IdleCapacity
from builders import NOW, NS, cluster, create_jobs, make_runtime, policy, ps_job, recorded, run


def round_(rt, kube, k: int):
    return recorded(rt, loop.run_policy_round(rt, kube.obj("SchedulingPolicy", NS, "default"),
                                              kube.indexes(), now=NOW + 1200 * k))


def status(kube) -> dict:
    return kube.obj("SchedulingPolicy", NS, "default")["status"]


def events(kube, reason: str) -> list[dict]:
    return [e for e in kube.events("default") if e["reason"] == reason]


def test_chic_leaving_waiting_jobs_unstarted_is_reported_and_cleared_by_drf():
    """The shipped Chic model serves a window of 3 jobs: on 6 nodes with 6 small jobs, the
    other 3 wait while most of the GPUs are free."""
    rt, kube = make_runtime(cluster(6))
    kube.put(policy("default", allocation="chic"))
    run(create_jobs(rt, kube, *(ps_job(f"job-{i}", max_workers=2) for i in range(6))))

    for k in range(conservation.PERSIST_ROUNDS - 1):
        report = round_(rt, kube, k)
        assert report.allocation == "chic"
        wc = status(kube)["workConservation"]
        assert not wc["conserving"] and wc["consecutiveRounds"] == k + 1
        assert wc["fittingJobs"] >= 1 and wc["idleGpus"] >= 1 and wc["idleTasks"] >= 2
        assert get_condition(status(kube)["conditions"], "Ready").reason == "Scheduling"
    assert events(kube, "NotWorkConserving") == []

    round_(rt, kube, conservation.PERSIST_ROUNDS - 1)
    wc = status(kube)["workConservation"]
    ready = get_condition(status(kube)["conditions"], "Ready")
    assert (ready.status, ready.reason) == ("True", "NotWorkConserving")
    assert f"{wc['idleGpus']:g} GPUs, {wc['idleCpus']:g} CPUs ({wc['idleTasks']} tasks) idle" \
        in ready.message and "for 3 rounds in a row" in ready.message
    [warning] = events(kube, "NotWorkConserving")
    assert warning["type"] == "Warning" and "GPUs" in warning["message"]
    gauge = rt.process.metrics.idle_capacity.labels(NS, "default", "gpus")._value.get()
    assert gauge == wc["idleGpus"] > 0
    assert rt.process.metrics.nonconserving_rounds.labels(NS, "default")._value.get() == 3

    round_(rt, kube, conservation.PERSIST_ROUNDS)  # persisting: no second Event
    assert len(events(kube, "NotWorkConserving")) == 1

    pol = kube.obj("SchedulingPolicy", NS, "default")
    pol["spec"]["allocation"] = "drf"
    pol["metadata"]["generation"] = 2
    round_(rt, kube, conservation.PERSIST_ROUNDS + 1)
    assert status(kube)["workConservation"] == {
        "conserving": True, "idleGpus": 0.0, "idleCpus": 0.0, "idleTasks": 0, "fittingJobs": 0,
        "consecutiveRounds": 0}
    assert get_condition(status(kube)["conditions"], "Ready").reason == "Scheduling"
    [cleared] = events(kube, "WorkConserving")
    assert cleared["type"] == "Normal"
    assert rt.process.metrics.idle_capacity.labels(NS, "default", "gpus")._value.get() == 0


def test_a_restarted_operator_goes_on_counting_from_status():
    before = conservation.rounds_before({"consecutiveRounds": 2})
    idle = IdleCapacity(gpus=2, cpus=4, tasks=2, jobs=("a",), waiting=1)
    now = conservation.status_of(idle, before)
    assert now["consecutiveRounds"] == 3
    assert conservation.event(before, 3, idle)[:2] == ("Warning", "NotWorkConserving")
    assert conservation.rounds_before(None) == 0


def test_a_fallback_keeps_its_ready_reason():
    idle = IdleCapacity(gpus=2, cpus=4, tasks=2, jobs=("a",), waiting=1)
    fallback = Verdict(True, "FallbackActive", "dl2 unavailable")
    assert conservation.ready(fallback, idle, 5) is fallback
    assert conservation.ready(Verdict(True, "Scheduling"), idle, 5).reason == "NotWorkConserving"
    assert conservation.ready(Verdict(True, "Scheduling"), idle, 2).reason == "Scheduling"
