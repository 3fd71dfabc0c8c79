"""Status records off the critical path: written in the background, retried until written,
never written twice, merged per job; the interval open when the operator died is closed by the
next one."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from mlsched.controller.scheduling import loop
from mlsched.controller.kube.kube import KubeError
from mlsched.controller.progress.progress_server import record_progress
from mlsched.controller.kube.status_writer import StatusWriter
from mlsched.controller.kube.token_bucket import TokenBucket
from builders import (
    NOW, NS, cluster, create_jobs, make_runtime, policy, ps_job, recorded, recorded_but_refused,
    run,
)
from memory_kube import MemoryKube

JOBS = ("a", "b", "c")


def setup(kube=None):
    rt, kube = make_runtime(kube or cluster(6))
    rt.writers.status.backoff_s = 0.01  # retries within the test's time
    if not kube.of_kind("SchedulingPolicy"):
        kube.put(policy())
        run(create_jobs(rt, kube, *(ps_job(n, max_workers=2) for n in JOBS)))
    return rt, kube


def round_at(rt, kube, k):
    """Round k (interval k's start), its records written: all of them, or while the API server
    refuses some (`kube.failing`), all others, each refused one tried at least once."""
    coro = loop.run_policy_round(rt, kube.obj("SchedulingPolicy", NS, "default"),
                                 kube.indexes(), now=NOW + 1200 * k)
    return recorded_but_refused(rt, kube, coro) if kube.failing else recorded(rt, coro)


def train(rt, kube, epochs):
    """Every job reports `epochs` done (kept by the operator even when the API server does not
    take the progress write)."""
    for name in JOBS:
        with contextlib.suppress(KubeError):
            run(record_progress(rt, kube.indexes().job(NS, name), epochs, None, now=NOW))


def history(kube, name):
    return kube.obj("MLJob", NS, name)["status"].get("history") or []


def numbers(kube, name):
    return [h["interval"] for h in history(kube, name)]


def status_patches(kube, name):
    return [c for c in kube.calls if c == ("patch-status", "MLJob", NS, name)]


def test_records_of_an_outage_are_written_after_it_once_each():
    rt, kube = setup()
    round_at(rt, kube, 0)
    train(rt, kube, 5.0)
    round_at(rt, kube, 1)
    assert [numbers(kube, n) for n in JOBS] == [[0]] * 3

    # The API server refuses status writes for two rounds (503, then 429).
    for name in (*JOBS, "default"):
        kube.failing[("patch", name)] = 503
    train(rt, kube, 9.0)
    round_at(rt, kube, 2)
    for name in (*JOBS, "default"):
        kube.failing[("patch", name)] = 429
    train(rt, kube, 12.0)
    round_at(rt, kube, 3)
    assert [numbers(kube, n) for n in JOBS] == [[0]] * 3
    assert rt.writers.status.pending() == len(JOBS) + 1  # the jobs and the policy
    assert rt.process.metrics.api_errors.labels("record")._value.get() >= 2 * len(JOBS)

    kube.failing.clear()
    assert run(rt.writers.status.flush(5))
    for name in JOBS:
        entries = history(kube, name)
        assert [h["interval"] for h in entries] == [0, 1, 2]  # no gap, none twice
        assert [h["epochs"] for h in entries] == [5.0, 4.0, 3.0]
        assert kube.obj("MLJob", NS, name)["status"]["openInterval"]["interval"] == 3
    assert [r["interval"] for r in kube.obj("SchedulingPolicy", NS, "default")["status"]["rewards"]] \
        == [0, 1, 2]

    # Once the index shows them, the next round appends only its own interval.
    round_at(rt, kube, 4)
    assert [numbers(kube, n) for n in JOBS] == [[0, 1, 2, 3]] * 3


def test_two_pending_records_of_a_job_merge_into_one_patch():
    rt, kube = setup()
    round_at(rt, kube, 0)
    kube.failing[("patch", "a")] = 500
    train(rt, kube, 2.0)
    round_at(rt, kube, 1)
    train(rt, kube, 3.0)
    round_at(rt, kube, 2)
    kube.failing.clear()
    kube.calls.clear()
    assert run(rt.writers.status.flush(5))
    assert len(status_patches(kube, "a")) == 1  # both intervals in one write
    assert [(h["interval"], h["epochs"]) for h in history(kube, "a")] == [(0, 2.0), (1, 1.0)]


def test_a_written_record_the_watch_has_not_shown_yet_is_not_lost_nor_repeated():
    """The index lags the writes: a round reading an MLJob without its newest entry must not
    write the list without it (merge patches replace lists), nor append it again."""
    rt, kube = setup()
    stale = kube.indexes()
    rt.cluster.indexes = stale  # what the writer sees at write time: never updated in this test
    for k in range(3):
        train(rt, kube, 2.0 * k)
        recorded(rt, loop.run_policy_round(rt, kube.obj("SchedulingPolicy", NS, "default"),
                                           stale, now=NOW + 1200 * k))
    assert numbers(kube, "a") == [0, 1]
    assert [h["epochs"] for h in history(kube, "a")] == [2.0, 2.0]


def test_history_keeps_the_newest_history_limit_entries():
    rt, kube = make_runtime(cluster(4))
    kube.put(policy(historyLimit=2))
    run(create_jobs(rt, kube, ps_job("a")))
    rt.writers.status.backoff_s = 0.01  # each round waits for a retry of "a"
    kube.failing[("patch", "a")] = 500
    for k in range(4):
        round_at(rt, kube, k)
    kube.failing.clear()
    assert run(rt.writers.status.flush(5))
    assert numbers(kube, "a") == [1, 2]


def test_the_round_does_not_wait_for_a_write_that_hangs():
    rt, kube = setup()
    released = asyncio.Event()
    patch = kube.patch

    async def hanging(kind, namespace, name, body, **kw):
        if kw.get("status") and kind == "MLJob":
            await released.wait()
        return await patch(kind, namespace, name, body, **kw)

    kube.patch = hanging

    async def scenario():
        report = await asyncio.wait_for(
            loop.run_policy_round(rt, kube.obj("SchedulingPolicy", NS, "default"),
                                  kube.indexes(), now=NOW), 5)
        scaled = {s["metadata"]["name"]: s["spec"]["replicas"] for s in kube.of_kind("StatefulSet")}
        unwritten = [n for n in JOBS if "placement" not in kube.obj("MLJob", NS, n)["status"]]
        released.set()
        await rt.writers.status.flush(5)
        return report, scaled, unwritten

    report, scaled, unwritten = run(scenario())
    # Scaled while every job's status write was still hanging.
    assert scaled["a-worker"] == report.targets["a"].count("worker") > 0
    assert unwritten == list(JOBS)
    assert all(kube.obj("MLJob", NS, n)["status"]["placement"] for n in JOBS)


def test_a_round_shows_on_its_policy_before_the_job_records_queued_ahead_of_it():
    # What `kubectl get schedulingpolicy` shows (lastRoundTime) was queued behind one record
    # per job: at 2,000 jobs and 50 writes a second it came 39 s after the round.
    rt, kube = setup()
    rt.writers.status.concurrency = 1
    rt.writers.status.bucket = TokenBucket(rate=50, burst=1)
    # The first job record holds the one slot until the round has queued everything: which
    # records were queued behind which is then the round's doing, not the machine's speed
    # (under load, a second job record was written before the round had queued the policy's).
    released = asyncio.Event()
    patch = kube.patch

    async def held(kind, namespace, name, body, **kw):
        if kw.get("status") and kind == "MLJob":
            await released.wait()
        return await patch(kind, namespace, name, body, **kw)

    kube.patch = held
    before = len(kube.calls)

    async def scenario():
        await loop.run_policy_round(rt, kube.obj("SchedulingPolicy", NS, "default"),
                                    kube.indexes(), now=NOW)
        queued = rt.writers.status.pending()
        released.set()
        assert await rt.writers.status.flush(5)
        await rt.writers.events.settled(5)
        return queued

    assert run(scenario()) == len(JOBS) + 1
    order = [c[1] for c in kube.calls[before:] if c[0] == "patch-status"]
    # Only the one job record already in flight went first; the policy's, queued after the
    # other jobs' records, went ahead of them.
    assert order == ["MLJob", "SchedulingPolicy", "MLJob", "MLJob"], order
    assert kube.obj("SchedulingPolicy", NS, "default")["status"]["lastRoundTime"]


def test_writes_keep_to_the_concurrency_and_the_rate():
    kube = MemoryKube()
    for i in range(6):
        kube.put({"apiVersion": "mlsched.io/v1alpha1", "kind": "MLJob",
                  "metadata": {"name": f"j{i}", "namespace": NS}, "spec": {}})
    in_flight, most = 0, 0
    patch = kube.patch

    async def slow(*args, **kw):
        nonlocal in_flight, most
        in_flight += 1
        most = max(most, in_flight)
        await asyncio.sleep(0.02)
        in_flight -= 1
        return await patch(*args, **kw)

    kube.patch = slow
    writer = StatusWriter(kube, concurrency=2, rate=0)
    for i in range(6):
        writer.enqueue("MLJob", NS, f"j{i}", fields={"phase": "Running"})
    assert run(writer.flush(5)) and most == 2

    clock = [0.0]
    bucket = TokenBucket(rate=10, burst=2, clock=lambda: clock[0])
    assert [bucket.reserve() for _ in range(4)] == pytest.approx([0.0, 0.0, 0.1, 0.2])
    clock[0] = 10.0  # refilled, up to the burst
    assert [bucket.reserve() for _ in range(3)] == pytest.approx([0.0, 0.0, 0.1])


def test_a_record_for_a_job_deleted_or_replaced_meanwhile_is_not_written_to_another():
    rt, kube = setup()
    kube.failing[("patch", "a")] = 500
    round_at(rt, kube, 0)
    # "a" is deleted and created again: the old job's record is not the new one's.
    old_uid = kube.obj("MLJob", NS, "a")["metadata"]["uid"]
    del kube.objects[("MLJob", NS, "a")]
    kube.put(ps_job("a", max_workers=2))
    assert kube.obj("MLJob", NS, "a")["metadata"]["uid"] != old_uid
    rt.cluster.indexes = kube.indexes()
    kube.failing.clear()
    assert run(rt.writers.status.flush(5))
    assert "placement" not in (kube.obj("MLJob", NS, "a").get("status") or {})


def test_the_interval_open_when_the_operator_died_is_closed_by_the_next_one():
    rt, kube = setup()
    round_at(rt, kube, 0)
    train(rt, kube, 4.0)
    round_at(rt, kube, 1)
    train(rt, kube, 10.0)  # trained in interval 1; then the operator dies
    open_interval = kube.obj("MLJob", NS, "a")["status"]["openInterval"]
    assert open_interval["interval"] == 1 and open_interval["epochsAtStart"] == 4.0

    restarted, _ = setup(kube)  # a new process: nothing in memory, the same API server
    kube.calls.clear()
    first = round_at(restarted, kube, 2)
    # Interval 1 goes on: what the jobs trained while no operator ran is reported only now.
    assert first.closed is None and first.interval == 1
    assert [numbers(kube, n) for n in JOBS] == [[0]] * 3
    assert not any(status_patches(kube, n) for n in JOBS)  # nothing changed for the jobs
    train(restarted, kube, 13.0)
    report = round_at(restarted, kube, 3)
    for name in JOBS:
        entries = history(kube, name)
        assert [h["interval"] for h in entries] == [0, 1]
        assert entries[1]["epochs"] == 9.0 and entries[1]["start"] == open_interval["start"]
        assert kube.obj("MLJob", NS, name)["status"]["openInterval"]["interval"] == 2
    assert report.closed.reward["interval"] == 1
    rewards = kube.obj("SchedulingPolicy", NS, "default")["status"]["rewards"]
    assert [r["interval"] for r in rewards] == [0, 1]
    assert rewards[1]["reward"] == pytest.approx(3 * 9.0 / 100)
    # Every epoch trained is in exactly one interval: closed ones, or the one open now.
    for name in JOBS:
        status = kube.obj("MLJob", NS, name)["status"]
        assert sum(h["epochs"] for h in status["history"]) == status["openInterval"]["epochsAtStart"]


def test_jobs_left_one_interval_apart_by_a_kill_are_each_closed_once():
    """Killed while recording: some jobs' records of interval 1 were written, others not."""
    rt, kube = setup()
    round_at(rt, kube, 0)
    train(rt, kube, 4.0)
    kube.failing[("patch", "c")] = 500
    round_at(rt, kube, 1)  # "c" still shows interval 0 as open; then the kill
    kube.failing.clear()
    train(rt, kube, 10.0)

    restarted, _ = setup(kube)
    round_at(restarted, kube, 2)
    # "c"'s interval 0 is closed now with all it trained since; interval 1 goes on for all.
    assert numbers(kube, "a") == [0] and numbers(kube, "c") == [0]
    assert history(kube, "c")[0]["epochs"] == 10.0
    assert kube.obj("MLJob", NS, "c")["status"]["openInterval"]["epochsAtStart"] == 10.0
    round_at(restarted, kube, 3)
    assert numbers(kube, "a") == [0, 1] and numbers(kube, "c") == [0, 1]
    rewards = [r["interval"] for r in kube.obj("SchedulingPolicy", NS, "default")["status"]["rewards"]]
    assert rewards == [0, 1]
