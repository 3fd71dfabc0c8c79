"""What the simulator's guards roll out against (sim/grouping_guard.py, sim/placement_guard.py).

A guard judges its candidates by forking the simulator as it stands and running each to the
end. Future arrivals are not known; the arrivals seen so far are, so a rollout replays the
last `window` seconds of them as the next `window`'s. This module holds the pieces both
guards share: the history of arrivals as seen, its replay, and the summed JCT of a rollout;
and the sampled futures both guards roll out against (`sampled`: Poisson arrivals at the rate
seen, jobs drawn from those seen; `exponential_horizons`: how long each lasts).
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

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


def rollout_jct(sim, allocation, placement, arrivals: list[TraceJob], grouping=None,
                decided_once: bool = False) -> float:
    """Σ JCT of every job of a fork of `sim` (Simulator.fork) with `arrivals` to come, run to
    the end; inf if some do not finish. `decided_once`: the fork decides every round once
    (SimConfig.served_round False), whatever `sim` does."""
    fork = sim.fork(arrivals)
    if decided_once:
        fork.config = replace(fork.config, served_round=False)
    result = fork.run(allocation, placement, grouping)
    if result.completed < len(fork.trace):
        return float("inf")
    return float(sum(result.jct_s.values()))


def sampled(seen: dict[str, TraceJob], now_s: float, rate_per_s: float, horizons_s: list[float],
            seed: int) -> list[list[TraceJob]]:
    """One future per entry of `horizons_s`: arrivals over the next that many seconds as a
    Poisson process of `rate_per_s`, each a row of `seen` drawn uniformly (model, epochs, arch,
    requests), renamed `~k.i` so they never clash with the real ones; none for a horizon of 0.
    Future k draws from the generator seeded (`seed`, k): the same decision (its time as the
    seed) draws the same futures."""
    rows = list(seen.values())
    out: list[list[TraceJob]] = []
    for k, horizon in enumerate(horizons_s):
        if not rows or rate_per_s <= 0 or not horizon > 0:
            out.append([])
            continue
        rng = np.random.default_rng([max(int(seed), 0), k])
        n = int(rng.poisson(rate_per_s * horizon))
        times = np.sort(rng.uniform(0.0, horizon, n))
        picks = rng.integers(0, len(rows), n)
        out.append([replace(rows[int(p)], name=f"~{k}.{i}", arrival_s=now_s + float(t))
                    for i, (t, p) in enumerate(zip(times, picks))])
    return out


def exponential_horizons(watched_s: float, futures: int, cap_s: float) -> list[float]:
    """How long each of `futures` sampled futures lasts: the exponential distribution's
    quantiles k/K (k = 0..K-1) of a mean equal to the time watched (a process watched for T
    lasts about T more), at most `cap_s`; the first is 0 (no arrivals at all)."""
    return [min(-watched_s * math.log(1 - k / futures), cap_s) for k in range(futures)]


def futures_since(seen: dict[str, TraceJob], first_look: float, now_s: float, futures: int,
                  cap_s: float) -> list[list[TraceJob]]:
    """The sampled futures both guards roll out against: `futures` of them, Poisson arrivals
    at the rate seen since `first_look`, jobs drawn from those seen, lasting
    exponential_horizons of the time watched (at most `cap_s`), seeded by the decision's time."""
    watched = now_s - first_look
    arrived = sum(1 for j in seen.values() if j.arrival_s > first_look)
    rate = arrived / watched if watched > 0 else 0.0
    return sampled(seen, now_s, rate, exponential_horizons(watched, futures, cap_s), int(round(now_s)))
