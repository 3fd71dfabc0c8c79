"""The operator's side of the learning loop (issue 17) on the real control plane: the dataset of
interval records in ConfigMaps, exploration recorded with its probabilities, and published
model versions adopted (Auto), reported (Manual) and rolled back (a pin in the spec).

What the retrain CLI reads is read here the same way: `dataset_store.list_records` with a
CoreV1Api, as the cluster admin.
"""

from __future__ import annotations

import numpy as np
import pytest
from kubernetes import client

from mlsched.formats import dataset_store, model_versions
from mlsched_objects import REPO, mljob, scheduling_policy
from waiting import wait_for

ARTIFACTS = REPO / "policy_models" / "artifacts" / "dl2"
ROUND_TIMEOUT = 90  # rounds every 6 s; generous on a loaded 2-core machine


def records(api, mlsched, policy: str, include_open: bool = False):
    return dataset_store.list_records(client.CoreV1Api(api), mlsched.namespace, policy,
                                      include_open)


def status(mlsched, policy: str) -> dict:
    return (mlsched.policy(policy) or {}).get("status") or {}


def closed_intervals(mlsched, policy: str) -> list[int]:
    return [r["interval"] for r in status(mlsched, policy).get("rewards") or []]


def publish(api, mlsched, policy: str, version: int, stem: str, **evaluation) -> dict:
    """A version as retraining publishes it, built from a real ONNX file and its card."""
    body = model_versions.manifest(mlsched.namespace, policy, "allocation", "dl2", version,
                                   (ARTIFACTS / f"{stem}.onnx").read_bytes(),
                                   (ARTIFACTS / f"{stem}.card.json").read_text(),
                                   evaluation or {"jctGain": 0.1 * version})
    client.CoreV1Api(api).create_namespaced_config_map(mlsched.namespace, body)
    return body


def active(mlsched, policy: str) -> dict:
    return ((status(mlsched, policy).get("modelVersions") or {}).get("allocation/dl2") or {}) \
        .get("active") or {}


def test_a_job_longer_than_history_limit_is_fully_in_the_dataset(api, mlsched, operator, emulator):
    # 600 s intervals, a round every 3 s at the e2e interval scale (the emulator's clock runs
    # 600 s of training in it): what is checked is how many intervals close, not how long they
    # are, and at the default 1200 s the eight took 48 s.
    mlsched.create(scheduling_policy("default", interval=600, historyLimit=2))
    mlsched.create(mljob("long", ps=(1, 1), workers=(1, 2), epochs=1e9))
    # Eight intervals closed, the job trained in most: far more than status keeps.
    wait_for(lambda: (closed_intervals(mlsched, "default") or [0])[-1] >= 7, 180,
             "eight intervals closed", describe=lambda: closed_intervals(mlsched, "default"))
    job_status = mlsched.job("long")["status"]
    history = {h["interval"]: h for h in job_status["history"]}
    rewards = {r["interval"]: r for r in status(mlsched, "default")["rewards"]}
    assert len(history) == 2  # historyLimit
    newest = max(rewards)
    recs = wait_for(lambda: (rs := records(api, mlsched, "default"))
                    and rs[-1].interval >= newest and rs, 30, "the newest record written")
    by_interval = {r.interval: r for r in recs}
    mine = sorted(n for n, r in by_interval.items() if any(j.name == "long" for j in r.jobs))
    # Every interval of the job, from its first to the newest closed one, none missing.
    assert mine == list(range(mine[0], newest + 1)), mine
    assert len(mine) > 2
    trained = 0.0
    for n in mine:
        rec = by_interval[n]
        (job,) = [j for j in rec.jobs if j.name == "long"]
        assert job.uid == mlsched.job("long")["metadata"]["uid"] and job.total_epochs == 1e9
        assert job.epochs_at_start == pytest.approx(trained, rel=1e-6, abs=1e-6)
        trained += job.epochs
        if n in history:  # where status still has it, the dataset agrees
            assert (job.ps, job.workers) == (history[n]["ps"], history[n]["workers"])
            assert job.reward == pytest.approx(history[n]["reward"], rel=1e-9)
            assert job.epochs == pytest.approx(history[n]["epochs"], rel=1e-9)
        if n in rewards:
            assert rec.reward == pytest.approx(rewards[n]["reward"], rel=1e-9)
        assert rec.decisions == [] and rec.algorithms["allocation"] == "drf"
    assert trained > 0


def test_exploration_records_behaviour_probabilities(api, mlsched, start_operator, emulator):
    start_operator(extra_args=["--max-exploration", "0.3"])
    # 600 s intervals (3 s rounds, as above): what is counted is recorded steps.
    mlsched.create(scheduling_policy("explore", allocation="dl2", interval=600,
                                     exploration={"epsilon": 0.5}))
    mlsched.create(mljob("e1", ps=(1, 4), workers=(1, 4), epochs=1e9, policy="explore"))
    mlsched.create(mljob("e2", ps=(1, 4), workers=(1, 4), epochs=1e9, policy="explore"))
    wait_for(lambda: sum(d.steps for r in records(api, mlsched, "explore") for d in r.decisions)
             >= 30, ROUND_TIMEOUT * 2, "30 recorded steps")
    assert status(mlsched, "explore")["exploration"] == {"requested": 0.5, "applied": 0.3}
    assert any(e.reason == "ExplorationClamped" for e in mlsched.events("explore", "SchedulingPolicy"))
    logs = [d for r in records(api, mlsched, "explore") for d in r.decisions]
    assert logs and all(d.epsilon == 0.3 and d.algorithm == "dl2" for d in logs)
    mu = np.concatenate([d.behaviour_probs for d in logs])
    allowed = np.concatenate([d.masks.sum(axis=1) for d in logs])
    greedy = np.isclose(mu, 0.7 + 0.3 / allowed, rtol=1e-5)
    explored = np.isclose(mu, 0.3 / allowed, rtol=1e-5)
    assert (greedy | explored).all(), mu  # each step: (1-eps)[a = greedy] + eps/|allowed|
    # Below 1 wherever there was a choice; some steps took a random action.
    assert (mu[allowed > 1] < 1).all() and explored.any(), (mu, allowed)


