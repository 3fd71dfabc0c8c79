"""The retraining dataset written by the scheduling loop (controller/dataset/dataset.py) against the
in-memory API: one record per closed interval, decisions safe from the interval's start, a
restart completing the open record, retention, and writes retried until done."""

from __future__ import annotations

import pytest

from mlsched.formats import dataset_store as store
from mlsched.controller.scheduling import loop
from builders import (
    NOW, NS, create_jobs, make_runtime, ps_job, run,
)
from controller_steps import dataset_records as records, dataset_setup as setup, \
    dataset_step as step, report_epochs as report


def test_every_interval_is_in_the_dataset_though_status_keeps_two():
    rt, kube = setup(historyLimit=2)
    for i in range(6):
        if i:
            report(rt, kube, "a", 5.0 * i)
            report(rt, kube, "b", 1.0 * i)
        step(rt, kube, NOW + 1200 * i)
    recs = records(kube)
    assert [r.interval for r in recs] == [0, 1, 2, 3, 4]  # 5 open, recorded when it closes
    history = kube.obj("MLJob", NS, "a")["status"]["history"]
    assert [h["interval"] for h in history] == [3, 4]
    rewards = {r["interval"]: r["reward"] for r in kube.obj("SchedulingPolicy", NS, "default")["status"]["rewards"]}
    for rec in recs:
        assert rec.decisions == [] and rec.algorithms["allocation"] == "drf"  # a heuristic
        assert rec.length_s == 1200 and rec.nodes == 4 and rec.end
        jobs = {j.name: j for j in rec.jobs}
        assert set(jobs) == {"a", "b"} and jobs["a"].architecture == "ParameterServer"
        assert rec.reward == pytest.approx(sum(j.reward for j in jobs.values()))
        assert jobs["a"].epochs == pytest.approx(5.0) and jobs["a"].reward == pytest.approx(0.05)
        if rec.interval in rewards:
            assert rewards[rec.interval] == pytest.approx(rec.reward)
        for h in history:
            if h["interval"] == rec.interval:
                assert (h["ps"], h["workers"], h["reward"]) == (jobs["a"].ps, jobs["a"].workers,
                                                                pytest.approx(jobs["a"].reward))
    # The job's whole run is there, interval by interval.
    assert sum(next(j for j in r.jobs if j.name == "a").epochs for r in recs) == pytest.approx(25.0)


def test_learned_decisions_are_written_when_the_interval_opens():
    rt, kube = setup(allocation="dl2")
    step(rt, kube, NOW)
    (opened,) = records(kube, include_open=True)
    assert records(kube) == [] and opened.interval == 0 and opened.end == ""
    (log,) = opened.decisions
    assert log.algorithm == "dl2" and log.kind == "round" and log.steps > 0
    assert log.model_version is None  # the shipped model, not a published version
    report(rt, kube, "a", 3.0)
    step(rt, kube, NOW + 1200)
    (closed,) = records(kube)
    assert closed.interval == 0 and len(closed.decisions) == 1 and closed.jobs
    assert closed.decisions[0].steps == log.steps
    # Closed, it moved into the policy's segment: the open record's own ConfigMap is gone (the
    # one left is interval 1's, open now).
    assert sorted(c["metadata"]["name"] for c in kube.of_kind("ConfigMap")) == [
        "default-dataset-0", "default-interval-1"]
    cm = kube.obj("ConfigMap", NS, "default-dataset-0")
    assert list(cm["binaryData"]) == ["interval-0.json.gz"]
    assert cm["metadata"]["annotations"]["mlsched.io/intervals"] == "0"


def test_a_restart_mid_interval_completes_the_open_record():
    rt, kube = setup(allocation="dl2")
    step(rt, kube, NOW)
    report(rt, kube, "a", 2.0)
    step(rt, kube, NOW + 1200)  # interval 1 opens, its decisions written
    first = records(kube, include_open=True)[-1]
    assert first.interval == 1 and len(first.decisions) == 1
    # A new operator process: nothing in memory. Its first round carries interval 1 on (with
    # its own decisions added); the next closes it.
    rt2, _ = make_runtime(kube)
    rt2.cluster.indexes = kube.indexes()
    step(rt2, kube, NOW + 1300)
    report(rt2, kube, "a", 7.0)
    step(rt2, kube, NOW + 2500)
    closed = {r.interval: r for r in records(kube)}
    assert set(closed) == {0, 1}
    rec = closed[1]
    assert len(rec.decisions) == 2  # the first process's round and the restarted one's
    assert rec.decisions[0].time == first.decisions[0].time
    assert rec.start == first.start
    assert next(j for j in rec.jobs if j.name == "a").epochs == pytest.approx(5.0)


def test_retention_keeps_the_newest_intervals_and_zero_records_nothing():
    rt, kube = setup(retraining={"datasetLimit": 2})
    # A record an earlier policy of this name left (deleted and created again): the new one's
    # numbering continues after it instead of overwriting it, and retention deletes it in turn.
    kube.put(store.manifests(_old_record(), store.CLOSED)[0])
    step(rt, kube, NOW)
    assert [r.policy_uid for r in records(kube)] == ["old"]
    for i in range(1, 5):
        step(rt, kube, NOW + 1200 * i)
    assert [r.interval for r in records(kube)] == [3, 4]
    assert kube.obj("SchedulingPolicy", NS, "default")["status"]["rewards"][0]["interval"] == 1
    off_rt, off = setup(retraining={"datasetLimit": 0}, allocation="dl2")
    for i in range(3):
        step(off_rt, off, NOW + 1200 * i)
    assert off.of_kind("ConfigMap") == []


def _old_record():
    from mlsched.policies.decision_log import IntervalRecord

    return IntervalRecord(namespace=NS, policy="default", policy_uid="old", interval=0,
                          start="2020-01-01T00:00:00Z", end="2020-01-01T00:20:00Z",
                          length_s=1200, algorithms={}, nodes=1, reward=0.0)


def test_a_failing_write_is_retried_until_written():
    rt, kube = setup()
    rt.writers.objects.backoff_s = 0.01
    step(rt, kube, NOW)
    kube.failing[("create", "default-dataset-0")] = 500

    async def close_then_heal():
        body = kube.obj("SchedulingPolicy", NS, "default")
        await loop.run_policy_round(rt, body, kube.indexes(), now=NOW + 1200)
        assert not await rt.writers.objects.flush(0.2)  # still failing, kept
        del kube.failing[("create", "default-dataset-0")]
        assert await rt.writers.objects.flush(10)

    run(close_then_heal())
    assert [r.interval for r in records(kube)] == [0]


def test_admission_steps_add_their_decisions_to_the_open_record():
    rt, kube = setup(allocation="dl2")
    step(rt, kube, NOW)
    run(create_jobs(rt, kube, ps_job("late", epochs=10)))
    kube.settle()
    assert step(rt, kube, NOW + 60, admission=True) is not None
    (opened,) = records(kube, include_open=True)
    assert [d.kind for d in opened.decisions] == ["round", "admission"]
