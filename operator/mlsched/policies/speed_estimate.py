"""What a deployed heuristic may know about a job's speed: what jobs have shown.

`ObservedSpeed` fits the Optimus model per model type to every speed observation in the
snapshot (profiling runs and intervals actually trained, interference included), the way
Optimus learns online. With too few distinct configurations for a model it falls back to
scaling the job's latest observation, and with none at all to the catalog's reference speed
of the model type at 1 PS + 1 worker (a profiling figure, flat in the counts; for a model
outside the catalog, its prior curve's), so estimates can be wrong, which is the point of
comparing `optimus` with `optimus-oracle`. Observations are pooled per (model label, arch).
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from mlsched.cluster.types import JobView, Snapshot
from mlsched.workloads import catalog, optimus_model, speed_table
from mlsched.workloads.speed_models import SpeedModel, epochs_per_s



def reference_epochs_per_s(job: JobView) -> float:
    if catalog.is_known(job.model):
        return speed_table.table_speed(job.model, 1, 1) / catalog.MODELS[job.model].steps_per_epoch
    return job.prior.reference_epochs_per_s()


class SpeedEstimator(Protocol):
    def epochs_per_s(self, job: JobView, ps: int, workers: int) -> float: ...


class TrueSpeed:
    """The simulator's true speed function (no interference): the oracle."""

    def __init__(self, speed_model: SpeedModel):
        self.speed_model = speed_model

    def epochs_per_s(self, job: JobView, ps: int, workers: int) -> float:
        if workers <= 0 or (job.uses_ps and ps <= 0):
            return 0.0
        return epochs_per_s(self.speed_model, job.model, job.arch, ps, workers)


class ObservedSpeed:
    def __init__(self, snapshot: Snapshot):
        samples: dict[tuple[str, str], list] = {}
        self._batch: dict[tuple[str, str], float] = {}
        for job in snapshot.jobs:
            self._batch[(job.model, job.arch)] = job.prior.global_batch
            for o in job.observations:
                if o.epochs_per_s > 0 and o.workers > 0:
                    samples.setdefault((job.model, job.arch), []).append(o)
        self._theta: dict[tuple[str, str], np.ndarray] = {}
        for key, obs in samples.items():
            configs = {(o.ps, o.workers) for o in obs}
            if len(configs) < 3:
                continue
            arch = key[1]
            p = np.array([max(o.ps, 1) if arch == "ps" else 1 for o in obs])
            w = np.array([o.workers for o in obs])
            s = np.array([o.epochs_per_s for o in obs])
            theta = optimus_model.fit(p, w, s, self._batch[key])
            if arch != "ps":
                theta[[2, 4]] = 0.0  # a ring has no PS terms
            self._theta[key] = theta

    def epochs_per_s(self, job: JobView, ps: int, workers: int) -> float:
        if workers <= 0 or (job.uses_ps and ps <= 0):
            return 0.0
        theta = self._theta.get((job.model, job.arch))
        if theta is not None:
            p = ps if job.uses_ps else 1
            return float(optimus_model.predict(theta, p, workers, job.prior.global_batch))
        if job.observations:
            last = job.observations[-1]
            tasks_then = last.ps + last.workers
            # Linear in the task count: crude, and knowingly so.
            return last.epochs_per_s * (ps + workers) / tasks_then if tasks_then else 0.0
        return reference_epochs_per_s(job)
