"""Harmony grouping against its own baselines (issue 51, part 4; sim/grouping_guard.py) and its
co-location model against the simulator's ground truth (sim/colocation_error.py)."""

from __future__ import annotations

import dataclasses

import pytest

from mlsched.policies import registry
from mlsched.sim.compare import Run, format_table
from mlsched.sim.simulator import SimConfig, Simulator
from mlsched.workloads import generators


def _run(trace, config: SimConfig, grouping: str):
    sim = Simulator(trace, config)
    ctx = registry.PolicyContext(speed_model=sim.speed)
    g = None if grouping == "none" else registry.make_grouping(grouping, ctx)
    return sim.run(registry.make_allocation("drf", ctx), registry.make_placement("load-balance"), g)


def _batch(jobs: int, seed: int):
    """The project's generator's jobs (models, lengths), all submitted at once."""
    return [dataclasses.replace(j, arrival_s=0.0) for j in generators.generate(jobs=jobs, seed=seed)]


# Sizes, loads and seeds unlike bench_grouping.py's (80 jobs on 100 nodes of 4 CPU, 1 GPU, seed 1).
@pytest.mark.parametrize("jobs,nodes,seed", [(12, 16, 31), (18, 8, 32), (10, 4, 33)])
def test_guarded_harmony_is_never_worse_than_isolated_or_none_when_every_job_is_known(jobs, nodes, seed):
    trace = _batch(jobs, seed)
    config = SimConfig(nodes=nodes, node_cpus=4, node_gpus=1, node_mem_gib=96, seed=seed)
    jct = {g: _run(trace, config, g).summary()["avg_jct_s"] for g in ("isolated", "none")}
    guarded = _run(trace, config, "harmony")
    alone = _run(trace, dataclasses.replace(config, grouping_guard=False), "harmony").summary()["avg_jct_s"]
    got = guarded.summary()["avg_jct_s"]
    assert got <= jct["isolated"] * (1 + 1e-9) and got <= jct["none"] * (1 + 1e-9)
    # the rollouts are the runs themselves here: the guarded run is exactly the best of the three
    assert got == pytest.approx(min(alone, *jct.values()), rel=1e-9)
    assert sum(guarded.grouping_choices.values()) == 1  # one decision: nobody arrives later


# Poisson arrivals from the generator (DRF, the default node) where the guard before the
# warm-up, margin and isolated-before-the-first-decision rule lost to isolated: 1.047 and
# 1.038 x its mean JCT (harmony chosen on a forecast of no or few arrivals, then newcomers
# waited and the switch to isolated moved jobs); and one where the replayed hour lost
# (1.007: harmony chosen on the last decision, with more arrivals forecast than came).
# All are in the design set of docs/grouping.md, "Never worse than its baselines". The last
# two are rows of its shipped table (guarded 1.000 x isolated on each): whole guarded runs of
# 24 rollouts a decision, 20-30 s each, so they are `figures` (make test's second step); the
# first stays in the fast tier. It never leaves the warm-up (no rollout runs), so the fast tier
# also has (6, 2, 1, 107), not in the design set: two decisions after the warm-up rolled out
# against the sampled futures, harmony earning one of them (0.88 x isolated, 0.84 x none).
@pytest.mark.parametrize("jobs,nodes,rate,seed", [
    (9, 10, 4, 100),
    (6, 2, 1, 107),
    pytest.param(20, 6, 3, 5, marks=pytest.mark.figures),
    pytest.param(16, 4, 2, 9, marks=pytest.mark.figures),
])
def test_guarded_harmony_is_never_worse_than_isolated_or_none_with_arrivals(jobs, nodes, rate, seed):
    trace = generators.generate(jobs=jobs, rate=rate, seed=seed)
    config = SimConfig(nodes=nodes, seed=seed)
    jct = {g: _run(trace, config, g).summary()["avg_jct_s"] for g in ("isolated", "none")}
    got = _run(trace, config, "harmony").summary()["avg_jct_s"]
    assert got <= jct["isolated"] * (1 + 1e-9) and got <= jct["none"] * (1 + 1e-9)


