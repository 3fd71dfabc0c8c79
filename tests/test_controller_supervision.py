"""Policy loops and the MLJob lifecycle run from watch events, with no finalizer or kopf
annotation on the objects (supervision.py says why)."""

from __future__ import annotations

import asyncio

from mlsched.controller.app import jobs
from mlsched.controller.kube.constants import LEGACY_FINALIZER
from mlsched.controller.process.supervision import PolicyLoops
from builders import NS, cluster, make_runtime, policy, ps_job, run


async def until(condition, turns: int = 1000) -> None:
    """Let the other tasks run until `condition()` holds (a positive signal, not a time)."""
    for _ in range(turns):
        if condition():
            return
        await asyncio.sleep(0)
    raise AssertionError(f"not after {turns} turns of the event loop")


def _policy(name="p", generation=1, uid="u1", deleting=False):
    meta = {"name": name, "namespace": NS, "uid": uid, "generation": generation,
            "managedFields": [{"manager": "kubectl"}]}
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return {"metadata": meta, "spec": {"interval": generation}}


def test_a_loop_runs_per_policy_sees_edits_and_stops_on_deletion():
    async def scenario():
        seen: list[int] = []
        finished: list[str] = []

        async def loop(body, stopped):
            while not stopped.is_set():
                seen.append(body["spec"]["interval"])
                await asyncio.sleep(0)
            finished.append(body["metadata"]["name"])

        loops = PolicyLoops(loop)
        assert loops.observe(_policy()) is False  # first sight starts it, it is no edit
        await until(lambda: seen)
        assert loops.running() == [(NS, "p")]
        assert loops.observe(_policy()) is False  # the same generation: a status write, say
        assert loops.observe(_policy(generation=2)) is True
        await until(lambda: seen[-1] == 2)
        assert seen[0] == 1 and set(seen) == {1, 2}  # the running loop reads the latest body
        assert "managedFields" not in str(seen)
        loops.observe(_policy(generation=2, deleting=True))
        await until(lambda: finished)
        assert finished == ["p"] and loops.running() == []

    run(scenario())


def test_a_policy_recreated_under_its_name_gets_a_new_loop():
    async def scenario():
        uids: list[str] = []

        async def loop(body, stopped):
            uids.append(body["metadata"]["uid"])
            await stopped.wait()

        loops = PolicyLoops(loop)
        loops.observe(_policy(uid="u1"))
        await until(lambda: uids)
        loops.observe(_policy(uid="u2"))
        await until(lambda: len(uids) == 2)
        assert uids == ["u1", "u2"] and loops.running() == [(NS, "p")]
        await loops.stop_all()
        assert loops.running() == []

    run(scenario())


def test_a_crashing_loop_is_logged_and_restarted_by_the_next_event():
    async def scenario():
        calls = []

        async def loop(body, stopped):
            calls.append(1)
            raise RuntimeError("boom")

        loops = PolicyLoops(loop)
        loops.observe(_policy())
        await until(lambda: calls and loops.running() == [])  # died, and forgot the policy
        loops.observe(_policy())
        await until(lambda: len(calls) == 2)
        assert loops.running() == []

    run(scenario())


def test_a_job_is_reconciled_once_per_generation_and_its_lifecycle_swept():
    rt, kube = make_runtime(cluster(2))
    kube.put(policy())
    body = kube.put(ps_job("bert"))
    run(jobs.on_job_event(rt, "ADDED", body, kube.indexes()))
    assert sorted(s["metadata"]["name"] for s in kube.of_kind("StatefulSet")) == \
        ["bert-ps", "bert-worker"]
    assert kube.obj("MLJob", NS, "bert")["status"]["phase"] == "Pending"
    creates = [c for c in kube.calls if c[0] == "create"]
    # The watch event of our own status write is no new generation: no second reconcile.
    run(jobs.on_job_event(rt, "MODIFIED", kube.obj("MLJob", NS, "bert"), kube.indexes()))
    run(jobs.sweep(rt, kube.indexes()))
    assert [c for c in kube.calls if c[0] == "create"] == creates
    run(jobs.on_job_event(rt, "DELETED", body, kube.indexes()))
    assert rt.jobs.books.job_bodies == {} and rt.jobs.books.reconciled == {}


def test_a_transient_error_is_reported_once_and_retried_by_the_sweep():
    rt, kube = make_runtime(cluster(2))
    kube.put(policy())
    body = kube.put(ps_job("bert"))
    kube.failing[("create", "bert-ps")] = 503
    for _ in range(2):
        try:
            run(jobs.on_job_event(rt, "ADDED", body, kube.indexes()))
        except Exception:  # noqa: BLE001 - kopf logs it; the sweep retries
            pass
    warnings = [e for e in kube.events("bert") if e["reason"] == "ChildrenNotCreated"]
    assert len(warnings) == 1 and "retrying" in warnings[0]["message"]
    del kube.failing[("create", "bert-ps")]
    run(jobs.sweep(rt, kube.indexes()))
    assert {s["metadata"]["name"] for s in kube.of_kind("StatefulSet")} >= {"bert-ps"}


def test_objects_of_an_earlier_operator_lose_kopfs_finalizer_and_annotations():
    rt, kube = make_runtime(cluster(2))
    job = ps_job("old")
    job["metadata"]["finalizers"] = ["example.com/keep", LEGACY_FINALIZER]
    job["metadata"]["annotations"] = {"mlsched.io/last-handled-configuration": "{}",
                                      "team": "a"}
    body = kube.put(job)
    run(jobs.release_legacy_finalizer(rt, "MLJob", body))
    meta = kube.obj("MLJob", NS, "old")["metadata"]
    assert meta["finalizers"] == ["example.com/keep"]
    assert meta["annotations"] == {"team": "a"}


def test_an_admission_step_waits_for_a_burst_to_end_but_not_forever():
    from mlsched.controller.scheduling import loop
    from mlsched.controller.scheduling.books import Wakeups

    class Clock:
        def __init__(self):
            self.t = 0.0

    async def scenario(arrivals_every, arrivals_for):
        wakeups, clock = Wakeups(), Clock()
        key = (NS, "p")

        async def sleep(seconds):
            # Simulated time: arrivals keep coming every `arrivals_every` s for `arrivals_for` s.
            end = clock.t + seconds
            while clock.t + arrivals_every <= min(end, arrivals_for):
                clock.t += arrivals_every
                wakeups.signal(key, "admission")
            clock.t = end

        await loop._quiet(wakeups, key, sleep, clock=lambda: clock.t)
        return clock.t

    # Arrivals every 0.1 s for 1 s: the step waits for the burst to end, then a quiet 0.25 s.
    assert 1.0 <= run(scenario(0.1, 1.0)) <= 1.0 + 2 * loop.ADMISSION_QUIET_S
    # A stream that never pauses: admitted after at most ADMISSION_MAX_WAIT_S anyway.
    assert run(scenario(0.1, 60.0)) <= loop.ADMISSION_MAX_WAIT_S + loop.ADMISSION_QUIET_S
    # No burst: one quiet period.
    assert run(scenario(10.0, 0.0)) == loop.ADMISSION_QUIET_S
