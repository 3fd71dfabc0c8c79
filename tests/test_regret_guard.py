"""The regret guard (issue 51, part 3): its rule (policies/regret_guard.py), the replay of a
recorded window (sim/regret_replay.py) and the guard in a simulation (sim/regret_guard.py)."""

from __future__ import annotations

import math

import pytest

from mlsched.policies import registry
from mlsched.policies.regret_guard import (
    FALLBACK, LEARNED, POOLED, Estimate, GuardSpec, GuardState, judge, on_generation,
    parse_threshold,
)
from mlsched.sim import chic_scenario
from mlsched.policies.round import run_round
from mlsched.sim.regret_guard import SimGuard, interval_record
from mlsched.sim.regret_replay import ReplayError, estimate, window_start
from mlsched.sim.simulator import SimConfig, Simulator
from mlsched.workloads import generators


def est(learned: float, fallback: float, recorded: float | None = None, ran: str = LEARNED) -> Estimate:
    replayed = learned if ran == LEARNED else fallback
    return Estimate(learned, fallback, replayed if recorded is None else recorded, ran, 6, 10)


# ---- the rule ---------------------------------------------------------------------------------
def test_spec_parses_percentages_fractions_and_refuses_nonsense():
    assert GuardSpec.parse("10%:6") == GuardSpec(0.10, 6)
    assert parse_threshold(0.25) == 0.25 and parse_threshold("0.5") == 0.5
    for bad in ("10", "x%:6", "10%:0", "10%:two", "-5%:3"):
        with pytest.raises(ValueError):
            GuardSpec.parse(bad)
    with pytest.raises(ValueError):
        parse_threshold(float("nan"))


def twice(e: Estimate, spec: GuardSpec, now: float = 0.0) -> GuardState:
    return judge(judge(GuardState(), e, spec, now), e, spec, now)


def test_trips_only_beyond_the_threshold_and_clears_only_when_the_model_is_ahead():
    spec = GuardSpec(0.10, 6)
    assert not twice(est(1.0, 1.09), spec).tripped  # within 10 %
    assert not judge(GuardState(), est(1.0, 1.5), spec, 5.0).tripped  # never one window alone
    state = twice(est(1.0, 1.5), spec, 10.0)
    assert state.tripped and state.since == 10.0 and state.recent == ()
    # Tripped: the fallback a little ahead, or level, keeps it tripped (no flapping).
    state = judge(state, est(1.0, 1.0, ran=FALLBACK), spec, 20.0)
    assert state.tripped and state.since == 10.0
    state = judge(state, est(1.3, 1.0, ran=FALLBACK), spec, 30.0)
    assert not state.tripped and state.since == 30.0


def test_a_replay_far_off_the_records_does_not_trip():
    spec = GuardSpec(0.10, 6)
    # 1.2 x ahead, but the replay of what ran is 30 % off what was recorded.
    assert not twice(est(1.0, 1.2, recorded=1.0 / 1.3), spec).tripped
    assert twice(est(1.0, 1.2, recorded=1.0), spec).tripped


def test_one_bad_window_among_good_ones_is_pooled_away():
    spec = GuardSpec(0.10, 6)
    state = GuardState()
    for good in (est(1.0, 0.8), est(1.0, 0.8)):
        state = judge(state, good, spec, 0)
    assert not judge(state, est(1.0, 1.25), spec, 0).tripped
    assert judge(state, est(1.0, 2.0), spec, 0).tripped  # bad enough to outweigh them


def judged(state: GuardState, ratios, spec=GuardSpec(0.10, 6)) -> list[bool]:
    """Rolling judgements of fallback / learned `ratios` in turn: tripped after each."""
    out = []
    for k, r in enumerate(ratios):
        state = judge(state, est(1.0, r), spec, float(k))
        out.append(state.tripped)
    return out


