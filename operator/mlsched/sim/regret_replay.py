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
from mlsched.policies.round import run_admission, run_round, settles
from mlsched.sim.simulator import SimConfig, Simulator
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
    return WindowStart(trace, held, span, recorded, len(records), left_out, names, bounds)


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


def simulator(start: WindowStart, config: SimConfig) -> Simulator:
    """A simulator of the window's jobs on the cluster of `config`, for `replay`."""
    cfg = replace(config, seed=0, grouping_guard=False, max_slots=10**6)
    try:
        return Simulator(start.trace, cfg)
    except ValueError as err:
        raise ReplayError(str(err)) from None


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
    def view() -> Snapshot:
        return bounded(sim.snapshot(), start.bounds)

    admit = ((lambda snap: run_admission(bounded(snap, start.bounds), allocation, placement))
             if cfg.admission == "arrival" else None)
    # As Simulator.run and the operator's served round: a learned round through a cycle guard.
    guard = None
    if cfg.cycle_guard and not settles(allocation, placement, None):
        guard = CycleGuard().primed(view(), {start.names[n]: tuple(c) for n, c in (earlier or {}).items()
                                             if n in start.names})
    progress, t0 = 0.0, sim.time_s
    while not sim.done and sim.time_s - t0 < start.span_s - 1e-6:
        snapshot = view()
        decision: Decision = run_round(snapshot, allocation, placement)
        if guard is not None:
            decision = guard.apply(snapshot, decision)
        progress += sim.advance(decision, admit)
    # A policy that finished everything early could do no more in the rest of the window.
    return progress / max(sim.time_s - t0, start.span_s) * 3600.0


def estimate(records: list[IntervalRecord], config: SimConfig, node_names: list[str] | None,
             learned: tuple, fallback: tuple, ran: str,
             earlier: dict[str, tuple[Counts, ...]] | None = None) -> Estimate:
    """Both estimates of the window of `records`; `learned` and `fallback` are (allocation,
    placement) pairs, `ran` which of them served the window; `earlier` the cycle guard's
    memory of the rounds that served it (`replay`)."""
    if ran not in (LEARNED, FALLBACK):
        raise ValueError(f"ran must be {LEARNED!r} or {FALLBACK!r}")
    start = window_start(records)
    sim = simulator(start, config)
    mine = replay(start, config, node_names, *learned, earlier, sim=sim)
    theirs = replay(start, config, node_names, *fallback, earlier, sim=sim)
    if not all(math.isfinite(x) for x in (mine, theirs)):
        raise ReplayError("the replay's progress is not finite")
    return Estimate(mine, theirs, start.recorded, ran, start.intervals, len(start.trace),
                    start.left_out)


def rfc3339(seconds: float) -> str:
    return (EPOCH + timedelta(seconds=seconds)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _seconds(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
