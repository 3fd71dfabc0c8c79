"""The guard over a learned placement (issue 51, part 4; policies/placement/guarded.py): both
layouts scored by the model the simulator runs, the better one served."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from mlsched.policies import registry
from mlsched.policies.base import PlacementRequest
from mlsched.policies.exploration import Serving
from mlsched.policies.placement.guarded import GuardedPlacement
from mlsched.policies.placement.heuristics import BinPack
from mlsched.policies.placement.interference_aware import LeastInterferenceFirst
from mlsched.policies.placement.sticky import Sticky
from mlsched.policies.round import run_round
from mlsched.sim import scenarios
from mlsched.sim.simulator import SimConfig, Simulator


def _sim(nodes=6, seed=3, jobs=8):
    trace = [replace(j, arrival_s=0.0) for j in scenarios.placement_trace(nodes, seed)[:jobs]]
    return Simulator(trace, SimConfig(nodes=nodes, seed=seed))


class _Spy:
    """Wraps a placement: remembers the request it was asked to place."""

    def __init__(self, inner):
        self.inner, self.name, self.requests = inner, inner.name, []
        self.learned = inner.learned

    def choose_node(self, *args):
        return self.inner.choose_node(*args)

    def place(self, request: PlacementRequest):
        self.requests.append(request)
        return self.inner.place(request)


def test_the_score_is_the_simulators_reward_rate_of_the_layout():
    sim = _sim()
    guard = GuardedPlacement(Sticky(BinPack()), Sticky(LeastInterferenceFirst(1)), speed=sim.speed)
    spy = _Spy(guard)
    decision = run_round(sim.snapshot(), registry.make_allocation("fixed"), spy)
    (request,) = spy.requests
    predicted = guard.score(request, decision.jobs)
    sim._apply(decision, cost_cap=0.0, only_idle=False)
    rates = sim._rates()
    truth = sum(rates[s.spec.name] / s.spec.epochs for s in sim.active if s.worker_nodes)
    assert predicted == pytest.approx(truth, rel=1e-9)


@pytest.mark.parametrize("packed_first", [True, False])
def test_the_layout_the_model_scores_higher_is_served_whichever_side_it_is(packed_first):
    sim = _sim()
    packed, spread = Sticky(BinPack()), Sticky(LeastInterferenceFirst(1))
    learned, fallback = (packed, spread) if packed_first else (spread, packed)
    guard = GuardedPlacement(learned, fallback, speed=sim.speed)
    spy = _Spy(guard)
    decision = run_round(sim.snapshot(), registry.make_allocation("fixed"), spy)
    (request,) = spy.requests
    plain = replace(request, tentative_placer=None)
    by_packed, by_spread = packed.place(plain), spread.place(plain)
    assert by_packed != by_spread  # bin-packing co-locates what LIF spreads
    better = max((by_packed, by_spread), key=lambda d: guard.score(request, d))
    assert guard.score(request, by_packed) != guard.score(request, by_spread)
    assert decision.jobs == better
    learned_won = (better is by_packed) == packed_first
    assert guard.choices == {("learned" if learned_won else "fallback"): 1}
    assert (guard.gains[0] > 0) == learned_won


def test_a_margin_keeps_the_fallback_unless_the_gain_exceeds_it():
    sim = _sim()
    guard = GuardedPlacement(Sticky(LeastInterferenceFirst(1)), Sticky(BinPack()), speed=sim.speed,
                             min_gain=np.inf)
    run_round(sim.snapshot(), registry.make_allocation("fixed"), guard)
    assert guard.choices == {"fallback": 1}


def test_a_run_under_the_guard_is_no_worse_than_the_fallback_where_the_learned_side_loses():
    # bin-pack stands in for a learned placement that loses to LIF-Line on this trace.
    trace = scenarios.placement_trace(8, 424242)
    jct = {}
    for name, placement in (("lif", Sticky(LeastInterferenceFirst(1))),
                            ("packed", Sticky(BinPack())),
                            ("guarded", GuardedPlacement(Sticky(BinPack()), Sticky(LeastInterferenceFirst(1))))):
        sim = Simulator(trace, SimConfig(nodes=8, seed=424242))
        summary = sim.run(registry.make_allocation("fixed"), placement).summary()
        assert summary["completed"] == summary["jobs"]
        jct[name] = summary["avg_jct_s"]
    assert jct["packed"] > 1.05 * jct["lif"]
    assert jct["guarded"] <= jct["lif"] * 1.001


def test_harmony_in_the_registry_is_guarded_by_lif_line_and_the_flag_turns_it_off():
    placement = registry.make_placement("harmony")
    assert isinstance(placement, GuardedPlacement) and placement.name == "harmony"
    assert placement.card.algorithm == "harmony"
    assert isinstance(placement.fallback, Sticky) and placement.fallback.name == "lif-line"
    alone = registry.make_placement("harmony", registry.PolicyContext(placement_guard=False))
    assert isinstance(alone, Sticky) and alone.name == "harmony"
    assert not GuardedPlacement(Sticky(BinPack()), Sticky(BinPack())).learned


def test_rounds_that_record_or_explore_serve_the_network_alone_others_stay_guarded():
    placement = registry.make_placement("harmony")
    recorded = placement.for_round(Serving(0.5, np.random.default_rng(0)))
    assert isinstance(recorded, Sticky)
    guarded = placement.for_round(Serving(0.0))
    assert isinstance(guarded, GuardedPlacement) and guarded.choices is placement.choices


def test_a_run_reports_the_decisions_each_side_won_and_the_table_prints_them():
    from mlsched.sim import compare

    trace = scenarios.placement_trace(6, 31)
    runs = compare.run_pairs(trace, SimConfig(nodes=6, seed=31), ["fixed"], ["lif-line", "harmony"])
    lif, harmony = (r.result for r in runs)
    assert lif.placement_choices == {}
    assert sum(harmony.placement_choices.values()) > 0
    assert set(harmony.placement_choices) <= {"learned", "fallback"}
    assert harmony.summary()["placement_choices"] == harmony.placement_choices
    assert "the network's layout served in" in compare.format_table(runs)
    # A second run of the same policy object counts its own decisions only.
    again = compare.run_pairs(trace, SimConfig(nodes=6, seed=31), ["fixed", "fixed"], ["harmony"])
    assert again[0].result.placement_choices == again[1].result.placement_choices == harmony.placement_choices
