"""SimConfig.served_round: the simulator decides each round as the operator serves it
(round.run_served_round): heuristic rounds settled, learned ones through the cycle guard."""

from __future__ import annotations

from mlsched.policies import registry, round as round_module
from mlsched.sim.simulator import SimConfig, Simulator
from mlsched.workloads import generators


def _settled_rounds(monkeypatch, served: bool, allocation: str) -> int:
    calls = []
    settled = round_module.run_settled_round

    def counting(*args, **kwargs):
        calls.append(1)
        return settled(*args, **kwargs)

    monkeypatch.setattr(round_module, "run_settled_round", counting)
    trace = generators.generate(jobs=10, rate=6.0, seed=3)
    result = Simulator(trace, SimConfig(nodes=6, seed=1, served_round=served)).run(
        registry.make_allocation(allocation), registry.make_placement("load-balance"))
    assert result.completed == len(trace)
    return len(calls)


def test_heuristic_rounds_are_settled_only_when_served(monkeypatch):
    assert _settled_rounds(monkeypatch, False, "drf") == 0
    assert _settled_rounds(monkeypatch, True, "drf") > 0


def test_learned_rounds_are_never_settled(monkeypatch):
    assert _settled_rounds(monkeypatch, True, "dl2") == 0
