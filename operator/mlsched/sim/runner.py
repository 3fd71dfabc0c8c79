"""A whole run of the simulator under a set of policies (Simulator.run): every round decided
(once, or settled as the operator serves it, learned rounds through the cycle guard), the
guards around the policies (regret, grouping and placement rollouts), admission steps
between rounds, and each round's work-conservation and model-domain checks.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

from mlsched.policies.cycle_guard import CycleGuard
from mlsched.policies.model_domain import DomainTally, served_cards, shape_of
from mlsched.policies.round import run_admission, run_round, run_served_round, settles
from mlsched.policies.work_conservation import IdleCapacity, idle_capacity
from mlsched.sim.grouping_guard import GuardedGrouping, simulator_rollout
from mlsched.sim.placement_guard import RolloutPlacement
from mlsched.sim.result import SimResult


def run(sim, allocation, placement, grouping=None, progress=None, guard=None) -> SimResult:
    """`sim` (a Simulator: this module cannot import it, which imports this) run to the end,
    or to its max_slots, under these policies; `guard`: a sim.regret_guard.SimGuard serving
    its fallback while it is tripped."""
    rollout_placement = None  # harmony placement judged by rollouts (sim/placement_guard.py)
    if (sim.config.placement_rollout and guard is None and getattr(placement, "name", None) == "harmony"
            and getattr(grouping, "name", "none") == "none"):
        placement = rollout_placement = RolloutPlacement(placement, sim, allocation)
    learned = (allocation, placement)
    if guard is not None:  # the policies in force are the guard's choice, round by round
        def allocation_now():
            return guard.serving(*learned)[0]

        def placement_now():
            return guard.serving(*learned)[1]
    else:
        def allocation_now():
            return learned[0]

        def placement_now():
            return learned[1]
    if grouping is not None and sim.config.grouping_guard and getattr(grouping, "name", None) == "harmony":
        grouping = GuardedGrouping(grouping, simulator_rollout(sim, allocation, placement))
    # The guard decides at full rounds, where its rollouts start; admission steps use the
    # grouping it chose (a switch there could not move running jobs: round.admissible).
    admit = ((lambda snapshot: run_admission(snapshot, allocation_now(), placement_now(),
                                             getattr(grouping, "in_force", grouping)))
             if sim.config.admission == "arrival" else None)
    idle: list[IdleCapacity] = []  # one per round: what it left idle (work conservation)
    domain = DomainTally.of(served_cards(grouping, allocation, placement))
    # Rounds decided as the operator serves them (round.run_served_round, the default): a
    # heuristic round settled, one it does not settle (a learned phase, a grouping) through
    # the cycle guard. SimConfig.served_round False decides every round once.
    sim.cycle_guard = CycleGuard() if sim.config.cycle_guard else None
    placed_before = Counter(getattr(placement, "choices", {}))  # a guarded placement's tally
    while not sim.done:
        snapshot = sim.snapshot()
        if rollout_placement is not None:
            rollout_placement.round_starts(snapshot)
        domain.add(shape_of(snapshot))
        phases = (allocation_now(), placement_now())
        if sim.config.served_round:
            decision = run_served_round(snapshot, *phases, grouping, guard=sim.cycle_guard)
        else:
            decision = run_round(snapshot, *phases, grouping)
            if sim.cycle_guard is not None and not settles(*phases, grouping):
                decision = sim.cycle_guard.apply(snapshot, decision)
        idle.append(idle_capacity(snapshot, decision))
        before = {s.spec.name: s.epochs_done for s in sim.active}
        start = sim.time_s
        reward = sim.advance(decision, admit)
        if guard is not None:
            guard.closed(sim, start, before, decision, reward, learned)
        if progress is not None:
            progress(sim.finished)
    return replace(sim.result(idle), domain_rounds=domain.rounds,
                   rounds_outside_domain=domain.outside_rounds,
                   outside_domain=domain.outside(), no_domain=domain.unknown,
                   grouping_choices=dict(getattr(grouping, "choices", {})),
                   placement_choices=dict(Counter(getattr(placement, "choices", {})) - placed_before))
