"""How well the calibrated simulator predicts real runs (issue 53, bench/bench_real_runs.py).

A real run is a trace of jobs submitted to a cluster under one policy, with what each job
measured (created and completed times, rescales) and the policy's interval records. The
simulator replays the same trace, the jobs arriving when they were created, in a cluster of
the real one's free capacity, with what the records say about it:

- **speed**: each model's speed factor (and interference sensitivity), fitted to the records'
  steady intervals the way `mlsched retrain` calibrates (calibration.calibrate);
- **restart cost**: the seconds a change of counts costs (`SimConfig.scaling_cost_s`), read
  from the records as well (`restart_cost`): in an interval where a job's grant changed, the
  interval's length less the time its epochs take at the speed it then measured.

The result is each job's real and simulated JCT and the relative error, per policy.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import numpy as np

from mlsched.policies import registry
from mlsched.policies.decision_log import IntervalRecord
from mlsched.sim.simulator import SimConfig, Simulator
from mlsched.workloads import catalog, speed_models
from mlsched.workloads.traces import TraceJob
from policy_models.retrain import calibration

ARCH = {"ParameterServer": "ps", "AllReduce": "allreduce"}
GIB = 2.0 ** 30


@dataclass(frozen=True)
class RealJob:
    """One job of a real-run trace: what the user submitted, and when (s after the first)."""
    name: str
    architecture: str  # ParameterServer | AllReduce
    model: str  # a catalog model type: the policies' prior
    epochs: int
    arrival_s: float


def restart_cost(records: list[IntervalRecord]) -> tuple[float | None, int]:
    """The median seconds a change of a running job's counts cost, and how many changes it is
    read from: in the interval where the grant changed, length - epochs / speed, the speed the
    job measured at its new counts in that interval or the next. Starts are left out: a job
    admitted mid-interval trained for part of it for a reason other than the restart."""
    lost: list[float] = []
    before: dict[str, tuple] = {}
    ordered = sorted(records, key=lambda r: r.interval)
    later: dict[tuple[int, str], float] = {}
    for rec in ordered:
        for j in rec.jobs:
            if j.speed:
                later[(rec.interval, j.uid)] = j.speed
    for rec in ordered:
        now = {}
        for j in rec.jobs:
            grant = (j.ps, j.workers)
            now[j.uid] = grant
            held = before.get(j.uid)
            if not held or held == grant or j.finished or j.workers <= 0 or held[1] <= 0:
                continue
            speed = later.get((rec.interval, j.uid)) or later.get((rec.interval + 1, j.uid))
            if speed:
                lost.append(min(rec.length_s, max(0.0, rec.length_s - j.epochs / speed)))
        before = now
    return (float(np.median(lost)) if lost else None), len(lost)


def _stamp(rfc3339: str) -> float:
    return datetime.fromisoformat(rfc3339.replace("Z", "+00:00")).timestamp()


def start_cost(records: list[IntervalRecord]) -> tuple[float | None, int]:
    """The median seconds from a job's creation to its training at full speed, less what it
    trained meanwhile, and how many jobs it is read from: only jobs granted tasks in the
    interval they arrived in (admitted on arrival: they started at creation), up to the first
    interval where they measured a speed at the counts they started with."""
    lost: list[float] = []
    first: dict[str, tuple] = {}  # uid -> (grant, available s, epochs) until a speed is measured
    settled: set[str] = set()
    for rec in sorted(records, key=lambda r: r.interval):
        for j in rec.jobs:
            if j.uid in settled:
                continue
            grant = (j.ps, j.workers)
            if j.uid not in first:
                if j.workers <= 0 or _stamp(j.created) < _stamp(rec.start):
                    settled.add(j.uid)  # waited, or arrived before these records
                    continue
                first[j.uid] = (grant, _stamp(rec.end) - _stamp(j.created), j.epochs)
            else:
                held, available, epochs = first[j.uid]
                if grant != held or j.finished:
                    settled.add(j.uid)  # rescaled or done before it measured a speed
                    continue
                first[j.uid] = (held, available + rec.length_s, epochs + j.epochs)
            if j.speed and not j.finished:
                _, available, epochs = first[j.uid]
                lost.append(max(0.0, available - epochs / j.speed))
                settled.add(j.uid)
    return (float(np.median(lost)) if lost else None), len(lost)


def measured_speeds(records: list[IntervalRecord]) -> dict[tuple[str, str, int, int], float]:
    """The median epochs/s the jobs reported at each (model, arch, ps, workers): what
    speed_models.RecordedSpeed serves. PS count 0 for all-reduce jobs."""
    found: dict[tuple[str, str, int, int], list[float]] = {}
    for rec in records:
        for j in rec.jobs:
            if j.speed and j.workers > 0 and catalog.is_known(j.model_type):
                arch = ARCH[j.architecture]
                key = (catalog.canonical_name(j.model_type), arch, j.ps if arch == "ps" else 0, j.workers)
                found.setdefault(key, []).append(j.speed)
    return {k: float(np.median(v)) for k, v in found.items()}


@dataclass(frozen=True)
class SimCalibration:
    """What the simulator takes from a real run's records (`from_records`)."""
    calibration: calibration.Calibration
    restart_cost_s: float
    restart_changes: int
    start_cost_s: float | None = None  # None: restart_cost_s, as the shipped simulator
    start_jobs: int = 0
    speeds: dict | None = None  # (model, arch, ps, workers) -> epochs/s, RecordedSpeed

    @classmethod
    def from_records(cls, records: list[IntervalRecord], fallback_cost_s: float,
                     recorded: bool) -> "SimCalibration":
        """`recorded=False`: what `mlsched retrain` calibrates (a speed factor per model and
        the restart cost); True: also the measured speeds at each count, the start cost, and
        restarts that outlast a slot."""
        cost, changes = restart_cost(records)
        cost = fallback_cost_s if cost is None else cost
        cal = calibration.calibrate(records, min_samples=3, scaling_cost_s=cost)
        if not recorded:
            return cls(cal, cost, changes)
        start, jobs = start_cost(records)
        return cls(cal, cost, changes, start, jobs, measured_speeds(records))

    def summary(self) -> dict:
        return {"restart_cost_s": round(self.restart_cost_s, 2), "restart_changes": self.restart_changes,
                "start_cost_s": None if self.start_cost_s is None else round(self.start_cost_s, 2),
                "start_jobs": self.start_jobs, "speed_factors": self.calibration.speed_factors,
                "samples": {m: n for m, n in self.calibration.samples.items() if n},
                "measured_counts": len(self.speeds or {})}


