"""The whole learning loop of issue 17 on the real control plane: emulated jobs under a DL²
policy with `updatePolicy: Auto` and exploration leave interval records; the retraining Job
reads them, trains, judges and publishes (or not); the operator adopts what it published.

kwok runs no containers, so "running the retraining Job" is running its container's command
(`mlsched retrain` with the args of manifests/retraining/job.yaml, only mode, budget and
margin changed) as a subprocess here, as the Job's pod would: `POD_NAMESPACE` from the
environment, a read-only view of nothing but a temp dir, and the credentials of the
`mlsched-retrain` ServiceAccount with exactly manifests/retraining/rbac.yaml's Role (a token
minted by TokenRequest, as the kubelet mints the pod's). So the test also checks that the
shipped Role is enough, and that it does not let retraining write the SchedulingPolicy.

The subprocess needs torch (the `train` extra): without it the test fails and says what to
install; it never skips.
"""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime, timedelta

import pytest
from kubernetes import client
from kubernetes import config as kube_config
from kubernetes.client.exceptions import ApiException

from mlsched.formats import dataset_store, model_versions
from mlsched_objects import GROUP, VERSION, mljob, scheduling_policy
from retraining_runs import (
    POLICY, ROUND_TIMEOUT, SHORT_INTERVAL, RetrainingJob, job_args, policy_status, records,
    require_torch, retraining_kubeconfig, versions,
)
from waiting import wait_for

LONG_INTERVAL = 86400  # 432 s rounds at the e2e interval scale: no interval closes meanwhile


def _when(rfc3339: str) -> datetime:
    return datetime.fromisoformat(rfc3339.replace("Z", "+00:00"))


def active(mlsched) -> dict:
    return ((policy_status(mlsched).get("modelVersions") or {}).get("allocation/dl2") or {}) \
        .get("active") or {}


