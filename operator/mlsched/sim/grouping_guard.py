"""Harmony grouping never worse than its own baselines (issue 51, part 4; docs/grouping.md).

Harmony's search picks groups by its co-location model (policies/grouping/model.py over the
jobs' profiles). The simulator runs something else: the allocation and placement policies
decide each job's counts and nodes inside its pool, the co-location rule applies per node
(sim/colocation.py), interference from other groups on a node comes on top, and a newcomer
may wait for a regrouping. Where the two disagree, harmony can lose to keeping every job
alone (`isolated`), one of the groupings its own search could return, or to no grouping.

So at the first full round after an arrival (a job the last decision did not know)
`GuardedGrouping` asks the simulator itself which of the three does best from here: per
candidate, a rollout of the simulator as it stands (Simulator.fork: the active jobs with
their progress, tasks and pools, under the same allocation, placement, speed, interference
and co-location models) to the end; the candidate with the lowest summed JCT governs until
the next arrival. Admission steps between rounds use the grouping in force (`in_force`): a
switch there could not move running jobs, so newcomers would wait, which a rollout starting
with a full round does not see (deciding there too measured 1.17 x isolated where this is
1.04 x, docs/grouping.md). A completion does not re-decide: the rollout that chose saw it
coming. Ties go to the candidate in force (no needless regrouping), then harmony, isolated,
none.

Future arrivals are not known; their rate and mix so far are. Without them a rollout of the
known jobs alone favours giving those every node now, and newcomers then wait. So each
candidate is rolled out against `futures` (8) sampled futures (forecast.sampled): arrivals
as a Poisson process at the rate seen (arrivals since the first look over the time watched),
each job a row of those seen (model, epochs, arch) drawn at random, seeded by the decision's
time so that a run is reproducible. How long the arrivals go on is not known either: the
futures last the exponential distribution's quantiles k/K (k = 0..K-1) of a mean equal to
the time watched (a process watched for T lasts about T more), at most 4 x `history_s`, so
the first future has no arrivals at all and the last the most. (One replay of the last
hour's arrivals, the forecast before, left 7 of 31 traces of docs/grouping.md above
isolated: the trace's end, an hour of arrivals that never came, and one long job misled it.)

That forecast is noisy, and its errors cost most one way: a rollout that
under-counts the load to come favours harmony and none (which hand the known jobs every
node) over `isolated`, the baseline that gives a newcomer a free node at once and moves no
one. So `isolated` is the default and the others must earn their place:
- before the first decision, admission steps admit under `isolated` (nothing has been
  rolled out yet; harmony would make every newcomer after the first wait for the round);
- while arrivals have been watched for less than `history_s`, the forecast replays less
  than the hour it stands for: `isolated` governs (the rollouts still run, for the report).
  Jobs all there at the first look are no arrival process: with none arriving after it the
  rollouts are trusted at once;
- after that, harmony or none replaces isolated only where its rollout beats isolated's by
  `margin` (3 %) in every sampled future (a candidate that wins by less, or loses in one, is
  within the forecast's noise); once in force it stays while its mean over the futures is
  below isolated's (switching back moves jobs, and one bad future alone made the guard
  flip-flop: docs/grouping.md).

When every job is known at the first decision (bench_grouping.py: all at t=0) no job arrives
after the first look: the rollouts are the runs themselves, compared with no margin, so the
guarded run is the best of the three exactly. With arrivals it is a forecast: measured in
docs/grouping.md, "Never worse than its baselines".
"""

from __future__ import annotations

from collections import Counter
from typing import Callable

from mlsched.cluster.types import PoolPlan, Snapshot
from mlsched.policies.grouping.none import NoGrouping
from mlsched.policies.grouping.partitions import isolated
from mlsched.sim.forecast import futures_since, note_arrivals, replayed, rollout_jct
from mlsched.workloads.traces import TraceJob

Rollout = Callable[[list[TraceJob], object], float]  # (future arrivals, grouping or None) -> Σ JCT
HORIZON_CAP = 4.0  # a sampled future lasts at most this many history_s