def test_isolated_governs_while_arrivals_are_young_and_others_must_beat_it_by_the_margin():
    from mlsched.sim.grouping_guard import GuardedGrouping

    guard = GuardedGrouping(registry.make_grouping("harmony", registry.PolicyContext()), lambda *_: 0.0)
    assert guard.in_force.name == "isolated"  # before the first decision
    guard._first_look = 0.0
    guard._seen = {"a": generators.generate(jobs=1, seed=1)[0]}  # arrived after the first look
    scores = {"harmony": 90.0, "isolated": 100.0, "none": 120.0}
    assert guard.pick(scores, now_s=1200.0) == "isolated"  # watched for less than history_s
    assert guard.pick(scores, now_s=3600.0) == "harmony"  # 10 % better: beyond the margin
    assert guard.pick({**scores, "harmony": 98.0}, now_s=3600.0) == "isolated"  # within 3 %
    guard._seen = {}  # every job there at the first look: the rollouts, no margin
    assert guard.pick({**scores, "harmony": 98.0}, now_s=0.0) == "harmony"


def test_with_sampled_futures_another_candidate_must_win_in_every_one_and_stays_while_ahead_on_the_mean():
    from mlsched.sim.grouping_guard import GuardedGrouping

    guard = GuardedGrouping(registry.make_grouping("harmony", registry.PolicyContext()), lambda *_: 0.0)
    guard._first_look = 0.0
    guard._seen = {"a": generators.generate(jobs=1, seed=1)[0]}  # arrived after the first look
    guard.choice = "isolated"
    iso = [100.0, 100.0, 100.0]
    assert guard.pick({"harmony": [90.0, 95.0, 96.0], "isolated": iso, "none": [120.0] * 3}, 3600.0) == "harmony"
    # 10 % better on the mean, but within the margin in one future: isolated
    assert guard.pick({"harmony": [80.0, 80.0, 98.0], "isolated": iso, "none": [120.0] * 3}, 3600.0) == "isolated"
    guard.choice, guard.choices["harmony"] = "harmony", 1  # in force: stays while ahead on the mean
    assert guard.pick({"harmony": [80.0, 80.0, 130.0], "isolated": iso, "none": [120.0] * 3}, 3600.0) == "harmony"
    assert guard.pick({"harmony": [90.0, 90.0, 130.0], "isolated": iso, "none": [120.0] * 3}, 3600.0) == "isolated"


def test_sampled_futures_are_reproducible_and_the_first_has_no_arrivals():
    from mlsched.sim.grouping_guard import GuardedGrouping

    guard = GuardedGrouping(registry.make_grouping("harmony", registry.PolicyContext()), lambda *_: 0.0)
    guard._first_look = 0.0
    guard._seen = {j.name: j for j in generators.generate(jobs=12, rate=3, seed=2)}
    assert len(guard.forecasts(1800.0)) == 1  # watched for less than history_s: the replay
    now = max(j.arrival_s for j in guard._seen.values()) + 600.0
    futures = guard.forecasts(now)
    assert len(futures) == guard.futures == 8 and futures[0] == []
    assert futures == guard.forecasts(now)  # seeded by the decision's time
    assert sum(map(len, futures[-4:])) > sum(map(len, futures[:4]))  # longer futures, more arrivals
    rows = {(j.model, j.epochs) for j in guard._seen.values()}
    assert all((j.model, j.epochs) in rows and j.arrival_s > now and j.name.startswith("~")
               for f in futures for j in f)


def test_a_fork_runs_on_from_where_the_simulator_stands_and_changes_nothing():
    trace = _batch(8, 34)
    config = SimConfig(nodes=6, seed=34, grouping_guard=False)
    whole = _run(trace, config, "isolated")
    sim = Simulator(trace, config)
    before = {n: (s.epochs_done, s.finish_s) for n, s in sim.states.items()}
    ctx = registry.PolicyContext(speed_model=sim.speed)
    grouping = registry.make_grouping("isolated", ctx)
    forked = sim.fork().run(registry.make_allocation("drf", ctx), registry.make_placement("load-balance"),
                            grouping)
    assert forked.jct_s == pytest.approx(whole.jct_s)
    assert {n: (s.epochs_done, s.finish_s) for n, s in sim.states.items()} == before


def test_colocation_model_error_is_measured_and_printed():
    trace = _batch(12, 35)
    config = SimConfig(nodes=4, node_cpus=4, node_gpus=1, node_mem_gib=96, seed=35, grouping_guard=False)
    result = _run(trace, config, "harmony")
    assert result.colocation_samples > 0  # harmony shared pools here: every slot of each member checked
    assert 0.0 <= result.colocation_mare < 1.0
    assert result.summary()["colocation_mare"] == result.colocation_mare
    text = format_table([Run("drf", "load-balance", result, "harmony")])
    assert "harmony co-location model vs the simulator's ground truth" in text
    assert f"{result.colocation_mare:.1%}" in text
