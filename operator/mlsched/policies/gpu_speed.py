"""What a heterogeneity-aware policy knows of a job's speed on each GPU type.

A job's relative speed per type comes from the measured table (workloads/gpu_types.py) for a
catalog model, the prior for any other, corrected online once the job has shown speeds on two
types (features/speed_fit.type_ratios); a job whose workers request no GPU runs alike on every
type. Speeds a job showed are divided by the relative speed of the type they were measured at
(`JobView.observation_types`), so that one fit serves every type: `normalised` views.
"""

from __future__ import annotations

import dataclasses

from mlsched.cluster.types import JobView, Snapshot
from mlsched.features import speed_fit


def uses_gpu(job: JobView) -> bool:
    return bool(job.worker_demand is not None and job.worker_demand[1] > 0)


def relative_speed(job: JobView, gpu_type: str | None) -> float:
    """One worker of `job` on a GPU of `gpu_type`, a V100 = 1.0 (None: untyped, 1.0): the
    measured table's, or the prior corrected by what the job showed (speed_fit.type_ratios)."""
    return speed_fit.type_speed(job, gpu_type)


def pace(job: JobView, types) -> float:
    """The pace of `job` with workers on GPUs of `types` (its slowest worker's)."""
    return speed_fit.pace(job, types)


def normalised(job: JobView) -> JobView:
    """The job with each observed speed divided by the relative speed of the GPU type it was
    measured at: what it would have shown on the reference type (a V100)."""
    return speed_fit.type_normalised(job)


def normalised_snapshot(snapshot: Snapshot) -> Snapshot:
    return dataclasses.replace(snapshot, jobs=[normalised(j) for j in snapshot.jobs])
