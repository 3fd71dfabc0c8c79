"""How well the calibrated simulator predicts real runs (issue 53, bench/bench_real_runs.py).

A real run is a trace of jobs submitted to a cluster under one policy, with what each job
measured (created and completed times, rescales) and the policy's interval records. The
simulator replays the same trace, the jobs arriving when they were created, in a cluster of
the real one's free capacity, with what the records say about it:

- **speed**: each model's speed factor (and interference sensitivity), fitted to the records'
  steady intervals the way `mlsched retrain` calibrates (calibration.calibrate);
- **restart and start costs**: the seconds a change of counts and a new job's start cost
  (`SimConfig.scaling_cost_s`, `start_cost_s`), read from the records as well
  (calibration.restart_cost, start_cost): in an interval where a job's grant changed (or it
  arrived), the time available less the time its epochs take at the speed it then measured.

Two calibrations (CALIBRATIONS): `retrain's`, exactly what `mlsched retrain` simulates with
(calibration.calibrate, Workload.config), and `recorded`, which also takes the speed measured
at each count, the pods' measured times and the pairs' interference (SimCalibration).

The result is each job's real and simulated JCT and the relative error, per policy.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from mlsched.policies import registry
from mlsched.policies.decision_log import IntervalRecord
from mlsched.sim.simulator import SimConfig, Simulator
from mlsched.workloads import catalog, speed_models
from mlsched.workloads.traces import TraceJob
from policy_models.retrain import calibration
from policy_models.retrain.calibration import job_timelines, restart_cost, start_cost
from policy_models.retrain.history import read_record_dir

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


def sensitivity_from_pairs(pairs: list[dict]) -> dict[str, float]:
    """Per model, the sensitivity factor (interference.job_speed_factors) under which the
    interference model predicts the slowdowns measured with the jobs side by side: each row
    of `pairs` has the two sides' `models`, `measured_slowdown` and `predicted_slowdown` (at
    factor 1). A slowdown d is a pressure d / (1 - d), and the factor scales the pressure: the
    median over the model's rows of measured / predicted pressure (0 where nothing was lost)."""
    ratios: dict[str, list[float]] = {}
    for row in pairs:
        for model, measured, predicted in zip(row["models"], row["measured_slowdown"], row["predicted_slowdown"]):
            if predicted > 0:
                measured = min(max(measured, 0.0), 0.99)
                ratios.setdefault(model, []).append(
                    (measured / (1 - measured)) / (predicted / (1 - predicted)))
    return {m: round(float(np.median(v)), 4) for m, v in ratios.items()}


