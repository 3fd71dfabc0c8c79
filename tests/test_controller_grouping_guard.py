"""Harmony's grouping guard and co-location error in the operator
(controller/scheduling/grouping_guard.py; docs/grouping.md, "In the cluster"), seen from the
user's side against the in-memory API: status.grouping, Events, metric."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from mlsched.cluster.types import PoolForecast, PoolPlan, Snapshot
from mlsched.controller.kube.constants import POOL_LABEL
from mlsched.controller.scheduling import grouping_guard, loop
from builders import NOW, NS, cluster, create_jobs, make_runtime, policy, recorded, run

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "e2e"))
from mlsched_objects import mljob  # noqa: E402

KEY = (NS, "default")


def _jobs(*names_models):
    out = []
    for name, model in names_models:
        body = mljob(name, model=model)
        body["metadata"]["namespace"] = NS
        out.append(body)
    return out


def _round(rt, kube, now=NOW):
    return recorded(rt, loop.run_policy_round(rt, kube.obj("SchedulingPolicy", NS, "default"),
                                              kube.indexes(), now=now))


def _status(kube):
    return kube.obj("SchedulingPolicy", NS, "default")["status"]


def _world(nodes=3, guard=True, jobs=(("a", "dssm"), ("b", "wlm"), ("r", "resnet-50"))):
    rt, kube = make_runtime(cluster(nodes), label_nodes=True)
    kube.put(policy(grouping="harmony", pools={"minStaySeconds": 0, "guard": guard}))
    run(create_jobs(rt, kube, *_jobs(*jobs)))
    return rt, kube


def test_the_guard_compares_harmony_with_isolated_and_none_and_says_which_governs():
    # Three short jobs on three nodes: the rollouts find each job alone on its node best (the
    # simulator's verdict on these jobs: co-location slows both members, none lets placement
    # pack them).
    rt, kube = _world()
    _round(rt, kube)
    grouping = _status(kube)["grouping"]
    assert set(grouping["estimates"]) == {"harmony", "isolated", "none"}
    best = min(grouping["estimates"], key=grouping["estimates"].get)
    assert grouping["governing"] == best == "isolated"
    assert grouping["governingSince"] and grouping["governingMessage"].startswith("isolated governs")
    assert grouping["colocationSamples"] == 0 and "colocationError" not in grouping
    events = [e for e in kube.events("default") if e["reason"] == "GroupingGoverned"]
    assert len(events) == 1 and events[0]["message"].startswith("isolated governs (was harmony)")
    # What isolated serves: every job on a pool of its own, labelled; no job shares a node.
    groups = _status(kube)["groups"]
    assert sorted(m for g in groups for m in g["members"]) == ["a", "b", "r"]
    assert all(len(g["members"]) == 1 and g["share"] == 1 for g in groups)
    assert sorted(v for v, _ in _labelled(kube).values()) == sorted(g["name"] for g in groups)
    # Nothing new: no new decision, no Event, the same estimates.
    kube.settle()
    _round(rt, kube, now=NOW + 60)
    assert _status(kube)["grouping"]["estimates"] == grouping["estimates"]
    assert _status(kube)["grouping"]["governingSince"] == grouping["governingSince"]
    assert [e["reason"] for e in kube.events("default")].count("GroupingGoverned") == 1


def _labelled(kube):
    return {n["metadata"]["name"]: ((n["metadata"].get("labels") or {}).get(POOL_LABEL), None)
            for n in kube.of_kind("Node") if POOL_LABEL in (n["metadata"].get("labels") or {})}


def test_an_arrival_decides_again_and_admission_steps_use_the_candidate_in_force():
    rt, kube = _world(nodes=4)
    _round(rt, kube)
    first = _status(kube)["grouping"]["estimates"]
    kube.settle()
    run(create_jobs(rt, kube, *_jobs(("c", "seq2seq"))))
    admitted = recorded(rt, loop.run_policy_admission(
        rt, kube.obj("SchedulingPolicy", NS, "default"), kube.indexes(), now=NOW + 30))
    # isolated governs: the newcomer takes the free node's partition at once, in a pool alone.
    assert admitted is not None and admitted.targets["c"].count("worker")
    assert admitted.targets["c"].pool and admitted.targets["c"].pool.startswith(f"{NS}.default.iso")
    assert _status(kube)["grouping"]["estimates"] == first  # an admission step never decides
    _round(rt, kube, now=NOW + 60)
    grouping = _status(kube)["grouping"]
    assert grouping["estimates"] != first  # the first round after the arrival decided again
    assert grouping["governing"] == min(grouping["estimates"], key=grouping["estimates"].get)


def test_without_pools_guard_harmony_runs_alone_and_status_shows_no_guard():
    rt, kube = _world(guard=False)
    _round(rt, kube)
    grouping = _status(kube)["grouping"]
    assert "governing" not in grouping and "estimates" not in grouping
    assert KEY not in rt.scheduling.per_policy.grouping_guards
    groups = _status(kube)["groups"]
    assert {m for g in groups for m in g["members"]} == {"a", "b"}  # harmony's pool


def test_a_failed_rollout_keeps_the_candidate_in_force_and_says_why(monkeypatch):
    def broken(*_args, **_kw):
        raise ValueError("no catalog")

    monkeypatch.setattr(grouping_guard, "simulator_of", broken)
    rt, kube = _world()
    _round(rt, kube)
    grouping = _status(kube)["grouping"]
    assert grouping["governing"] == "harmony" and not grouping.get("estimates")
    assert "the rollouts failed, harmony stays in force: no catalog" in grouping["governingMessage"]
    assert not [e for e in kube.events("default") if e["reason"] == "GroupingGoverned"]
    assert {m for g in _status(kube)["groups"] for m in g["members"]} == {"a", "b"}


def test_the_co_location_error_compares_the_models_speed_with_the_reported_one(monkeypatch):
    rt, kube = _world()
    # harmony in force and every job known: the rounds decide nothing (no rollout).
    guard = grouping_guard.ClusterGuard(None, 60.0)
    guard._known = frozenset({"a", "b", "r"})
    rt.scheduling.per_policy.grouping_guards[KEY] = guard
    _round(rt, kube)
    kube.settle()
    pool = _status(kube)["groups"][0]
    assert sorted(pool["members"]) == ["a", "b"] and _status(kube)["grouping"]["governing"] == "harmony"
    assert _status(kube)["grouping"]["colocationSamples"] == 0  # nobody ran in the pool yet
    for name, speed in (("a", 0.02), ("b", 0.01), ("r", 0.05)):
        rt.jobs.progress[(NS, name)] = (1.0, 10.0, speed, None)
    seen = []
    samples = grouping_guard.colocation_samples
    monkeypatch.setattr(grouping_guard, "colocation_samples",
                        lambda *a, **kw: seen.extend(samples(*a, **kw)) or seen)
    _round(rt, kube, now=NOW + 60)
    grouping = _status(kube)["grouping"]
    # the pool's two members, at the speeds they reported; r is in no pool
    assert sorted(o for _, o in seen) == [0.01, 0.02] and grouping["colocationSamples"] == 2
    error = sum(abs(p / o - 1) for p, o in seen) / 2
    assert grouping["colocationError"] == pytest.approx(error, rel=1e-5)
    metrics = rt.process.metrics.render().decode()
    assert f'mlsched_colocation_model_error{{namespace="{NS}",policy="default"}}' in metrics


def test_colocation_samples_by_hand():
    from conftest import job as view
    from mlsched.policies.grouping.profiles import profile_table

    a, b = view("a", model="dssm", ps=1, workers=1, pool="g0"), view("b", model="wlm", ps=1,
                                                                     workers=1, pool="g0")
    snap = Snapshot(NOW, 60.0, ["n0"], [[8.0, 2.0, 48.0]], [a, b])
    plan = PoolPlan({"a": "g0", "b": "g0"}, ("g0",), {"g0": 2}, True,
                    {"g0": PoolForecast(2.0, 0.6, 0.8, 2, 1)})
    C, N = profile_table([a, b], 16)
    alone = [j.prior.epochs_per_s(1, 1) * float(C[i, 1] + N[i, 1]) / 2.0 for i, j in enumerate((a, b))]
    out = grouping_guard.colocation_samples(snap, plan, {"a": (1, 1), "b": (1, 1)},
                                            {"a": alone[0] * 2, "b": alone[1] / 2})
    flat = [x for pair in out for x in pair]
    assert flat == pytest.approx([alone[0], alone[0] * 2, alone[1], alone[1] / 2])
    # a job that moved or changed counts this round, or reports nothing, is no sample
    assert grouping_guard.colocation_samples(snap, plan, {"a": (1, 2), "b": (1, 1)},
                                             {"a": 1.0}) == []
    guard = grouping_guard.ClusterGuard(None, 60.0)
    grouping_guard.add_error(guard, out)
    assert guard.colocation.mare == pytest.approx((0.5 + 1.0) / 2)


def test_a_rollout_failing_after_a_decision_removes_the_old_estimates(monkeypatch):
    rt, kube = _world(nodes=4)
    _round(rt, kube)
    assert _status(kube)["grouping"]["governing"] == "isolated"
    kube.settle()

    def broken(*_args, **_kw):
        raise ValueError("no catalog")

    monkeypatch.setattr(grouping_guard, "simulator_of", broken)
    run(create_jobs(rt, kube, *_jobs(("c", "seq2seq"))))
    _round(rt, kube, now=NOW + 60)
    grouping = _status(kube)["grouping"]
    assert grouping["governing"] == "isolated" and not grouping.get("estimates")
    assert grouping["governingMessage"].startswith("the rollouts failed, isolated stays in force")