def test_retraining_job_publishes_once_and_auto_adopts(api, control_plane, mlsched, operator,
                                                        emulator, tmp_path):
    require_torch()
    ns = mlsched.namespace
    job = RetrainingJob(retraining_kubeconfig(api, ns, control_plane.apiserver_url,
                                              control_plane.ca_cert_path,
                                              tmp_path / "retrain.kubeconfig"),
                        ns, tmp_path / "retrain")

    # 1. DL² (the model shipped with the operator: no spec.models), Auto, some exploration.
    mlsched.create(scheduling_policy(POLICY, allocation="dl2", interval=SHORT_INTERVAL,
                                     updatePolicy="Auto", exploration={"epsilon": 0.1}))
    for name, model in [("r1", "resnet-50"), ("r2", "vgg-16"), ("r3", "inception-bn")]:
        mlsched.create(mljob(name, model=model, ps=(1, 4), workers=(1, 4), epochs=1e9))
    wait_for(lambda: len([r for r in records(api, ns) if r.decisions]) >= 4, ROUND_TIMEOUT * 2,
             "four closed interval records with DL² decisions",
             describe=lambda: [(r.interval, len(r.decisions)) for r in records(api, ns)])
    shipped = active(mlsched)
    assert shipped.get("source") == "shipped", policy_status(mlsched).get("modelVersions")

    # Hold the records still while the Job runs (no interval closes in 432 s), so that "nothing
    # new" below means consumed, not "no interval closed since". An edit wakes a round at once.
    edited_at = datetime.now(UTC) - timedelta(seconds=1)
    edited = mlsched.patch_policy(POLICY, {"interval": LONG_INTERVAL})
    generation = edited["metadata"]["generation"]
    wait_for(lambda: policy_status(mlsched).get("observedGeneration") == generation,
             ROUND_TIMEOUT, "the round of the interval edit")
    # The edit's round closes the interval open at the edit (and a round in flight at the edit
    # may close one more); rewards and records go out in the background, possibly after
    # observedGeneration shows. Settled: the interval open now was opened by a round after the
    # edit, every interval before it is closed and in the policy's rewards, and that
    # stays so for a few seconds (no interval closes for 432 s now).
    seen: list = []

    def settled():
        rewards = policy_status(mlsched).get("rewards") or []
        closed = records(api, ns)
        done = {r.interval for r in closed}
        opened = [r for r in dataset_store.list_records(client.CoreV1Api(api), ns, POLICY,
                                                         include_open=True)
                  if r.interval not in done]
        fresh = bool(opened) and _when(opened[-1].start) >= edited_at
        state = (rewards[-1]["interval"] if rewards else None,
                 closed[-1].interval if closed else None,
                 opened[-1].interval if opened else None, fresh)
        seen.append((time.monotonic(), state))
        good = (fresh and state[0] is not None and state[0] == state[1]
                and state[2] == state[1] + 1)
        recent = [st for t, st in seen if t > seen[-1][0] - 3.0]
        return (good and seen[0][0] < seen[-1][0] - 3.0 and all(st == state for st in recent)
                and closed)

    recorded = wait_for(settled, ROUND_TIMEOUT, "the edit round's reward and record, settled",
                        describe=lambda: seen[-1][1] if seen else None)
    newest = recorded[-1].interval
    intervals = [r.interval for r in recorded]
    assert intervals[-1] == newest and intervals == list(range(intervals[0], newest + 1)), intervals
    assert sum(d.steps for r in recorded for d in r.decisions) > 0
    # Lengths in the policy's time (1200 s), not the 6 s of wall time a scaled round takes:
    # retraining simulates intervals of that length.
    assert 600 < sorted(r.length_s for r in recorded)[len(recorded) // 2] < 3600, \
        [r.length_s for r in recorded]
    frozen = mlsched.policy(POLICY)
    assert frozen["metadata"]["generation"] == generation

    # Offpolicy, a short budget and two evaluation traces: this is about the loop, not quality.
    quick = dict(mode="offpolicy", time_budget_min=0.3, eval_traces=2)

    # 2. A demanding margin: a candidate not 50 % faster than the active model is not promoted.
    report = job.run(job_args(**quick, margin=0.5))
    assert report["status"] == "not-better", report
    assert report["evaluation"]["ratio"] > 0.5, report["evaluation"]
    assert report["evaluation"]["base_version"] is None  # it started from the shipped model
    assert versions(api, ns) == []

    # The margins below (-0.5: publish a candidate up to 50 % slower) test the plumbing of
    # publishing, consuming once and adoption, not whether retraining improves the model: a
    # 20-second fine-tune on a few intervals cannot be relied on to win. Quality is measured
    # by bench/bench_retrain.py, not here.
    publishing = job_args(**quick, margin=-0.5)

    # 3. A Job killed half-way (SIGKILL once it has read and calibrated, while it trains)
    # publishes nothing; its rerun publishes exactly once.
    log = job.run_killed_when(publishing, "calibrated speed factors")
    assert "new intervals" in log and "published" not in log, log
    assert versions(api, ns) == []
    report = job.run(publishing)
    assert report["status"] == "published" and report["version"] == 1, report
    (cm,) = versions(api, ns)
    version = model_versions.parse(cm)
    assert version is not None and version.version == 1, cm["metadata"]
    assert cm["metadata"]["name"] == report["configmap"] == f"{POLICY}-dl2-v1"
    evaluation = json.loads(cm["metadata"]["annotations"][model_versions.EVALUATION])
    # The evaluation names exactly the intervals the run consumed: every closed one.
    assert (evaluation["first_interval"], evaluation["trained_through_interval"]) \
        == (intervals[0], intervals[-1]), (evaluation, intervals)
    assert evaluation["intervals"] == len(intervals)
    assert evaluation["mode"] == "offpolicy" and evaluation["margin"] == -0.5
    assert evaluation["ratio"] <= 1.5 and evaluation["traces"] == 2, evaluation

    # 4. The same Job again: every interval is consumed, nothing new is published.
    again = job.run(publishing)
    assert again["status"] == "nothing-new", again
    assert again["trained_through_interval"] == intervals[-1]
    assert [c["metadata"]["name"] for c in versions(api, ns)] == [f"{POLICY}-dl2-v1"]

    # Retraining never wrote the policy: spec and generation as before the runs, and its
    # credentials may not (the Role has get only).
    now = mlsched.policy(POLICY)
    assert now["metadata"]["generation"] == generation and now["spec"] == frozen["spec"]
    retrainer = client.CustomObjectsApi(kube_config.new_client_from_config(str(job.kubeconfig)))
    with pytest.raises(ApiException) as refused:
        retrainer.patch_namespaced_custom_object(GROUP, VERSION, ns, "schedulingpolicies", POLICY,
                                                 {"spec": {"updatePolicy": "Manual"}})
    assert refused.value.status == 403

    # 5. Auto: the operator serves v1 from the next round (the edit back to short rounds
    # starts one at once).
    mlsched.patch_policy(POLICY, {"interval": SHORT_INTERVAL})
    adopted = wait_for(lambda: (a := active(mlsched)).get("version") == 1 and a, ROUND_TIMEOUT,
                       "Auto: v1 adopted at the next round",
                       describe=lambda: policy_status(mlsched).get("modelVersions"))
    assert adopted["source"] == "published" and adopted["sha256"] == version.sha256, adopted
    assert policy_status(mlsched)["modelVersion"] == "dl2 v1"
    assert policy_status(mlsched)["activeModels"]["allocation/dl2"] == version.sha256
    assert any(e.reason == "VersionAdopted" for e in mlsched.events(POLICY, "SchedulingPolicy"))
    # Decisions of the intervals after the consumed ones: the shipped model's until the
    # adopting round, v1's from it on.
    wait_for(lambda: any(d.model_version == "1" for r in records(api, ns)
                         if r.interval > intervals[-1] for d in r.decisions), ROUND_TIMEOUT,
             "a closed interval record with decisions of version 1",
             describe=lambda: [(r.interval, sorted({str(d.model_version) for d in r.decisions}))
                               for r in records(api, ns)][-4:])
    assert all(d.model_version != "1" for r in recorded for d in r.decisions)
