"""Calibrate the simulator's per-model speeds and interference to what a cluster's interval
records show.

For every job that trained through a whole interval on a grant it already held in the
previous one, the simulator's speed model predicts how many epochs it should have trained:
its speed at (PS, workers, nodes spanned), slowed by the interval's co-tenants
(workloads.interference: 1 / (1 + s · P), P the pressure of the recorded placements, s the
model's sensitivity factor), over the interval's length less the scaling cost when its tasks
moved. Per model, two numbers explain the observed epochs:

- the **sensitivity factor** s, from how the job's rate falls as its pressure grows: the s
  under which every sample implies the same speed (`sensitivity_fit`). It needs samples at
  different pressures; a model seen at about one pressure only keeps its prior (1, or an
  earlier calibration's);
- the **speed factor**, the median of observed / predicted epochs under that s.

The demands (how hard each model presses on its neighbours) stay the table's: the records
show each job's combined slowdown, and one factor per victim model already fits what a
cluster shows for the neighbours it had; a per-aggressor factor would need many distinct
pairings of each model and was not attempted.

What is left out, and why: jobs that finished inside the interval (they trained less than
the interval allowed), jobs that held nothing in the previous interval (an admission step
may have started them part-way through) and grants of zero workers. Co-tenants that start,
move or finish inside an interval change the interference a job saw for part of it, by an
amount the records cannot tell: the speed factor brackets the truth between "all interval"
and "not at all" (their geometric middle), the sensitivity fit uses only samples without
such a neighbour; both prefer samples from jobs none of whose nodes saw a change ("calm")
when a model has enough of them. Medians and capped deviations, not means, so that the
remaining odd samples (and measurement noise) do not pull them. Pressures are computed for
nodes of the reference size (records name nodes, not their capacity).

Models with fewer than `min_samples` samples keep the prior, and model types outside the
catalog cannot be simulated at all: both are reported.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

import numpy as np

from mlsched.policies.decision_log import IntervalRecord
from mlsched.workloads import catalog, interference
from mlsched.workloads.speed_models import epochs_per_s, get_speed_model
from policy_models.retrain.workload import seconds_of

FORMAT = "mlsched.io/speed-calibration"
ARCH = {"ParameterServer": "ps", "AllReduce": "allreduce"}
SENSITIVITY_MAX = 5.0  # the largest sensitivity factor the fit considers
BOOTSTRAP = 40  # resamples that judge whether a sensitivity fit is determined
SPEED_TOLERANCE = 0.03  # ... by how far the speed factors they imply spread (middle 80 %, half-width)
MIN_COST_SAMPLES = 3  # changes of counts (new jobs) a restart (start) cost is read from, at least
DEFAULT_SCALING_COST_S = 30.0  # SimConfig.scaling_cost_s: the cost charged when none is measured


@dataclass
class Calibration:
    speed_factors: dict[str, float]
    samples: dict[str, int] = field(default_factory=dict)
    spread: dict[str, float] = field(default_factory=dict)  # median absolute deviation of the ratios
    kept_prior: list[str] = field(default_factory=list)  # too few samples: the prior factor stands
    unknown_models: list[str] = field(default_factory=list)  # not in the catalog: not simulated
    intervals: tuple[int, int] | None = None
    sensitivity_factors: dict[str, float] = field(default_factory=dict)  # interference.job_speed_factors
    sensitivity_kept_prior: list[str] = field(default_factory=list)  # pressures too alike (or too few samples)
    # What a change of counts and a new job's start cost on this cluster (restart_cost,
    # start_cost) and how many they were read from; None: too few (MIN_COST_SAMPLES), so the
    # simulator's defaults stand (SimConfig.scaling_cost_s; a start costs a restart).
    restart_cost_s: float | None = None
    restart_changes: int = 0
    start_cost_s: float | None = None
    start_jobs: int = 0

    def sim_costs(self) -> dict:
        """The SimConfig fields these costs set: measured seconds are real seconds, so a restart
        longer than a slot is paid in full (costs_span_slots), as it is on the cluster."""
        if self.restart_cost_s is None:
            return {}
        return {"scaling_cost_s": self.restart_cost_s, "start_cost_s": self.start_cost_s,
                "costs_span_slots": True}

    def to_json(self) -> dict:
        return {"format": FORMAT, "version": 3, "speed_factors": self.speed_factors, "samples": self.samples,
                "restart_cost_s": self.restart_cost_s, "restart_changes": self.restart_changes,
                "start_cost_s": self.start_cost_s, "start_jobs": self.start_jobs,
                "spread": self.spread, "kept_prior": self.kept_prior, "unknown_models": self.unknown_models,
                "intervals": list(self.intervals) if self.intervals else None,
                "sensitivity_factors": self.sensitivity_factors,
                "sensitivity_kept_prior": self.sensitivity_kept_prior}

    def write(self, path: Path) -> None:
        path.write_text(json.dumps(self.to_json(), indent=1, sort_keys=True) + "\n")

    @classmethod
    def read(cls, path: Path) -> "Calibration":
        doc = json.loads(Path(path).read_text())
        if doc.get("format") != FORMAT:
            raise ValueError(f"{path} is not a speed calibration (format {doc.get('format')!r})")
        return cls(speed_factors=doc["speed_factors"], samples=doc.get("samples", {}), spread=doc.get("spread", {}),
                   kept_prior=doc.get("kept_prior", []), unknown_models=doc.get("unknown_models", []),
                   intervals=tuple(doc["intervals"]) if doc.get("intervals") else None,
                   sensitivity_factors=doc.get("sensitivity_factors", {}),  # version 1 had none
                   sensitivity_kept_prior=doc.get("sensitivity_kept_prior", []),
                   # version 2 had no costs: the simulator's defaults
                   restart_cost_s=doc.get("restart_cost_s"), restart_changes=doc.get("restart_changes", 0),
                   start_cost_s=doc.get("start_cost_s"), start_jobs=doc.get("start_jobs", 0))


def _grant(job) -> tuple:
    return tuple(job.placement.get("ps", [])), tuple(job.placement.get("worker", []))


class Sample(NamedTuple):
    """One steady job-interval: `rate` = epochs trained / (epochs the speed table gives at its
    grant × usable seconds), i.e. speed factor / (1 + s · pressure); the pressure (interference
    .job_pressures) with every co-tenant (`full`) and with only those that were there all
    interval (`settled`): the truth lies between the two; `calm`: no job on its nodes started,
    moved or finished in the interval."""
    rate: float
    full: float
    settled: float
    calm: bool

    def exact(self) -> bool:
        return self.full == self.settled


def samples(records: list[IntervalRecord], scaling_cost_s: float = 30.0,
            speed_model: str = "measured") -> dict[str, list[Sample]]:
    """The steady job-intervals of `records` per catalog model (module doc: what is left out)."""
    speed = get_speed_model(speed_model)
    out: dict[str, list[Sample]] = {}
    previous: dict[str, tuple] = {}  # job uid -> grant in the previous interval of the history
    last_interval = None
    for rec in sorted(records, key=lambda r: r.interval):
        if last_interval is not None and rec.interval != last_interval + 1:
            previous = {}  # a gap in the history: nothing is known about the interval before
        last_interval = rec.interval
        index = {}
        placements = {}
        for j in rec.jobs:
            if j.workers > 0 and catalog.is_known(j.model_type):
                nodes = [index.setdefault(n, len(index)) for n in j.placement.get("ps", []) + j.placement.get("worker", [])]
                placements[j.uid] = (catalog.canonical_name(j.model_type), nodes)
        # Jobs that finished, or held nothing before (an admission step may have started them),
        # may have been on their nodes for part of the interval only: interference with them (the records cannot say
        # for how long) brackets the truth between "all interval" and "not at all".
        partial = {j.uid for j in rec.jobs if j.uid in placements and (j.finished or j.uid not in previous)}
        full = interference.job_pressures(placements)
        settled = {u: p for u, p in placements.items() if u not in partial}

        def without_partial(uid: str) -> float:  # the job itself stays, whatever it is
            if not partial:
                return full[uid]
            return interference.job_pressures({**settled, uid: placements[uid]})[uid]
        unsettled = {n for j in rec.jobs if j.workers > 0 and (j.finished or previous.get(j.uid) != _grant(j))
                     for n in j.placement.get("ps", []) + j.placement.get("worker", [])}
        now: dict[str, tuple] = {}
        for j in rec.jobs:
            if j.workers <= 0:
                continue
            grant = _grant(j)
            now[j.uid] = grant
            held_before = previous.get(j.uid)
            if j.finished or held_before is None or not held_before[1] or j.uid not in placements:
                continue
            model = placements[j.uid][0]
            rate = epochs_per_s(speed, model, ARCH.get(j.architecture, "ps"), j.ps, j.workers,
                                len(set(grant[1])))
            usable = rec.length_s - (scaling_cost_s if held_before != grant else 0.0)
            if rate * usable > 0 and j.epochs > 0:
                calm = not unsettled.intersection(grant[0] + grant[1])
                out.setdefault(model, []).append(
                    Sample(j.epochs / (rate * usable), full[j.uid], without_partial(j.uid), calm))
        previous = now
    return out


def _interference(s: Sample, sensitivity: float) -> float:
    """The speed factor interference predicts for a sample: the geometric middle of its
    bracket (exact when no neighbour was partial)."""
    return float(np.sqrt(1.0 / ((1.0 + sensitivity * s.full) * (1.0 + sensitivity * s.settled))))


def _chosen(found: list, min_samples: int) -> list:
    """Calm samples when there are enough of them: a neighbour that finished part-way through
    sped the job up for the rest of the interval, one that started slowed it."""
    calm = [s for s in found if s.calm]
    return calm if len(calm) >= min_samples else list(found)


def sensitivity_fit(found: list[Sample], min_samples: int, max_factor: float = SENSITIVITY_MAX,
                    seed: int = 0) -> float | None:
    """The sensitivity factor s that best explains the samples' rates as f / (1 + s · P) for
    one speed factor f, or None when the samples cannot tell s from f.

    Only exact samples (no partial neighbour: their pressure is known) count. For each s on a
    grid, the residuals log(rate · (1 + s · P)) should all be log f: the s whose residuals are
    tightest around their median wins (absolute deviations capped at 0.2, so that wild
    samples do not pull it). When the pressures are much alike, noise moves s a lot, and f
    with it (f is the rate extrapolated to no pressure at all): s is kept only when fits on
    BOOTSTRAP resamples of the samples agree, the middle 80 % of the speed factors they
    imply within ±SPEED_TOLERANCE of their median."""
    exact = _chosen([s for s in found if s.exact()], min_samples)
    if len(exact) < min_samples:
        return None
    rate = np.array([s.rate for s in exact])
    pressure = np.array([s.full for s in exact])
    grid = np.linspace(0.0, max_factor, int(max_factor / 0.005) + 1)
    log1p = np.log1p(grid[:, None] * pressure[None, :])  # (grid, samples)
    log_rate = np.log(rate)

    def fit(idx: np.ndarray) -> tuple[float, float]:
        residual = log_rate[idx][None, :] + log1p[:, idx]
        centre = np.median(residual, axis=1, keepdims=True)
        best = int(np.argmin(np.minimum(np.abs(residual - centre), 0.2).mean(axis=1)))
        return float(grid[best]), float(np.exp(centre[best, 0]))

    s, _ = fit(np.arange(rate.size))
    rng = np.random.default_rng(seed)
    speeds = np.array([fit(rng.integers(0, rate.size, rate.size))[1] for _ in range(BOOTSTRAP)])
    lo, mid, hi = np.percentile(speeds, [10, 50, 90])
    if (hi - lo) / 2 > SPEED_TOLERANCE * mid:
        return None
    return s


def job_timelines(records: list[IntervalRecord]) -> dict[str, list[tuple]]:
    """Per job uid, its intervals in order: (record, job interval)."""
    out: dict[str, list[tuple]] = {}
    for rec in sorted(records, key=lambda r: r.interval):
        for j in rec.jobs:
            out.setdefault(j.uid, []).append((rec, j))
    return out


def _time_lost(timeline: list[tuple], k: int, available: float) -> float | None:
    """Seconds a job whose grant began at entry k (`available` s of entry k after that) went
    without training: walking while the grant holds, at the first interval where it trained
    at least half the interval at the speed it measured there (a speed reported in an interval
    it hardly trained in may be the old pods' last report), the time available so far less
    the time its epochs take at that speed. When the grant changes first (the restart was cut
    short by another), the whole time if it trained nothing (a lower bound, kept so that long
    restarts are not left out), else the time less its epochs at the last speed it reported
    at this grant. None when that is unknown (records without speeds: the simulator's own),
    or when it finishes or the records end first."""
    grant = (timeline[k][1].ps, timeline[k][1].workers)
    epochs, speed = 0.0, None
    for i in range(k, len(timeline)):
        rec, j = timeline[i]
        if (j.ps, j.workers) != grant:
            if epochs <= 0:
                return available
            return max(0.0, available - epochs / speed) if speed else None
        if i > k:
            available += rec.length_s
        epochs += j.epochs
        speed = j.speed or speed
        if j.finished:
            return None
        if j.speed and j.epochs >= 0.5 * j.speed * rec.length_s:
            return max(0.0, available - epochs / j.speed)
    return None


def restart_cost(records: list[IntervalRecord]) -> tuple[float | None, int]:
    """The mean seconds a change of a running job's counts cost (`_time_lost` from the
    interval it began in: rounds change running jobs at interval starts), and how many changes
    it is read from. The mean, not the median: what the simulator must charge is the total a
    job lost, and on a real node that total sits in a few restarts cut short again and again
    (bench/real_runs, DRF: readings of 1.7-8.5 s beside 30, 30 and 47 s; over its 6 starts and
    10 changes the median, 8.1 s, charges 130 of the 276 job-s the records show lost, the mean,
    17.0 s, 272)."""
    lost = []
    for timeline in job_timelines(records).values():
        for k in range(1, len(timeline)):
            held, now = timeline[k - 1][1], timeline[k][1]
            if held.workers > 0 and now.workers > 0 and (held.ps, held.workers) != (now.ps, now.workers):
                found = _time_lost(timeline, k, timeline[k][0].length_s)
                if found is not None:
                    lost.append(found)
    return (float(np.mean(lost)) if lost else None), len(lost)


def start_cost(records: list[IntervalRecord]) -> tuple[float | None, int]:
    """The mean seconds from a job's creation to its training (`_time_lost`), and how many
    jobs it is read from: only jobs granted tasks in the interval they arrived in (admitted on
    arrival: they started when they were created)."""
    lost = []
    for timeline in job_timelines(records).values():
        rec, j = timeline[0]
        if j.workers <= 0 or seconds_of(j.created) < seconds_of(rec.start):
            continue  # waited for its tasks, or arrived before these records
        found = _time_lost(timeline, 0, seconds_of(rec.end) - seconds_of(j.created))
        if found is not None:
            lost.append(found)
    return (float(np.mean(lost)) if lost else None), len(lost)


def calibrate(records: list[IntervalRecord], prior: dict[str, float] | None = None, min_samples: int = 5,
              scaling_cost_s: float | None = None, with_interference: bool = True,
              sensitivity_prior: dict[str, float] | None = None, fit_sensitivity: bool = True) -> Calibration:
    """Speed factors and sensitivity factors per catalog model; a model with too few samples
    (or, for its sensitivity, samples that cannot tell it from speed) keeps its prior.
    `fit_sensitivity=False` charges the prior's (the table's) sensitivities and fits speeds
    only; `with_interference=False` charges no interference at all. The restart and start
    costs are read from the records too (restart_cost, start_cost, each from at least
    MIN_COST_SAMPLES); `scaling_cost_s` given overrides the restart cost read."""
    restart, changes = restart_cost(records)
    start, started = start_cost(records)
    if changes < MIN_COST_SAMPLES:
        restart = None
    if started < MIN_COST_SAMPLES:
        start = None
    if scaling_cost_s is not None:
        restart = scaling_cost_s
    found = samples(records, DEFAULT_SCALING_COST_S if restart is None else restart)
    factors, sensitivity = dict(prior or {}), dict(sensitivity_prior or {})
    counts, spread, kept, kept_sens = {}, {}, [], []
    for model in catalog.MODEL_NAMES:
        mine = found.get(model, [])
        if with_interference and fit_sensitivity:
            s = sensitivity_fit(mine, min_samples)
            if s is None:
                kept_sens.append(model)
            else:
                sensitivity[model] = round(s, 4)
        scale = sensitivity.get(model, 1.0)
        ratios = np.array([x.rate / _interference(x, scale) if with_interference else x.rate
                           for x in _chosen(mine, min_samples)])
        counts[model] = int(ratios.size)
        if ratios.size < min_samples:
            kept.append(model)
            continue
        med = float(np.median(ratios))
        factors[model] = round(med, 4)
        spread[model] = round(float(np.median(np.abs(ratios - med))), 4)
    unknown = sorted({j.model_type for r in records for j in r.jobs if not catalog.is_known(j.model_type)})
    span = (min(r.interval for r in records), max(r.interval for r in records)) if records else None
    return Calibration(factors, counts, spread, kept, unknown, span,
                       sensitivity_factors=sensitivity if with_interference else {},
                       sensitivity_kept_prior=(kept_sens if with_interference and fit_sensitivity
                                               else list(catalog.MODEL_NAMES)),
                       restart_cost_s=None if restart is None else round(restart, 2), restart_changes=changes,
                       # a start is charged apart only beside a measured restart (Calibration.sim_costs)
                       start_cost_s=None if start is None or restart is None else round(start, 2),
                       start_jobs=started)


def prediction_error(found: dict[str, list[Sample]], cal: Calibration | None) -> float:
    """Median |predicted / observed epochs - 1| over the exact samples, predicted by the
    simulator under `cal` (None: the catalog's speeds and the table's sensitivities): how
    well a calibration explains a history (report it on intervals it was not fitted on)."""
    errors = []
    for model, mine in found.items():
        f = cal.speed_factors.get(model, 1.0) if cal else 1.0
        s = cal.sensitivity_factors.get(model, 1.0) if cal else 1.0
        errors += [abs(f / (1.0 + s * x.full) / x.rate - 1.0) for x in mine if x.exact()]
    return float(np.median(errors)) if errors else float("nan")


def cost_line(cal: Calibration) -> str:
    """What the calibrated simulator charges a change of counts and a start, and from what."""
    least = MIN_COST_SAMPLES
    if cal.restart_cost_s is None:
        return (f"restart and start costs: the simulator's default, "
                f"{DEFAULT_SCALING_COST_S:g} s (the records hold {cal.restart_changes} "
                f"changes of a running job's counts, under {least})")
    start = (f"{cal.start_cost_s} s, the mean over {cal.start_jobs} jobs started on arrival"
             if cal.start_cost_s is not None else
             f"as a restart (the records hold {cal.start_jobs} jobs started on arrival, under {least})")
    return (f"restart cost: {cal.restart_cost_s} s, the mean over {cal.restart_changes} changes of "
            f"counts; start cost: {start}")
