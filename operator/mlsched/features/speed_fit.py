"""A job's speed curve as the scheduler currently believes it: the prior, scaled online.

The prior (workloads/speed_curve.py: the catalog's fit, a speed the user declared, or the
generic curve) gives the shape; what the job really showed (`JobView.observations`, epochs/s
at (ps, workers), interference included) corrects its scale. The correction is the geometric
mean of observed / predicted over the latest observations: one number, robust to noise, and
right after a single interval of training. A full refit of the shape needs several distinct
configurations and is what the `optimus` heuristic does (policies/speed_estimate.py).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence

from mlsched.cluster.types import JobView, SpeedObservation
from mlsched.workloads import gpu_types
from mlsched.workloads.speed_curve import SpeedCurve

RECENT = 8  # observations that count
MAX_CORRECTION = 8.0  # a prior is never trusted less than 8x off (a bad observation is capped)


def recent(observations: Sequence[SpeedObservation]) -> Sequence[tuple[int, int, float]]:
    """The latest RECENT observations, as (ps, workers, epochs_per_s) tuples. The operator's
    (controller/scheduling/snapshot.RecordedSpeeds) hand them over without building a SpeedObservation
    each: 80,000 of them for a 10,000-job round cost it 30 ms."""
    latest = getattr(observations, "latest", None)
    return latest(RECENT) if latest is not None else observations[-RECENT:]


#: A prior's speed function by the prior's identity (with the prior, so that an id is never
#: mistaken for a later curve's). Priors are shared by every job of a model (speed_curve's
#: caches), so a round builds a handful instead of one per job; bounded all the same.
_PRIOR_SPEEDS: dict[int, tuple[SpeedCurve, Callable[[int, int], float]]] = {}
_PRIOR_SPEEDS_MAX = 1024


def _prior_speed(prior: SpeedCurve) -> Callable[[int, int], float]:
    found = _PRIOR_SPEEDS.get(id(prior))
    if found is None or found[0] is not prior:
        if len(_PRIOR_SPEEDS) >= _PRIOR_SPEEDS_MAX:
            _PRIOR_SPEEDS.clear()
        found = _PRIOR_SPEEDS[id(prior)] = (prior, prior.speed_function())
    return found[1]


#: Speeds a job must have shown on each of two GPU types or more before they correct the
#: prior's ratios (one reading is as likely interference as the type).
TYPE_READINGS = 2
#: Corrected ratios stay within these bounds (a V100 = 1).
TYPE_RATIO_BOUNDS = (0.02, 2.0)
_TYPE_RATIOS: dict[tuple, dict[str, float]] = {}


def type_ratios(job: JobView) -> dict[str, float]:
    """The job's speed per GPU type relative to a V100 (workloads/gpu_types.py): the measured
    table's for a model it maps (and 1.0 everywhere for CPU-only workers); for any other model
    the prior, corrected online once the job has shown speeds on two types or more
    (TYPE_READINGS each): per observed type t its scale s_t, the geometric mean of observed /
    prior-curve speed over its readings there; the model's own scale c, the geometric mean of
    s_t / prior_t over the observed types (what the prior and the readings agree on); the
    ratio of an observed type becomes s_t / c. With one type observed the ratios stay the
    prior's: one type cannot tell the model's speed from the type's. Where the reference type
    (V100) is among those observed, c is its scale, so that it stays 1.0."""
    prior = gpu_types.ratios(job.model)
    types = job.observation_types
    if not types or prior is not gpu_types.PRIOR or len(types) != len(job.observations):
        return prior  # measured ratios (or CPU-only workers) stay; untyped readings say nothing
    last = job.observations[-1]
    key = (job.name, id(job.prior), len(types), tuple(last), types[-1])
    found = _TYPE_RATIOS.get(key)
    if found is not None:
        return found
    speed, log = _prior_speed(job.prior), math.log
    readings: dict[str, list[float]] = {}
    for o, t in zip(job.observations, types):
        predicted = speed(o.ps, o.workers)
        if t is not None and t in prior and o.epochs_per_s > 0 and predicted > 0:
            readings.setdefault(t, []).append(log(o.epochs_per_s / predicted))
    seen = {t: sum(v) / len(v) for t, v in readings.items() if len(v) >= TYPE_READINGS}
    out = prior
    if len(seen) >= 2:
        # The reference type defines 1.0: seen, it sets the model's scale; else the scale the
        # prior and the readings agree on.
        scale = (seen[gpu_types.REFERENCE] if gpu_types.REFERENCE in seen
                 else sum(s - log(prior[t]) for t, s in seen.items()) / len(seen))
        lo, hi = TYPE_RATIO_BOUNDS
        out = {**prior, **{t: min(max(math.exp(s - scale), lo), hi) for t, s in seen.items()}}
    if len(_TYPE_RATIOS) >= _PRIOR_SPEEDS_MAX:
        _TYPE_RATIOS.clear()
    _TYPE_RATIOS[key] = out
    return out


def type_speed(job: JobView, gpu_type: str | None) -> float:
    """One worker of `job` on a GPU of `gpu_type` (type_ratios), a V100 = 1.0; 1.0 for no
    type and for workers that use no GPU."""
    if gpu_type is None or not (job.worker_demand is not None and job.worker_demand[1] > 0):
        return 1.0
    return type_ratios(job)[gpu_type]


def pace(job: JobView, types) -> float:
    """The pace of `job` with workers on GPUs of `types`: its slowest worker's (1.0 for none)."""
    return min((type_speed(job, t) for t in types), default=1.0)


def type_normalised(job: JobView) -> JobView:
    """The job with each observed speed divided by the relative speed of the GPU type it was
    measured at (`JobView.observation_types`): what it would have shown on the reference type
    (a V100), so that one correction or fit serves every type. Untyped observations: the job
    itself."""
    types = job.observation_types
    if not types or len(types) != len(job.observations) or all(t is None for t in types):
        return job
    obs = tuple(SpeedObservation(o.ps, o.workers, o.epochs_per_s / type_speed(job, t))
                for o, t in zip(job.observations, types))
    return dataclasses.replace(job, observations=obs, observation_types=())


def correction(job: JobView) -> float:
    """observed / prior speed (geometric mean over recent observations); 1 without any."""
    if not job.observations:  # a new job (most of a cold round): nothing to build
        return 1.0
    speed, log = _prior_speed(job.prior), math.log
    logs = []
    for ps, workers, epochs_per_s in recent(job.observations):  # (asked of 10,000 jobs a round)
        predicted = speed(ps, workers)
        if epochs_per_s > 0 and predicted > 0:
            logs.append(log(epochs_per_s / predicted))
    if not logs:
        return 1.0
    c = math.exp(sum(logs) / len(logs))
    return min(max(c, 1.0 / MAX_CORRECTION), MAX_CORRECTION)


def job_curve(job: JobView) -> SpeedCurve:
    c = correction(job)
    return job.prior if c == 1.0 else job.prior.scaled(c)