def simulate(trace: list[RealJob], allocation: str, free: dict, interval_s: float,
             max_ps: int, max_workers: int, sim_cal: SimCalibration, task_cpu: float = 0.1,
             task_mem_gib: float = 0.25, seed: int = 0) -> dict[str, float]:
    """Each job's simulated JCT (s) in one node of `free` capacity (cpu cores, nvidia.com/gpu,
    memory bytes: what the real node had left for the jobs)."""
    cal = sim_cal.calibration
    jobs = [TraceJob(j.name, j.arrival_s, j.model, float(j.epochs), ARCH[j.architecture]) for j in trace]
    demands = {j.model: ((task_cpu, 0.0, task_mem_gib), (task_cpu, 1.0, task_mem_gib)) for j in trace}
    config = SimConfig(nodes=1, node_cpus=free["cpu"], node_gpus=free["nvidia.com/gpu"],
                       node_mem_gib=free["memory"] / GIB, interval_s=interval_s, max_ps=max_ps,
                       max_workers=max_workers, scaling_cost_s=sim_cal.restart_cost_s,
                       start_cost_s=sim_cal.start_cost_s, costs_span_slots=sim_cal.speeds is not None,
                       demands=demands, sensitivity_factors=cal.sensitivity_factors or None, seed=seed)
    speed = speed_models.ScaledSpeed(speed_models.get_speed_model(config.speed_model), cal.speed_factors)
    if sim_cal.speeds is not None:
        speed = speed_models.RecordedSpeed(speed, sim_cal.speeds)
    sim = Simulator(jobs, config, speed_model=speed)
    ctx = registry.PolicyContext(speed_model=sim.speed)
    result = sim.run(registry.make_allocation(allocation, ctx), registry.make_placement("load-balance", ctx))
    if result.completed != result.jobs:
        raise RuntimeError(f"the simulator finished {result.completed} of {result.jobs} jobs under {allocation}")
    return dict(result.jct_s)


