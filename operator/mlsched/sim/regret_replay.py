"""The regret guard's estimates: a window of recorded intervals replayed in the simulator under
the learned policy and under the fallback (policies/regret_guard.py has the rule and why the
figure is normalised progress per hour).

The window's start comes from its records (policies/decision_log.IntervalRecord, what the
operator keeps of every closed interval and the simulator writes too, `interval_record`):
each job of the first record that was created by its start is present then, with the epochs
it had (`epochs_at_start`) and the tasks it held, on the nodes named; a job first recorded
later arrives at its creation time. Records carry wall times and, under the operator's
--interval-scale, intervals in the policy's time (`length_s`): arrivals are placed on the
policy's time by the ratio of the two. Jobs of models outside the catalog cannot be simulated
and are left out (counted in the estimate); a window with none left is an error, as is one
whose jobs cannot run on the cluster at all.

Each job keeps the counts its spec allows (JobInterval's bounds, record version 3: the
simulator's own caps are 16 of each, and a replay of chic gave a job of at most 4 PS fifteen).
A learned policy's rounds go through a cycle guard as the operator's served rounds and the
simulator's runs do (policies/cycle_guard.py), primed with what the served round's guard
remembered of each job's earlier counts (`earlier`): without it a replay of chic sent back to
nothing the jobs an admission step had started, which the operator's guard kept running, and
put its own progress 25-40 % under the records on the e2e cluster.

The cluster is the caller's SimConfig (the simulator's own; in the operator one built from
the live nodes, controller/scheduling/guard.py) with its node names, so that held tasks stay on the
nodes they were on: a replay of the policy that ran pays no scaling cost the cluster did not
pay. Both replays start from the same state with the same seed, and run whole rounds (run_round,
and admission steps when the config admits on arrival) until the window's length has passed.
A config with `served_round` (the simulator's default, and the operator's: guard.replay_cluster)
decides each round as the operator serves it (run_served_round: a heuristic fallback's rounds
settled), so the fallback's estimate is of the fallback the cluster would run.

An operator's records (`estimate(operator=True)`) are replayed as the operator serves them
(ReplaySimulator): jobs whose pods were still starting at the window's start train nothing
for as long as the records show, a start from nothing costs what the window's starts cost
(`start_losses`; kwok's pods run 200-600 policy seconds after the grant at the e2e interval
scale, where the simulator charges 30 s), and a round that takes a job's tasks is followed by
an admission step, as the deletion of its pods wakes one in the operator.

This is torch-free (the operator imports it): policy_models/retrain/workload.py builds
longer synthetic workloads from records for retraining; a replay needs the window as it was.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta

from mlsched.cluster.types import Decision, Snapshot
from mlsched.policies.cycle_guard import CycleGuard, Counts
from mlsched.policies.decision_log import IntervalRecord, JobInterval
from mlsched.policies.regret_guard import FALLBACK, LEARNED, Estimate
from mlsched.policies.round import run_admission, run_round, run_served_round, settles
from mlsched.sim.simulator import Admit, SimConfig, Simulator
from mlsched.workloads import catalog
from mlsched.workloads.traces import TraceJob

ARCH = {"ParameterServer": "ps", "AllReduce": "allreduce"}
EPOCH = datetime(2026, 1, 1, tzinfo=UTC)  # wall time of the simulator's second 0 in its records


class ReplayError(ValueError):
    """The window cannot be replayed (said why): the guard reports it and changes nothing."""


@dataclass(frozen=True)
class WindowStart:
    trace: list[TraceJob]  # present jobs at 0 s, arrivals after
    held: dict[str, tuple[float, tuple[str, ...], tuple[str, ...]]]  # name -> (epochs, ps nodes, worker nodes)
    span_s: float  # the window's length in the policy's time
    recorded: float  # normalised progress per hour the records show
    intervals: int
    left_out: int
    names: dict[str, str] = field(default_factory=dict)  # the records' job name -> the trace's
    # trace name -> (min_ps, max_ps, min_workers, max_workers) from the records (version 3)
    bounds: dict[str, tuple[int, int, int, int]] = field(default_factory=dict)
    # Held jobs whose pods were still starting at the window's start (`start_losses`): trace
    # name -> policy seconds of the first interval they trained nothing in.
    starting: dict[str, float] = field(default_factory=dict)
    # What a start from nothing cost on this cluster, the mean of the window's measured starts
    # (policy seconds); None when the window shows none (the config's scaling cost then).
    start_s: float | None = None


def window_start(records: list[IntervalRecord]) -> WindowStart:
    if not records:
        raise ReplayError("no closed intervals to replay")
    records = sorted(records, key=lambda r: r.interval)
    try:
        t0, t1 = _seconds(records[0].start), _seconds(records[-1].end)
    except ValueError as err:
        raise ReplayError(f"record times do not parse: {err}") from None
    span = float(sum(r.length_s for r in records))
    if span <= 0:
        raise ReplayError("the window's intervals have no length")
    scale = span / (t1 - t0) if t1 > t0 else 1.0  # policy seconds per wall second
    first: dict[str, JobInterval] = {}
    for r in records:
        for j in r.jobs:
            first.setdefault(j.uid or j.name, j)
    trace, held, left_out, names, bounds = [], {}, 0, {}, {}
    present = {j.uid or j.name for j in records[0].jobs}
    for uid, j in first.items():
        if not catalog.is_known(j.model_type):
            left_out += 1
            continue
        try:
            created = _seconds(j.created)
        except ValueError:
            created = t0
        at = 0.0 if uid in present and created <= t0 + 1e-6 else max(0.0, (created - t0) * scale)
        if j.epochs_at_start >= j.total_epochs * (1 - 1e-9):
            continue  # done before the window
        name = names[j.name] = f"j{len(trace):05d}"
        if None not in (j.min_ps, j.max_ps, j.min_workers, j.max_workers):
            bounds[name] = (int(j.min_ps), int(j.max_ps), int(j.min_workers), int(j.max_workers))
        trace.append(TraceJob(name, round(at, 3), catalog.canonical_name(j.model_type),
                              float(j.total_epochs), ARCH.get(j.architecture, "ps")))
        if at == 0.0:
            held[name] = (float(j.epochs_at_start), tuple(j.placement.get("ps", ())),
                          tuple(j.placement.get("worker", ())))
    if not trace:
        raise ReplayError(f"no job of the window can be simulated ({left_out} of models "
                          "outside the catalog)" if left_out else "the window had no unfinished job")
    recorded = sum(r.reward for r in records) / span * 3600.0
    losses = start_losses(records)
    starting = {names[n]: lost for (i, n), lost in losses.items()
                if i == 0 and n in names and names[n] in held}
    start_s = mean_start_s(records, losses)
    return WindowStart(trace, held, span, recorded, len(records), left_out, names, bounds,
                       starting, start_s)


def mean_start_s(records: list[IntervalRecord],
                 losses: dict[tuple[int, str], float] | None = None) -> float | None:
    """What a start from nothing cost in the window of `records` (policy seconds, the mean
    of `start_losses`); None when they show no start."""
    losses = start_losses(records) if losses is None else losses
    return sum(losses.values()) / len(losses) if losses else None


def start_losses(records: list[IntervalRecord]) -> dict[tuple[int, str], float]:
    """The starts the records show and what each cost: (record index, job name) -> policy
    seconds of that interval the job trained nothing in.

    A start is a job given workers in an interval with nothing trained yet (its first
    interval, `epochs_at_start` 0) or holding none in the interval before. What it lost is
    the interval's length less the time its epochs take at the rate it trained at in the
    window's later intervals at the same counts and nodes (pooled: one interval's epochs are
    off by the reports' timing); a start without such an interval is not measured. On kwok
    the pods of a start run 1-2 real seconds after the grant, 200-400 policy seconds at the
    e2e tests' interval scale (more on a loaded machine), where the simulator charges its
    scaling cost, 30 s (and none to a job held at the window's start): the first window of
    test_operator_guard.py replayed 7-18 % over its records, the start in its records."""
    out: dict[tuple[int, str], float] = {}
    before: dict[str, int] = {}
    for i, r in enumerate(records):
        for j in r.jobs:
            key = j.uid or j.name
            fresh = j.epochs_at_start <= 0 if i == 0 else before.get(key, 0) == 0
            if j.workers > 0 and fresh and r.length_s > 0 and _before(j.created, r.start):
                later = [(k.epochs, q.length_s) for q in records[i + 1:] for k in q.jobs
                         if (k.uid or k.name) == key and (k.ps, k.workers, k.placement)
                         == (j.ps, j.workers, j.placement) and not k.finished]
                epochs, length = sum(e for e, _ in later), sum(t for _, t in later)
                if epochs > 0 and length > 0 and not j.finished:
                    lost = r.length_s - j.epochs * length / epochs
                    out[(i, j.name)] = min(max(lost, 0.0), r.length_s)
        before = {j.uid or j.name: j.workers for j in r.jobs}
    return out


def bounded(snapshot: Snapshot, bounds: dict[str, tuple[int, int, int, int]]) -> Snapshot:
    """`snapshot` with each job of `bounds` at the counts its spec allows."""
    if not bounds:
        return snapshot
    jobs, changed = [], False
    for j in snapshot.jobs:
        b = bounds.get(j.name)
        if b is not None and ((j.min_workers, j.max_workers) != b[2:]
                              or j.uses_ps and (j.min_ps, j.max_ps) != b[:2]):
            j, changed = replace(j, min_workers=b[2], max_workers=b[3],
                                 **({"min_ps": b[0], "max_ps": b[1]} if j.uses_ps else {})), True
        jobs.append(j)
    # The simulator's own records bound every job as its snapshots do: nothing to copy.
    return replace(snapshot, jobs=jobs) if changed else snapshot


class ReplaySimulator(Simulator):
    """The simulator as the operator serves a window, where the two differ:

    - Starts as the records show them: a job started from nothing pays `start_s` (the
      cluster's measured start, WindowStart.start_s) where the simulator charges its scaling
      cost; a job whose start is under way keeps paying it through a round that leaves it
      where it is. Changes of running jobs pay the scaling cost as in the simulator.
    - A round that takes tasks from a job is followed by an admission step (`admit_freed`),
      as in the operator, where the deletion of the job's pods wakes its policy's admission
      (controller/app/handlers.py, pod_event): the simulator admits only at arrivals and
      completions. Without it a replay of chic left idle, for the whole window, the jobs an
      admission step had started, which chic's every round sent back to nothing and the
      operator's next admission step started again (its cycle guard, its memory lost to a
      change of context, saw them at 4 workers each round: e2e, replay 37 % under the records).
    """

    operator = False
    start_s: float | None = None
    admit_freed: Admit | None = None

    def _apply(self, decision: Decision, cost_cap: float, only_idle: bool) -> None:
        before = {s.spec.name: (bool(s.worker_nodes), s.ps_nodes, s.worker_nodes, s.cost_left)
                  for s in self.active}
        super()._apply(decision, cost_cap, only_idle)
        self._charge_starts(before)
        freed = any(len(s.ps_nodes) + len(s.worker_nodes) < len(before[s.spec.name][1])
                    + len(before[s.spec.name][2]) for s in self.active)
        if (not only_idle and freed and self.admit_freed is not None
                and any(not s.worker_nodes for s in self.active)):
            step = self.admit_freed(self.snapshot())
            self._check_capacity(step)
            self.inferences += step.inferences
            self.plan = step.pools  # run_admission keeps running jobs' pools (round.admissible)
            self._apply(step, cost_cap=self.config.interval_s, only_idle=True)

    def _charge_starts(self, before: dict) -> None:
        for s in self.active:
            had, ps, workers, left = before[s.spec.name]
            if not s.worker_nodes:
                continue
            if not had and self.start_s is not None:
                s.cost_left = min(self.start_s, self.config.interval_s)
            elif (s.ps_nodes, s.worker_nodes) == (ps, workers):
                s.cost_left = max(s.cost_left, left)


def simulator(start: WindowStart, config: SimConfig, operator: bool = False) -> Simulator:
    """A simulator of the window's jobs on the cluster of `config`, for `replay`; `operator`:
    the records are an operator's (ReplaySimulator: its starts and admission steps), not the
    simulator's own (sim/regret_guard.py, whose rules the simulator already follows)."""
    cfg = replace(config, seed=0, grouping_guard=False, max_slots=10**6)
    try:
        sim = ReplaySimulator(start.trace, cfg)
    except ValueError as err:
        raise ReplayError(str(err)) from None
    sim.operator = operator
    sim.start_s = start.start_s if operator else None
    return sim


def replay(start: WindowStart, config: SimConfig, node_names: list[str] | None,
           allocation, placement, earlier: dict[str, tuple[Counts, ...]] | None = None,
           sim: Simulator | None = None) -> float:
    """Normalised progress per hour of `allocation` + `placement` over the window; `earlier`:
    the served round's cycle guard's memory (CycleGuard.remembered), by the records' job names.
    `sim`: `simulator(start, config)` used before, reset here (both replays of a window share
    one: building it computes every job's ideal time, as long as a round takes)."""
    if sim is None:
        sim = simulator(start, config)
    else:
        sim.reset()
    cfg = sim.config
    if node_names is not None and len(node_names) == len(sim.node_names):
        sim.node_names = list(node_names)
    index = {n: k for k, n in enumerate(sim.node_names)}
    for name, (epochs, ps, workers) in start.held.items():
        s = sim.states[name]
        s.epochs_done = min(epochs, s.spec.epochs)
        if all(n in index for n in (*ps, *workers)) and workers:
            s.ps_nodes = tuple(index[n] for n in ps)
            s.worker_nodes = tuple(index[n] for n in workers)
            # Pods still starting at the window's start train nothing for what they lost.
            s.cost_left = start.starting.get(name, 0.0) if getattr(sim, "operator", False) else 0.0
    def view() -> Snapshot:
        return bounded(sim.snapshot(), start.bounds)

    admit = ((lambda snap: run_admission(bounded(snap, start.bounds), allocation, placement))
             if cfg.admission == "arrival" else None)
    if isinstance(sim, ReplaySimulator) and sim.operator:
        sim.admit_freed = admit
    # As Simulator.run and the operator's served round: a learned round through a cycle guard.
    guard = None
    if cfg.cycle_guard and not settles(allocation, placement, None):
        guard = CycleGuard().primed(view(), {start.names[n]: tuple(c) for n, c in (earlier or {}).items()
                                             if n in start.names})
    progress, t0 = 0.0, sim.time_s
    while not sim.done and sim.time_s - t0 < start.span_s - 1e-6:
        snapshot = view()
        if cfg.served_round:  # as the cluster serves it: a heuristic round settled
            decision: Decision = run_served_round(snapshot, allocation, placement, guard=guard)
        else:
            decision = run_round(snapshot, allocation, placement)
            if guard is not None:
                decision = guard.apply(snapshot, decision)
        progress += sim.advance(decision, admit)
    # A policy that finished everything early could do no more in the rest of the window.
    return progress / max(sim.time_s - t0, start.span_s) * 3600.0


def estimate(records: list[IntervalRecord], config: SimConfig, node_names: list[str] | None,
             learned: tuple, fallback: tuple, ran: str,
             earlier: dict[str, tuple[Counts, ...]] | None = None,
             start_s: float | None = None, operator: bool = False) -> Estimate:
    """Both estimates of the window of `records`; `learned` and `fallback` are (allocation,
    placement) pairs, `ran` which of them served the window; `earlier` the cycle guard's
    memory of the rounds that served it (`replay`); `start_s` what a start from nothing cost
    in an earlier window (`mean_start_s`), for a window whose records show no start;
    `operator`: the records are an operator's (`simulator`)."""
    if ran not in (LEARNED, FALLBACK):
        raise ValueError(f"ran must be {LEARNED!r} or {FALLBACK!r}")
    start = window_start(records)
    if start.start_s is None and start_s is not None:
        start = replace(start, start_s=float(start_s))
    sim = simulator(start, config, operator)
    mine = replay(start, config, node_names, *learned, earlier, sim=sim)
    theirs = replay(start, config, node_names, *fallback, earlier, sim=sim)
    if not all(math.isfinite(x) for x in (mine, theirs)):
        raise ReplayError("the replay's progress is not finite")
    return Estimate(mine, theirs, start.recorded, ran, start.intervals, len(start.trace),
                    start.left_out)


def rfc3339(seconds: float) -> str:
    return (EPOCH + timedelta(seconds=seconds)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _before(created: str, start: str) -> bool:
    """Whether a job created at `created` was there when the interval began (a job arriving
    within it lost the time before its arrival, not to its start)."""
    try:
        return _seconds(created) <= _seconds(start) + 1.0  # status times are cut to the second
    except ValueError:
        return False


def _seconds(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
