"""The cluster's workload as the records show it, to simulate more of it.

Retraining in the simulator and evaluating a candidate both need traces like the cluster's:
its node count, how many jobs arrive per interval, which models and how long. These come
from the records: jobs are drawn (with replacement) from the catalog-model jobs the records
saw, arriving as a Poisson process at the recorded rate. Node shapes are not in the records;
the simulator's default node (8 CPU, 2 GPU, 48 GiB, the DL² testbed's) stands in for them.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime

import numpy as np

from mlsched.policies.decision_log import IntervalRecord
from mlsched.sim.simulator import SimConfig
from mlsched.workloads import catalog, speed_table
from mlsched.workloads.traces import TraceJob
from policy_models.domain import widened

ARCH = {"ParameterServer": "ps", "AllReduce": "allreduce"}
# Trace seeds by use; offset by the retraining seed. Disjoint from train.py's (1,000+ and
# 50,000+), the benchmarks' (100,000+) and recorded histories' (300,000+).
TRAIN_SEEDS, VALIDATION_SEEDS, EVALUATION_SEEDS = 500_000, 700_000, 900_000
# The longest job simulated: the trace generators' bound (48 h alone with 1 PS and 1 worker).
MAX_JOB_MINUTES = 48 * 60


def longest_epochs(model: str) -> float:
    """Epochs of a MAX_JOB_MINUTES job of `model`, as generators.py computes a job's epochs."""
    ref_epochs_per_s = speed_table.table_speed(model, 1, 1) / catalog.MODELS[model].steps_per_epoch
    return max(1.0, round(MAX_JOB_MINUTES * 60 * ref_epochs_per_s, 1))


@dataclass
class Workload:
    nodes: int
    rate: float  # jobs arriving per interval
    # (model, epochs, arch) of the recorded catalog jobs, or (model, epochs, arch, workers, ps)
    # with `counts`: the tasks each held at most, which under the `fixed` allocation are the
    # user's (what Harmony placement retrains with).
    jobs: list[tuple]
    interval_s: float = 1200.0
    # Jobs in one burst of arrivals as recorded (arrival_bursts), None: about 20 intervals of
    # arrivals, like the benchmark's scenarios (60 jobs at 3 per interval).
    burst_jobs: int | None = None

    def widened_domain(self, base: dict, intervals: int) -> dict:
        """The base model's card domain widened by this recorded cluster (a retrained model's
        domain: policy_models/domain.py widened)."""
        return widened(base, self.nodes, {j[0] for j in self.jobs}, {j[2] for j in self.jobs},
                       f"retrained on {intervals} recorded intervals of a {self.nodes}-node cluster")

    @property
    def jobs_per_trace(self) -> int:
        return int(np.clip(self.burst_jobs or round(20 * self.rate), 20, 200))

    def trace(self, seed: int) -> list[TraceJob]:
        rng = np.random.default_rng(seed)
        out, slot = [], 0
        while len(out) < self.jobs_per_trace:
            for t in sorted(slot + rng.random(rng.poisson(self.rate))):
                model, epochs, arch, *counts = self.jobs[rng.integers(len(self.jobs))]
                job = TraceJob(f"job-{len(out):04d}", round(float(t) * self.interval_s, 1), model, epochs, arch)
                if counts:
                    workers, ps = counts
                    job = replace(job, workers=workers, ps=ps if arch == "ps" else None)
                out.append(job)
            slot += 1
        return out[: self.jobs_per_trace]

    def config(self, seed: int, calibration=None, admission: str = "arrival") -> SimConfig:
        """The simulated cluster for a trace: this workload's size and interval, with the
        speeds, interference and restart and start costs of `calibration` (a
        calibration.Calibration; None: the catalog's speeds and the simulator's costs)."""
        return SimConfig(nodes=self.nodes, seed=seed, interval_s=self.interval_s, admission=admission,
                         speed_factors=(calibration.speed_factors or None) if calibration else None,
                         sensitivity_factors=(calibration.sensitivity_factors or None) if calibration else None,
                         **(calibration.sim_costs() if calibration else {}))

    def to_json(self) -> dict:
        return {"nodes": self.nodes, "rate_per_interval": round(self.rate, 3), "distinct_jobs": len(self.jobs),
                "burst_jobs": self.burst_jobs,
                "interval_s": self.interval_s, "jobs_per_trace": self.jobs_per_trace}