def compare(doc: dict, records_dir: Path) -> dict:
    """The simulator's prediction of every run in a bench_real_runs `run.json` document, under
    each calibration (CALIBRATIONS), from the run's own records and from the other runs'."""
    from policy_models.retrain.cli import read_record_dir
    trace = [RealJob(**j) for j in doc["trace"]]
    records = {run["allocation"]: read_record_dir(records_dir / run.get("label", run["allocation"]))
               for run in doc["runs"]}
    out = {"runs": []}
    for run in doc["runs"]:
        jobs = run["jobs"]
        first = min(j["created_s"] for j in jobs.values())
        arrived = [RealJob(j.name, j.architecture, j.model, j.epochs, jobs[j.name]["created_s"] - first)
                   for j in trace]
        rescales = sum(j["rescales"] for j in jobs.values())
        ready_s = sum(j["rescale_seconds"] for j in jobs.values()) / rescales if rescales else 0.0
        real = {j.name: jobs[j.name]["completed_s"] - jobs[j.name]["created_s"] for j in arrived}
        found = {"allocation": run["allocation"], "pods_ready_s": round(ready_s, 2),
                 "real_s": {k: round(v, 1) for k, v in real.items()},
                 "avg_real_s": round(float(np.mean(list(real.values()))), 1), "predictions": []}
        others = [r for a, r in records.items() if a != run["allocation"]]
        for source, used in (("own", records[run["allocation"]]), ("others", [r for rs in others for r in rs])):
            if not used:
                continue
            for name, recorded in CALIBRATIONS:
                sim_cal = SimCalibration.from_records(used, ready_s, recorded)
                predicted = simulate(arrived, run["allocation"], doc["node_free"], doc["interval_s"],
                                     doc["max_ps"], doc["max_workers"], sim_cal)
                errors = {k: round(predicted[k] / real[k] - 1, 4) for k in real}
                avg_sim = float(np.mean([predicted[k] for k in real]))
                found["predictions"].append({
                    "calibration": name, "records": source, "sim_s": {k: round(v, 1) for k, v in predicted.items()},
                    "errors": errors, "avg_sim_s": round(avg_sim, 1),
                    "avg_error": round(avg_sim / found["avg_real_s"] - 1, 4),
                    "worst_job_error": max(errors.values(), key=abs), **sim_cal.summary()})
        out["runs"].append(found)
    return out


#: (name, recorded): the retraining loop's calibration alone, and with what the records
#: measured (speeds at each count, the start cost, restarts that outlast a slot).
CALIBRATIONS = (("speed factors", False), ("recorded", True))


def print_table(result: dict) -> None:
    for run in result["runs"]:
        names = list(run["real_s"])
        print(f"\n{run['allocation']}: real avg JCT {run['avg_real_s']:.0f} s (pods Ready "
              f"{run['pods_ready_s']} s after a change of counts)")
        print(f"  {'calibration':16} {'records':8} {'avg':>7} " + " ".join(f"{n:>7}" for n in names)
              + "  restart / start cost")
        print(f"  {'real JCT s':16} {'':8} {run['avg_real_s']:7.0f} "
              + " ".join(f"{run['real_s'][n]:7.0f}" for n in names))
        for p in run["predictions"]:
            print(f"  {p['calibration']:16} {p['records']:8} {p['avg_error']:+7.1%} "
                  + " ".join(f"{p['errors'][n]:+7.1%}" for n in names)
                  + f"  {p['restart_cost_s']} s ({p['restart_changes']}) / {p['start_cost_s']} s ({p['start_jobs']})")
