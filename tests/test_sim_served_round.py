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


def test_the_simulator_serves_rounds_as_the_operator_by_default_and_the_cli_can_decide_once(
        monkeypatch, tmp_path):
    """Since 30 Nov 2026 (issue 50) a simulation decides as the operator serves; `mlsched
    simulate --decided-once` keeps the rule the figures before were measured under."""
    from mlsched.cli import main

    assert SimConfig().served_round
    calls = []
    settled = round_module.run_settled_round
    monkeypatch.setattr(round_module, "run_settled_round",
                        lambda *a, **k: calls.append(1) or settled(*a, **k))
    trace = tmp_path / "t.csv"
    assert main(["trace", "generate", "--jobs", "8", "--seed", "5", "--out", str(trace)]) == 0
    argv = ["simulate", "--trace", str(trace), "--nodes", "6", "--policies", "drf", "--json"]
    assert main([*argv, "--decided-once"]) == 0 and not calls
    assert main(argv) == 0 and calls


def test_a_guarded_groupings_rollouts_decide_once_as_its_run_does(monkeypatch):
    """The guarded grouping bears harmony's name, so its run's rounds are never settled,
    whichever candidate governs (round.settles); its rollouts, `none`'s included, decide the
    same way (as the operator's, controller/scheduling/grouping_guard.py)."""
    import dataclasses

    forks = []
    fork_run = Simulator.run

    def spying_run(self, *args, **kwargs):
        forks.append(self.config.served_round)
        return fork_run(self, *args, **kwargs)

    def never_settled(*args, **kwargs):
        raise AssertionError("a round of the guarded run or of a rollout was settled")

    monkeypatch.setattr(Simulator, "run", spying_run)
    monkeypatch.setattr(round_module, "run_settled_round", never_settled)
    # All there at once: the guard rolls its candidates out at the first round.
    trace = [dataclasses.replace(j, arrival_s=0.0) for j in generators.generate(jobs=8, seed=4)]
    sim = Simulator(trace, SimConfig(nodes=6, seed=1))
    ctx = registry.PolicyContext(speed_model=sim.speed)
    result = sim.run(registry.make_allocation("drf", ctx), registry.make_placement("load-balance"),
                     registry.make_grouping("harmony", ctx))
    assert result.completed == len(trace)
    assert forks[0] is True and len(forks) > 1 and not any(forks[1:])  # the run, then its rollouts