def from_records(records: list[IntervalRecord], counts: bool = False) -> Workload:
    """The workload of `records`; with `counts`, each job keeps the most workers and PS it held
    in any interval (a job never granted any is left out: its counts are unknown)."""
    if not records:
        raise ValueError("no interval records")
    seen: dict[str, tuple] = {}
    held: dict[str, tuple[int, int]] = {}
    for r in records:
        for j in r.jobs:
            if j.uid not in seen and catalog.is_known(j.model_type):
                model = catalog.canonical_name(j.model_type)
                # A job meant to run until stopped (epochs 1e9) would never finish in the
                # simulator, and neither would evaluation: its length is capped as generated ones are.
                seen[j.uid] = (model, min(float(j.total_epochs), longest_epochs(model)),
                               ARCH.get(j.architecture, "ps"))
            w, p = held.get(j.uid, (0, 0))
            held[j.uid] = (max(w, j.workers), max(p, j.ps))
    if counts:
        seen = {uid: (*job, *held[uid]) for uid, job in seen.items() if held[uid][0] > 0}
    if not seen:
        raise ValueError("the records hold no job of a catalog model: nothing to simulate")
    nodes = int(np.median([r.nodes for r in records]))
    length = float(np.median([r.length_s for r in records]))
    arrivals = arrivals_per_interval(records, set(seen))
    if not arrivals:  # times that do not parse: every busy interval counts
        busy = sum(1 for r in records if r.jobs) or 1
        return Workload(nodes, len(seen) / busy, list(seen.values()), length)
    bursts = arrival_bursts(arrivals)
    return Workload(nodes, len(seen) / len(arrivals), list(seen.values()), length,
                    burst_jobs=int(np.median(bursts)))


def arrivals_per_interval(records: list[IntervalRecord], uids: set[str]) -> dict[int, int]:
    """Interval (index in time order) -> how many of these jobs arrived in it (their `created`
    time inside it); {} when the times do not parse. The arrival rate is jobs per interval
    that saw arrivals: counting every busy interval instead (any job present) spreads a burst
    of arrivals over the hours its jobs then run, and made a placement history (52 jobs in 8
    intervals at 13 nodes) look like 1.2 jobs an interval."""
    try:
        spans = np.array(sorted((seconds_of(r.start), seconds_of(r.end)) for r in records))
        created = {j.uid: seconds_of(j.created) for r in records for j in r.jobs if j.uid in uids}
    except ValueError:
        return {}
    out: dict[int, int] = {}
    for t in created.values():
        k = int(np.searchsorted(spans[:, 0], t, side="right")) - 1
        if k >= 0 and t < spans[k, 1]:
            out[k] = out.get(k, 0) + 1
    return out


def arrival_bursts(arrivals: dict[int, int], gap: int = 2) -> list[int]:
    """Jobs per burst: runs of intervals with arrivals, a run ending after `gap` intervals
    without any (Poisson arrivals at a few an interval leave single empty intervals). A
    simulated trace is one burst long, so retraining sees the recorded load, not a longer one."""
    bursts: list[int] = []
    last = None
    for k in sorted(arrivals):
        if last is None or k - last > gap:
            bursts.append(0)
        bursts[-1] += arrivals[k]
        last = k
    return bursts


def seconds_of(rfc3339: str) -> float:
    """An RFC 3339 time of the records (`2026-11-30T00:00:00Z`) as epoch seconds."""
    return datetime.fromisoformat(rfc3339.replace("Z", "+00:00")).timestamp()
