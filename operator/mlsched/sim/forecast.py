"""What the simulator's guards roll out against (sim/grouping_guard.py, sim/placement_guard.py).

A guard judges its candidates by forking the simulator as it stands and running each to the
end. Future arrivals are not known; the arrivals seen so far are, so a rollout replays the
last `window` seconds of them as the next `window`'s. This module holds the three pieces both
guards share: the history of arrivals as seen, its replay, and the summed JCT of a rollout.
"""

from __future__ import annotations

from dataclasses import replace

from mlsched.cluster.types import Snapshot
from mlsched.workloads.traces import TraceJob


def note_arrivals(seen: dict[str, TraceJob], snapshot: Snapshot) -> None:
    """Adds every job of `snapshot` not in `seen`, as it arrived (a trace row)."""
    for j in snapshot.jobs:
        if j.name not in seen:
            seen[j.name] = TraceJob(j.name, j.arrival_s, j.model, j.total_epochs, j.arch,
                                    j.requested_workers, j.requested_ps, j.gpu_types.get("worker", ()))


def replayed(seen: dict[str, TraceJob], now_s: float, window: float) -> list[TraceJob]:
    """The arrivals of the last `window` seconds replayed as the next `window`'s (renamed `~name`
    so they never clash with the real ones); none for a window of 0."""
    if window <= 0:
        return []
    return [replace(j, name=f"~{j.name}", arrival_s=j.arrival_s + window)
            for j in seen.values() if now_s - window < j.arrival_s <= now_s]


def rollout_jct(sim, allocation, placement, arrivals: list[TraceJob], grouping=None) -> float:
    """Σ JCT of every job of a fork of `sim` (Simulator.fork) with `arrivals` to come, run to
    the end; inf if some do not finish."""
    fork = sim.fork(arrivals)
    result = fork.run(allocation, placement, grouping)
    if result.completed < len(fork.trace):
        return float("inf")
    return float(sum(result.jct_s.values()))
