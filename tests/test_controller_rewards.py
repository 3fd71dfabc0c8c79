"""Rewards from progress reports: per job in status.history, summed in the policy's rewards."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from mlsched.controller.scheduling import loop
from mlsched.controller.dataset import rewards
from mlsched.controller.progress.progress_server import record_progress
from builders import NOW, NS, cluster, create_jobs, make_runtime, policy, ps_job, recorded, run

START = datetime(2024, 1, 1, tzinfo=UTC)


def test_reward_is_the_fraction_of_total_epochs_trained():
    interval = rewards.OpenInterval(7, START, {
        "a": rewards.Grant(1, 2, {"ps": ["n0"], "worker": ["n0", "n1"]}, 10.0, 100.0),
        "b": rewards.Grant(0, 0, {"ps": [], "worker": []}, 0.0, 50.0),
        "gone": rewards.Grant(1, 1, {"ps": ["n1"], "worker": ["n1"]}, 0.0, 10.0)})
    closed = rewards.close(interval, {"a": 25.0, "b": 0.0})
    a = closed.history["a"]
    assert a["interval"] == 7 and a["ps"] == 1 and a["workers"] == 2
    assert a["placement"] == {"ps": ["n0"], "worker": ["n0", "n1"]}
    assert a["epochs"] == 15.0 and a["reward"] == pytest.approx(0.15)
    assert closed.history["b"]["reward"] == 0.0 and "gone" not in closed.history
    assert closed.reward == {"interval": 7, "start": "2024-01-01T00:00:00Z",
                             "reward": pytest.approx(0.15), "jobs": 1}


def test_progress_never_earns_negative_reward():
    interval = rewards.OpenInterval(0, START, {"a": rewards.Grant(1, 1, {}, 30.0, 100.0)})
    assert rewards.close(interval, {"a": 20.0}).history["a"]["reward"] == 0.0


def test_numbering_continues_after_a_restart():
    assert rewards.next_interval_number(None) == 0
    assert rewards.next_interval_number([{"interval": 41}]) == 42
    # Killed while recording: a job's history got interval 2, the policy's rewards did not.
    assert rewards.next_interval_number([{"interval": 1}], [[{"interval": 2}]]) == 3


def test_rewards_from_reports_between_rounds_land_in_history_and_policy_status():
    rt, kube = make_runtime(cluster(4))
    kube.put(policy(historyLimit=2))
    run(create_jobs(rt, kube, ps_job("a", epochs=100), ps_job("b", epochs=40)))
    rt.cluster.indexes = kube.indexes()
    pol = lambda: kube.obj("SchedulingPolicy", NS, "default")  # noqa: E731
    recorded(rt, loop.run_policy_round(rt, pol(), kube.indexes(), now=NOW))
    for interval in range(3):
        # Reports arrive during the interval (the index lags: the runtime's book is newer).
        run(record_progress(rt, kube.indexes().job(NS, "a"), 10.0 * (interval + 1), None, now=NOW + 10))
        run(record_progress(rt, kube.indexes().job(NS, "b"), 2.0 * (interval + 1), None, now=NOW + 10))
        report = recorded(rt, loop.run_policy_round(rt, pol(), kube.indexes(), now=NOW + 1200 * (interval + 1)))
        assert report.closed.reward["reward"] == pytest.approx(10 / 100 + 2 / 40)
    history = kube.obj("MLJob", NS, "a")["status"]["history"]
    assert [h["interval"] for h in history] == [1, 2]  # historyLimit keeps the newest two
    assert history[-1]["epochs"] == 10.0 and history[-1]["reward"] == pytest.approx(0.1)
    assert history[-1]["workers"] > 0 and history[-1]["placement"]["worker"]
    status = pol()["status"]
    assert [r["interval"] for r in status["rewards"]] == [1, 2]
    assert status["rewards"][-1]["jobs"] == 2
    assert rt.process.metrics.reward.labels(NS, "default")._value.get() == pytest.approx(0.15)
