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


def type_normalised(job: JobView) -> JobView:
    """The job with each observed speed divided by the relative speed of the GPU type it was
    measured at (`JobView.observation_types`): what it would have shown on the reference type
    (a V100), so that one correction or fit serves every type. Untyped observations: the job
    itself."""
    types = job.observation_types
    if not types or len(types) != len(job.observations) or all(t is None for t in types):
        return job
    uses_gpu = bool(job.worker_demand is not None and job.worker_demand[1] > 0)
    obs = tuple(SpeedObservation(o.ps, o.workers,
                                 o.epochs_per_s / gpu_types.relative_speed(job.model, t, uses_gpu))
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