def test_auto_adopts_manual_reports_a_pin_rolls_back(api, mlsched, operator, emulator):
    mlsched.create(scheduling_policy("learn", allocation="dl2"))  # updatePolicy: Manual
    mlsched.create(mljob("l1", ps=(1, 2), workers=(1, 2), epochs=1e9, policy="learn"))
    wait_for(lambda: active(mlsched, "learn").get("source") == "shipped", ROUND_TIMEOUT,
             "the shipped model serving")
    v1 = publish(api, mlsched, "learn", 1, "dl2-sl", jctGain=0.12)
    # Labelled as a version, but not one (no digest): ignored, never a candidate.
    bad = {**v1, "metadata": {**v1["metadata"], "name": "learn-dl2-v9",
                              "labels": {**v1["metadata"]["labels"], "mlsched.io/model-version": "9"},
                              "annotations": {}}}
    client.CoreV1Api(api).create_namespaced_config_map(mlsched.namespace, bad)
    sha1 = v1["metadata"]["annotations"]["mlsched.io/sha256"]
    entry = wait_for(lambda: (e := status(mlsched, "learn")["modelVersions"]["allocation/dl2"])
                     .get("candidate") and e, ROUND_TIMEOUT, "Manual: v1 reported as candidate")
    assert entry["candidate"] == {"version": 1, "sha256": sha1, "configMap": "learn-dl2-v1",
                                  "evaluation": {"jctGain": 0.12}}
    assert entry["active"]["source"] == "shipped"

    mlsched.patch_policy("learn", {"updatePolicy": "Auto"})
    wait_for(lambda: active(mlsched, "learn").get("version") == 1, ROUND_TIMEOUT,
             "Auto: v1 adopted at the next round")
    assert status(mlsched, "learn")["modelVersion"] == "dl2 v1"
    assert status(mlsched, "learn")["activeModels"]["allocation/dl2"] == sha1
    assert any(e.reason == "VersionAdopted" for e in mlsched.events("learn", "SchedulingPolicy"))
    wait_for(lambda: any(d.model_version == "1" for r in records(api, mlsched, "learn")
                         for d in r.decisions), ROUND_TIMEOUT,
             "decision records carrying version 1")

    v2 = publish(api, mlsched, "learn", 2, "dl2", jctGain=0.2)
    wait_for(lambda: active(mlsched, "learn").get("version") == 2, ROUND_TIMEOUT,
             "Auto: v2 adopted at the next round")
    # Rollback: pin v1 in the spec, one edit.
    pin = model_versions.parse(client.ApiClient().sanitize_for_serialization(
        client.CoreV1Api(api).read_namespaced_config_map("learn-dl2-v1", mlsched.namespace)))
    mlsched.patch_policy("learn", {"models": {"allocation": {"dl2": pin.model_ref}}})
    back = wait_for(lambda: (a := active(mlsched, "learn")).get("source") == "spec" and a,
                    ROUND_TIMEOUT, "the pinned v1 serving")
    assert back["version"] == 1 and back["sha256"] == sha1
    candidate = status(mlsched, "learn")["modelVersions"]["allocation/dl2"]["candidate"]
    if v2["metadata"]["annotations"]["mlsched.io/sha256"] != sha1:
        assert candidate["version"] == 2


def test_an_operator_killed_mid_interval_loses_no_record(api, mlsched, operator, emulator):
    mlsched.create(scheduling_policy("kill", allocation="dl2"))
    mlsched.create(mljob("k1", ps=(1, 2), workers=(1, 2), epochs=1e9, policy="kill"))
    # An interval open, its decisions in the dataset already.
    opened = wait_for(lambda: [r for r in records(api, mlsched, "kill", include_open=True)
                               if not r.end and r.decisions and r.interval >= 1], ROUND_TIMEOUT,
                      "an open interval record with its decisions")[-1]
    operator.kill()
    operator.start()
    closed = wait_for(lambda: {r.interval: r for r in records(api, mlsched, "kill")}
                      .get(opened.interval), ROUND_TIMEOUT * 2,
                      f"interval {opened.interval} closed by the restarted operator")
    # The first process's decisions are kept, the job trained in it is there.
    assert closed.decisions[0].time == opened.decisions[0].time
    np.testing.assert_array_equal(closed.decisions[0].actions, opened.decisions[0].actions)
    assert closed.start == opened.start and closed.jobs[0].name == "k1"
    numbers = sorted(r.interval for r in records(api, mlsched, "kill"))
    assert numbers == list(range(numbers[0], numbers[-1] + 1)), numbers
    history = {h["interval"]: h for h in mlsched.job("k1")["status"]["history"]}
    assert closed.jobs[0].epochs == pytest.approx(history[opened.interval]["epochs"], rel=1e-9)