def test_rolling_judgements_trip_on_a_growing_loss_but_not_on_a_short_wobble():
    # A model outside its domain (chic on 30 nodes, seed 0's rolling windows from round 6):
    # level with the fallback, then losing more with every interval. Tripped three judgements
    # after the first one over the line (1.13 x, round 13), and stays tripped.
    growing = judged(GuardState(), [0.97, 0.91, 0.84, 0.92, 1.01, 1.07, 1.05, 1.13, 1.23, 1.30,
                                    1.34, 1.51, 1.80, 2.02])
    assert growing.index(True) == 10 and all(growing[10:])
    # Chic's own setting (seeds 300003 and 300000 at 2.7 jobs/h): four, then three rolling
    # windows in a row over the line among level ones: no trip.
    assert not any(judged(GuardState(), [0.93, 0.96, 1.08, 1.10, 1.05, 0.98, 1.01, 0.92, 1.24,
                                         1.17, 1.15, 1.23, 0.98, 0.87]))
    assert not any(judged(GuardState(), [0.86, 0.89, 0.92, 0.95, 1.06, 1.11, 1.21, 1.15, 1.06]))
    # A first window a hair over the line (seed 300002 at 1.8 jobs/h), then level: no trip.
    assert not any(judged(GuardState(), [1.11, 0.99, 0.82]))
    assert len(judge(GuardState(recent=(est(1, 1),) * POOLED), est(1, 1), GuardSpec(0.1, 6),
                     0).recent) == POOLED


def test_a_tripped_guard_clears_on_the_pooled_estimate_not_on_one_window():
    spec = GuardSpec(0.10, 6)
    state = twice(est(1.0, 2.0), spec)
    assert state.tripped and state.recent == ()
    for k, learned in enumerate((0.8, 0.9, 0.95)):  # the fallback ahead while it serves
        state = judge(state, est(learned, 1.0, ran=FALLBACK), spec, 1.0 + k)
    state = judge(state, est(1.2, 1.0, ran=FALLBACK), spec, 5.0)  # one window ahead: not enough
    assert state.tripped
    for k in range(3):
        state = judge(state, est(1.2, 1.0, ran=FALLBACK), spec, 6.0 + k)
    assert not state.tripped and state.since == 6.0  # the pooled estimate ahead (1.01 x)


def test_a_spec_edit_re_enables_the_model():
    state = on_generation(GuardState(), 3, 0.0)
    for _ in range(2):
        state = judge(state, est(1.0, 2.0), GuardSpec(0.1, 6), 5.0)
    assert state.tripped and state.generation == 3
    assert on_generation(state, 3, 6.0).tripped
    edited = on_generation(state, 4, 7.0)
    assert not edited.tripped and edited.generation == 4 and edited.since == 7.0


# ---- the replay -------------------------------------------------------------------------------
def guarded_run(trace, config, learned="chic", fallback="drf", guard="10%:6"):
    sim = Simulator(trace, config)
    ctx = registry.PolicyContext(speed_model=sim.speed)
    g = SimGuard(GuardSpec.parse(guard), registry.make_allocation(fallback, ctx))
    result = sim.run(registry.make_allocation(learned, ctx), registry.make_placement("load-balance"),
                     guard=g)
    return result, g


def plain_run(trace, config, policy):
    sim = Simulator(trace, config)
    ctx = registry.PolicyContext(speed_model=sim.speed)
    return sim.run(registry.make_allocation(policy, ctx), registry.make_placement("load-balance"))


def test_the_replay_of_what_ran_matches_its_records_and_a_bad_window_is_an_error():
    trace = generators.generate(jobs=30, seed=41)
    result, g = guarded_run(trace, SimConfig(nodes=13, seed=41), learned="drf", guard="10%:4")
    assert g.estimates and not g.failures
    # The window rolls: judged at every round from the 4th on (no trip to start it afresh).
    assert g.trips == 0 and len(g.estimates) == result.rounds - 3
    # The same policy on both sides: the estimates agree, and the replay tracks the records.
    for e in g.estimates:
        assert e.learned == pytest.approx(e.fallback)
        assert abs(e.error) < 0.10, e.describe()
    with pytest.raises(ReplayError, match="no closed intervals"):
        window_start([])