@dataclass(frozen=True)
class SimCalibration:
    """What the simulator takes from a real run's records (`from_records`)."""
    calibration: calibration.Calibration
    restart_cost_s: float
    restart_changes: int
    start_cost_s: float | None = None  # None: restart_cost_s, as the shipped simulator
    start_jobs: int = 0
    speeds: dict | None = None  # (model, arch, ps, workers) -> epochs/s, RecordedSpeed
    handover_s: float | None = None  # SimConfig.handover_s: the stop part of a restart
    spans_slots: bool = True  # SimConfig.costs_span_slots

    @classmethod
    def from_records(cls, records: list[IntervalRecord], recorded: bool, pods_ready_s: float,
                     pods_start_s: float, pairs: list[dict] = ()) -> "SimCalibration":
        """`recorded=False`: what `mlsched retrain` calibrates (a speed factor per model, the
        restart and start costs read from the records: Calibration.sim_costs); True: also the measured
        speeds at each count, the start cost, restarts that outlast a slot, the sensitivities
        the measured `pairs` imply (sensitivity_from_pairs) where they have the model, and a
        restart charged as what it is, a stop and a start: `pods_ready_s` (status.rescales:
        from the change of counts to every new pod Ready) and then the program's own start
        (the start cost less `pods_start_s`, a new job's pods' time to Running). The records
        alone understate it: a restart the next round cut short, or one the job finished in,
        says only that it took at least so long, and long ones are those. The stop part
        (`pods_ready_s` less `pods_start_s`) is also how long the tasks a job gives up stay
        taken (SimConfig.handover_s)."""
        if not recorded:  # what `mlsched retrain` simulates with (Workload.config)
            cal = calibration.calibrate(records, min_samples=3)
            costs = cal.sim_costs()
            return cls(cal, costs.get("scaling_cost_s", calibration.DEFAULT_SCALING_COST_S), cal.restart_changes,
                       costs.get("start_cost_s"), cal.start_jobs, spans_slots=bool(costs))
        cost, changes = restart_cost(records)
        cost = pods_ready_s if cost is None else cost
        cal = calibration.calibrate(records, min_samples=3, scaling_cost_s=cost)
        cal.sensitivity_factors.update(sensitivity_from_pairs(list(pairs)))
        start, jobs = start_cost(records)
        handover = None
        if pods_ready_s > 0 and start is not None:
            cost = pods_ready_s + max(0.0, start - pods_start_s)
            handover = max(0.0, pods_ready_s - pods_start_s)
        return cls(cal, cost, changes, start, jobs, measured_speeds(records), handover)

    def summary(self) -> dict:
        return {"restart_cost_s": round(self.restart_cost_s, 2), "restart_changes": self.restart_changes,
                "start_cost_s": None if self.start_cost_s is None else round(self.start_cost_s, 2),
                "start_jobs": self.start_jobs,
                "handover_s": None if self.handover_s is None else round(self.handover_s, 2),
                "speed_factors": self.calibration.speed_factors,
                "sensitivity_factors": self.calibration.sensitivity_factors,
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
                       start_cost_s=sim_cal.start_cost_s, costs_span_slots=sim_cal.spans_slots,
                       handover_s=sim_cal.handover_s,
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


def pod_times(run: dict) -> tuple[float, float]:
    """What a run's jobs' status measured of their pods: the mean seconds from a change of
    counts to every new pod Ready (status.rescales; 0 without a rescale), and the median
    seconds a new job's pods took to Running (status.startTime), over the jobs that got their
    tasks at once (under 5 s: the others waited for room)."""
    jobs = run["jobs"].values()
    rescales = sum(j["rescales"] for j in jobs)
    ready = sum(j["rescale_seconds"] for j in jobs) / rescales if rescales else 0.0
    started = [v for j in jobs if (v := j["started_s"] - j["created_s"]) < 5]
    return ready, float(np.median(started)) if started else 0.0


def stalled(records: list[IntervalRecord]) -> tuple[float, int, int]:
    """Job-seconds the records show a job holding tasks without training (an interval's length
    less its epochs at the speed measured at its counts, summed over unfinished job-intervals),
    and the starts and changes of counts in them: what the costs the simulator charges must
    account for."""
    speeds = measured_speeds(records)
    idle, starts, changes = 0.0, 0, 0
    for timeline in job_timelines(records).values():
        for k, (rec, j) in enumerate(timeline):
            before = timeline[k - 1][1] if k else None
            if j.workers > 0 and (before is None or before.workers <= 0):
                starts += 1
            elif j.workers > 0 and (before.ps, before.workers) != (j.ps, j.workers):
                changes += 1
            arch = ARCH[j.architecture]
            speed = speeds.get((catalog.canonical_name(j.model_type), arch, j.ps if arch == "ps" else 0, j.workers)) \
                if catalog.is_known(j.model_type) else None
            if j.workers > 0 and not j.finished and speed:
                idle += max(0.0, rec.length_s - j.epochs / speed)
    return idle, starts, changes


def compare(doc: dict, records_dir: Path) -> dict:
    """The simulator's prediction of every run in a bench_real_runs `run.json` document, under
    each calibration (CALIBRATIONS), from the run's own records and from the other runs'."""
    trace = [RealJob(**j) for j in doc["trace"]]
    runs = doc["runs"] + doc.get("repeats", [])
    records = {_label(run): read_record_dir(records_dir / _label(run)) for run in runs}
    times = {_label(run): pod_times(run) for run in runs}
    # The trace's jobs are padded (their compute a sleep): the pairs measured the same way.
    pairs = [row for found in doc.get("pairs") or [] if found["padded"] for row in found["pairs"]]
    out = {"runs": [], "repeatability": repeatability(doc)}
    for run in runs:
        jobs = run["jobs"]
        first = min(j["created_s"] for j in jobs.values())
        arrived = [RealJob(j.name, j.architecture, j.model, j.epochs, jobs[j.name]["created_s"] - first)
                   for j in trace]
        real = {j.name: jobs[j.name]["completed_s"] - jobs[j.name]["created_s"] for j in arrived}
        label = _label(run)
        idle, starts, changes = stalled(records[label])
        found = {"allocation": run["allocation"], "label": label,
                 "pods_ready_s": round(times[label][0], 2), "pods_start_s": round(times[label][1], 2),
                 "stalled_s": round(idle, 1), "starts": starts, "changes": changes,
                 "real_s": {k: round(v, 1) for k, v in real.items()},
                 "avg_real_s": round(float(np.mean(list(real.values()))), 1), "predictions": []}
        allocations = {_label(r): r["allocation"] for r in runs}
        others = [a for a in records if allocations[a] != run["allocation"]]
        sources = [("own", records[label], [times[label]])]
        if others:
            sources.append(("others", [r for a in others for r in records[a]], [times[a] for a in others]))
        for source, used, measured in sources:
            ready = float(np.mean([t[0] for t in measured]))
            pods_start = float(np.mean([t[1] for t in measured]))
            for name, recorded in CALIBRATIONS:
                sim_cal = SimCalibration.from_records(used, recorded, ready, pods_start, pairs)
                predicted = simulate(arrived, run["allocation"], doc["node_free"], doc["interval_s"],
                                     doc["max_ps"], doc["max_workers"], sim_cal)
                errors = {k: round(predicted[k] / real[k] - 1, 4) for k in real}
                avg_sim = float(np.mean([predicted[k] for k in real]))
                found["predictions"].append({
                    "calibration": name, "records": source, "sim_s": {k: round(v, 1) for k, v in predicted.items()},
                    "errors": errors, "avg_sim_s": round(avg_sim, 1),
                    "avg_error": round(avg_sim / found["avg_real_s"] - 1, 4),
                    "worst_job_error": max(errors.values(), key=abs), **sim_cal.summary(),
                    "charged_s": round(starts * (sim_cal.start_cost_s if sim_cal.start_cost_s is not None
                                                 else sim_cal.restart_cost_s)
                                       + changes * sim_cal.restart_cost_s, 1)})
        out["runs"].append(found)
    return out


def _label(run: dict) -> str:
    return run.get("label", run["allocation"])


def _jcts(run: dict) -> dict[str, float]:
    return {name: j["completed_s"] - j["created_s"] for name, j in run["jobs"].items()}


def repeatability(doc: dict) -> list[dict]:
    """How far the real node reproduces itself: each repeated run (`--repeat`) of the same
    trace under the same policy against that policy's first run, per job and on average, the
    same error the simulator's predictions are held to. A simulator cannot be expected to
    predict a job closer than the node repeats it."""
    first = {run["allocation"]: run for run in doc["runs"]}
    out = []
    for run in doc.get("repeats", []):
        base, again = _jcts(first[run["allocation"]]), _jcts(run)
        errors = {k: round(again[k] / base[k] - 1, 4) for k in base}
        out.append({"allocation": run["allocation"], "label": _label(run), "errors": errors,
                    "avg_error": round(float(np.mean(list(again.values()))) / float(np.mean(list(base.values()))) - 1, 4),
                    "worst_job_error": max(errors.values(), key=abs)})
    return out


#: (name, recorded): the retraining loop's calibration alone, and with what the records
#: measured (speeds at each count, the start cost, restarts that outlast a slot).
CALIBRATIONS = (("retrain's", False), ("recorded", True))


def print_table(result: dict) -> None:
    for run in result["runs"]:
        names = list(run["real_s"])
        print(f"\n{run.get('label', run['allocation'])}: real avg JCT {run['avg_real_s']:.0f} s; pods Ready "
              f"{run['pods_ready_s']} s after a change of counts, Running {run['pods_start_s']} s "
              f"after a job's creation; {run['stalled_s']:.0f} job-s holding tasks without "
              f"training over {run['starts']} starts and {run['changes']} changes")
        print(f"  {'calibration':16} {'records':8} {'avg':>7} " + " ".join(f"{n:>7}" for n in names)
              + "  restart / start cost  charged for those")
        print(f"  {'real JCT s':16} {'':8} {run['avg_real_s']:7.0f} "
              + " ".join(f"{run['real_s'][n]:7.0f}" for n in names))
        for p in run["predictions"]:
            print(f"  {p['calibration']:16} {p['records']:8} {p['avg_error']:+7.1%} "
                  + " ".join(f"{p['errors'][n]:+7.1%}" for n in names)
                  + f"  {p['restart_cost_s']} s ({p['restart_changes']}) / {p['start_cost_s']} s ({p['start_jobs']})"
                  + f"  {p['charged_s']:.0f} s")
    for row in result.get("repeatability", []):
        names = list(row["errors"])
        print(f"\n{row['label']} against the first {row['allocation']} run (the node repeating itself):"
              f" avg {row['avg_error']:+.1%}, jobs " + " ".join(f"{n} {row['errors'][n]:+.1%}" for n in names))
