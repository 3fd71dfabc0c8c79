"""The regret guard in a simulation (`mlsched simulate --guard 10%:6`): the same rule and
replay as the operator's (policies/regret_guard.py, sim/regret_replay.py), fed by interval
records the simulator writes of its own run as the operator writes them of the cluster's.

The window rolls: once `window` slots have closed since the last change of who serves, at
every closed slot the latest `window` of them are replayed under the learned policy and the
fallback and judged (policies/regret_guard.py says why); a change (a trip, a clear) starts the
window empty, so each window was served by one policy (the one whose replay is checked against
the records). A window that cannot be replayed is counted and changes nothing: the learned
policy keeps serving, as in the operator.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from mlsched.cluster.types import Decision
from mlsched.policies.decision_log import IntervalRecord, JobInterval
from mlsched.policies.regret_guard import FALLBACK, LEARNED, Estimate, GuardSpec, GuardState, judge
from mlsched.sim.regret_replay import ReplayError, estimate, rfc3339

ARCH = {"ps": "ParameterServer", "allreduce": "AllReduce"}


@dataclass
class SimGuard:
    """A guard over one run: `fallback` and `fallback_placement` are what serves while it is
    tripped (spec.fallback and, for a learned placement, load-balance: the operator's rule)."""

    spec: GuardSpec
    fallback: object
    fallback_placement: object | None = None
    state: GuardState = field(default_factory=GuardState)
    records: list[IntervalRecord] = field(default_factory=list)
    estimates: list[Estimate] = field(default_factory=list)
    trips: int = 0
    clears: int = 0
    failures: list[str] = field(default_factory=list)
    fallback_rounds: int = 0
    first_trip_round: int | None = None
    # Per record (interval number), the run's cycle guard's memory when it closed
    # (controller/scheduling/guard.GuardBook.memories).
    memories: dict[int, dict] = field(default_factory=dict)

    def serving(self, allocation, placement) -> tuple:
        """The (allocation, placement) to run now."""
        if self.state.tripped:
            return self.fallback, self.fallback_placement or placement
        return allocation, placement

    def closed(self, sim, start_s: float, before: dict, decision: Decision, reward: float,
               learned: tuple) -> None:
        """A slot of `sim` closed (it started at `start_s`; `before`: each active job's epochs
        then): record it, and judge the window when it is full. `learned`: (allocation,
        placement) of the learned policy."""
        self.fallback_rounds += self.state.tripped
        self.records.append(interval_record(sim, start_s, before, decision, reward,
                                            sim.slot))
        cycles = getattr(sim, "cycle_guard", None)
        self.memories[self.records[-1].interval] = cycles.remembered() if cycles is not None else {}
        if len(self.records) < self.spec.window:
            return
        window = self.records = self.records[-self.spec.window:]
        self.memories = {r.interval: self.memories.get(r.interval, {}) for r in window}
        ran = FALLBACK if self.state.tripped else LEARNED
        try:
            est = estimate(window, sim.config, sim.node_names, learned,
                           (self.fallback, self.fallback_placement or learned[1]), ran,
                           self.memories.get(window[0].interval))
        except ReplayError as err:
            self.failures.append(str(err))
            return
        self.estimates.append(est)
        was = self.state.tripped
        self.state = judge(self.state, est, self.spec, sim.time_s)
        if self.state.tripped and not was:
            self.trips += 1
            if self.first_trip_round is None:
                self.first_trip_round = sim.slot
        elif was and not self.state.tripped:
            self.clears += 1
        if self.state.tripped != was:
            self.records = []  # the next window is served by the policy now serving

    def summary(self) -> dict:
        errors = [abs(e.error) for e in self.estimates]
        return {"guard_windows": len(self.estimates), "guard_trips": self.trips,
                "guard_clears": self.clears, "guard_fallback_rounds": self.fallback_rounds,
                "guard_first_trip_round": self.first_trip_round,
                "guard_failures": len(self.failures),
                "guard_mean_abs_error": sum(errors) / len(errors) if errors else None,
                "guard_last": self.state.last.describe() if self.state.last else ""}


def interval_record(sim, start_s: float, before: dict[str, float], decision: Decision,
                    reward: float, number: int) -> IntervalRecord:
    """The slot that just closed, as the operator records an interval: every job present at
    its start or arriving in it, its grant at the round, epochs then and trained since."""
    end_s = start_s + sim.last_slot_s
    jobs = []
    for s in sim.states.values():
        spec = s.spec
        if spec.name not in before and not (start_s < spec.arrival_s < end_s):
            continue
        d = decision.jobs.get(spec.name)
        at_start = before.get(spec.name, 0.0)
        trained = s.epochs_done - at_start
        ps = [sim.node_names[n] for n in d.ps_nodes] if d else []
        workers = [sim.node_names[n] for n in d.worker_nodes] if d else []
        jobs.append(JobInterval(
            name=spec.name, uid=spec.name, model_type=spec.model, architecture=ARCH[spec.arch],
            total_epochs=float(spec.epochs), created=rfc3339(spec.arrival_s), ps=len(ps),
            workers=len(workers), placement={"ps": ps, "worker": workers},
            epochs_at_start=float(at_start), epochs=float(trained),
            reward=float(trained / spec.epochs),
            finished=bool(s.finish_s is not None and s.finish_s >= start_s),
            min_ps=1 if spec.arch == "ps" else 0, max_ps=sim.config.max_ps if spec.arch == "ps" else 0,
            min_workers=1, max_workers=sim.config.max_workers))
    return IntervalRecord(namespace="sim", policy="sim", policy_uid="sim", interval=number,
                          start=rfc3339(start_s), end=rfc3339(end_s), length_s=sim.last_slot_s,
                          algorithms={}, nodes=len(sim.node_names), reward=float(reward), jobs=jobs)