def test_a_window_of_unknown_models_cannot_be_replayed():
    sim = Simulator(generators.generate(jobs=10, seed=5), SimConfig(nodes=6, seed=5))
    drf, lb = registry.make_allocation("drf"), registry.make_placement("load-balance")
    window = []
    while not sim.done and len(window) < 3:
        before, start = {s.spec.name: s.epochs_done for s in sim.active}, sim.time_s
        decision = run_round(sim.snapshot(), drf, lb)
        window.append(interval_record(sim, start, before, decision, sim.advance(decision), sim.slot))
    assert estimate(window, sim.config, sim.node_names, (drf, lb), (drf, lb), LEARNED).jobs > 0
    for r in window:
        for j in r.jobs:
            j.model_type = "my-own-model"
    with pytest.raises(ReplayError, match="outside the catalog"):
        estimate(window, sim.config, sim.node_names, (drf, lb), (drf, lb), LEARNED)


# ---- what it must show (issue 51) -------------------------------------------------------------
# Held-out seeds: the guard's rule was set on seeds 0-4 (30 nodes) and 300000-300004 (Chic's);
# 21-25 and 300020-300021 were only measured (bench/bench_regret_guard.py, also 31-35).
# Marked `figures`: whole guarded simulations (about 50 s on one core), in make test's second step.
@pytest.mark.figures
def test_guarded_chic_on_a_cluster_unlike_its_training_is_near_the_fallback():
    """Five 80-job traces on 30 nodes of 8 CPUs and 2 GPUs (chic saw one 10-GPU pool): the
    guarded chic's average JCT over drf's (the fallback) is at most 1.10 on each (measured:
    0.955, 0.971, 1.019, 0.974, 0.955; unguarded chic 2.0-2.7 x): the guard judges a rolling
    window of 6 intervals at every interval, pooled with the judgements before it, and trips
    at rounds 7-15 (non-overlapping windows: 6-18, up to 1.13 x)."""
    ratios = []
    for seed in (21, 22, 23, 24, 25):
        trace = generators.generate(jobs=80, seed=seed)
        config = SimConfig(nodes=30, seed=seed)
        fallback = plain_run(trace, config, "drf").summary()["avg_jct_s"]
        unguarded = plain_run(trace, config, "chic").summary()["avg_jct_s"]
        result, g = guarded_run(trace, config)
        assert unguarded > 1.4 * fallback  # the failure the guard is for is there
        assert g.trips >= 1 and g.first_trip_round is not None
        assert all(math.isfinite(e.error) for e in g.estimates)
        ratios.append(result.summary()["avg_jct_s"] / fallback)
    assert max(ratios) <= 1.10, ratios


@pytest.mark.figures
@pytest.mark.parametrize("seed", [300020, 300021])
def test_the_guard_does_not_trip_where_chic_was_trained(seed):
    for rate in chic_scenario.RATES_PER_HOUR:
        trace = chic_scenario.trace(rate, seed)
        result, g = guarded_run(trace, chic_scenario.config(seed))
        assert g.estimates, "no window judged"
        assert g.trips == 0, (rate, [e.describe() for e in g.estimates])


# ---- mlsched simulate --guard ----------------------------------------------------------------
def test_simulate_guard_reports_the_guarded_runs_only():
    from mlsched.sim import compare

    trace = generators.generate(jobs=25, seed=8)
    runs = compare.run_pairs(trace, SimConfig(nodes=10, seed=8), ["drf", "chic"], ["load-balance"],
                             guard=GuardSpec.parse("10%:3"))
    assert runs[0].guard is None and runs[1].guard is not None
    assert runs[1].guard["guard_windows"] >= 1
    text = compare.format_table(runs)
    assert "regret guard" in text and "chic / load-balance:" in text.split("regret guard")[1]
    with pytest.raises(ValueError, match="heuristic allocation"):
        compare.run_pairs(trace, SimConfig(nodes=10), ["chic"], ["load-balance"],
                          guard=GuardSpec.parse("10%:3"), fallback="chic")


def test_simulate_refuses_a_malformed_guard(capsys):
    from mlsched import cli

    assert cli.main(["simulate", "--policies", "chic", "--guard", "ten"]) == 2
    assert "THRESHOLD:WINDOW" in capsys.readouterr().err