class GuardedGrouping:
    """`inner` (harmony) or one of its baselines, whichever a rollout says is best."""

    def __init__(self, inner, rollout: Rollout, history_s: float = 3600.0, margin: float = 0.03,
                 futures: int = 8):
        self.name = getattr(inner, "name", "harmony")  # what runs, to rounds and reports
        self.inner = inner
        self.candidates = {self.name: inner, "isolated": isolated(), "none": NoGrouping()}
        self.rollout = rollout
        self.history_s = history_s
        self.margin = margin
        self.futures = futures
        self.choice = self.name
        self.choices: Counter[str] = Counter()  # decisions won per candidate (the report)
        self._known: frozenset[str] | None = None
        self._seen: dict[str, TraceJob] = {}  # every job seen, as it arrived (the history)
        self._first_look: float | None = None  # time of the first snapshot: watched since

    def group(self, snapshot: Snapshot) -> PoolPlan:
        if self._first_look is None:
            self._first_look = snapshot.time_s
        names = frozenset(j.name for j in snapshot.jobs)
        note_arrivals(self._seen, snapshot)
        if names and (self._known is None or not names <= self._known):
            self.choice = self._best(snapshot.time_s)
            self.choices[self.choice] += 1
        self._known = names  # after a completion only, the choice stands
        return self.candidates[self.choice].group(snapshot)

    @property
    def in_force(self):
        """The grouping chosen: what admission steps between rounds use; before the first
        decision, `isolated` (the module doc)."""
        return self.candidates["isolated" if not self.choices else self.choice]

    def _best(self, now_s: float) -> str:
        if self.warming_up(now_s):
            return "isolated"  # `pick` says so whatever the rollouts: none run
        order = [self.choice] + [c for c in self.candidates if c != self.choice]
        futures = self.forecasts(now_s)
        scores = {name: [self.rollout(arrivals, None if name == "none" else self.candidates[name])
                         for arrivals in futures] for name in order}
        return self.pick(scores, now_s)

    def warming_up(self, now_s: float) -> bool:
        """Jobs arrived after the first look, watched for less than `history_s`."""
        return self.arrived() and now_s - self._first_look < self.history_s

    def forecasts(self, now_s: float) -> list[list[TraceJob]]:
        """The futures each candidate is rolled out against: `futures` sampled ones (the
        module doc) once arrivals have been watched for `history_s`; before, or with no
        arrival after the first look, one: the replayed history (`expected_arrivals`; none
        at all without arrivals)."""
        if not self.arrived() or self.warming_up(now_s) or self.futures <= 0:
            return [self.expected_arrivals(now_s)]
        return futures_since(self._seen, self._first_look, now_s, self.futures,
                             HORIZON_CAP * self.history_s)

    def arrived(self) -> bool:
        """Some job arrived after the guard's first look: an arrival process, forecast by
        the history. None did (every job was there at the first look, bench_grouping.py):
        the rollouts are the runs themselves, trusted as they are."""
        return self._first_look is not None and any(j.arrival_s > self._first_look
                                                    for j in self._seen.values())

    def pick(self, scores: dict[str, float | list[float]], now_s: float) -> str:
        """The candidate to govern given each one's rollouts (summed JCT, one per future, in
        the same order for every candidate; a number is one future). With arrivals:
        `isolated` while they have been watched for less than `history_s`, after that the
        lowest mean of those that beat isolated's by `margin` in every future, and the one
        in force (decided before, not isolated) while its mean is below isolated's; else
        isolated. Without: the lowest. Ties: the one in force, then harmony, isolated, none."""
        margin = 0.0
        if self.arrived():
            if now_s - self._first_look < self.history_s:
                return "isolated"
            margin = self.margin
        runs = {n: [float(v)] if isinstance(v, (int, float)) else [float(x) for x in v]
                for n, v in scores.items()}
        mean = {n: sum(v) / len(v) for n, v in runs.items()}

        def fits(name: str) -> bool:
            if name == "isolated":
                return True
            if name == self.choice and self.choices:  # in force: stays while ahead on the mean
                return mean[name] < mean["isolated"]
            return all(a < b * (1 - margin) for a, b in zip(runs[name], runs["isolated"]))

        order = [self.choice] + [c for c in self.candidates if c != self.choice]
        fit = [n for n in order if fits(n)]
        best = fit[0]
        for name in fit[1:]:
            if mean[name] < mean[best] * (1 - 1e-9):
                best = name
        return best

    def expected_arrivals(self, now_s: float) -> list[TraceJob]:
        """The arrivals of the last `history_s` (at most since the first look), replayed as
        the next ones: the rollout's stand-in for the future. None at the first look."""
        start = now_s if self._first_look is None else self._first_look
        window = min(self.history_s, now_s - start)
        return replayed(self._seen, now_s, window)


def simulator_rollout(sim, allocation, placement) -> Rollout:
    """Rollouts of `sim` as it stands (Simulator.fork) with `arrivals` to come: the summed
    JCT of every job in it (inf if some do not finish)."""

    def rollout(arrivals: list[TraceJob], grouping) -> float:
        # Decided once, whichever candidate: the guarded run's rounds never settle (the guard
        # bears harmony's name: round.settles), `none` governing included, so its rollouts
        # decide as it does (as the operator's, controller/scheduling/grouping_guard.py).
        return rollout_jct(sim, allocation, placement, arrivals, grouping, decided_once=True)

    return rollout
