"""Heterogeneity-aware DRF and Optimus: a worker valued by its effective throughput (Gavel).

On a cluster whose nodes carry GPU types (Snapshot.gpu_types) a worker on a K80 is not worth a
worker on a V100, and how much less depends on the model (workloads/gpu_types.py). Both
policies value a job's workers by its relative speed on the type they get (the placement's
choice, read back from the ledger: pair them with `gpu-type-aware` placement, which keeps a
job's workers on one type):

- `drf-hetero`: DRF by progressive filling, the GPU share counted in effective throughput:
  the job's workers times its relative speed on their type, over what every GPU of the
  cluster would give it (Σ over nodes of GPUs x its relative speed there). The share a job
  holds is what it gets of the throughput the cluster could give it, as Gavel's max-min
  fairness normalises throughput; CPU and memory count as in DRF.
- `optimus-hetero`: Optimus's marginal gain with the estimated speed scaled by the job's
  relative speed on its workers' type. Speeds jobs showed are first divided by the relative
  speed of the type they were measured at (policies/gpu_speed.py), so one fit per model
  serves every type.

On an untyped cluster both decide exactly as `drf` and `optimus` do (tests hold this).
"""

from __future__ import annotations

import heapq

import numpy as np

from mlsched.cluster.ledger import Ledger
from mlsched.cluster.types import JobView, Role, Snapshot
from mlsched.policies import gpu_speed
from mlsched.policies.allocation.drf import DRF
from mlsched.policies.allocation.optimus import Optimus


class HeteroDRF:
    name = "drf-hetero"
    learned = False

    def allocate(self, snapshot: Snapshot, ledger: Ledger) -> None:
        if not snapshot.typed:
            DRF().allocate(snapshot, ledger)
            return
        heap = [(0.0, job.arrival_s, i) for i, job in enumerate(snapshot.jobs)]
        heapq.heapify(heap)
        whole: dict[str, float] = {}
        while heap:
            _, arrival, i = heapq.heappop(heap)
            job = snapshot.jobs[i]
            if ledger.grow_bundle(job):
                heapq.heappush(heap, (self.share(ledger, job, whole), arrival, i))

    @staticmethod
    def share(ledger: Ledger, job: JobView, whole: dict[str, float] | None = None) -> float:
        """The job's dominant share with GPUs counted in effective throughput: its workers'
        GPUs times its relative speed on their type, over Σ GPUs x its relative speed on each
        node's type (`whole`: a cache of the latter by job name)."""
        used = ledger.used_share(job)
        if not gpu_speed.uses_gpu(job):
            return float(used.max())
        whole = {} if whole is None else whole
        if job.name not in whole:
            snap = ledger.snapshot
            whole[job.name] = float(sum(g * gpu_speed.relative_speed(job, t)
                                        for g, t in zip(snap.capacity[:, 1], snap.gpu_types)))
        pace = gpu_speed.pace(job, ledger.worker_types(job))
        effective = ledger.count(job, "worker") * job.worker_demand[1] * pace / max(whole[job.name], 1e-9)
        return float(max(used[0], used[2], effective))


class HeteroOptimus(Optimus):
    name = "optimus-hetero"

    def gain_function(self, snapshot: Snapshot):
        """Optimus's gain with the job's observations normalised to the reference type and its
        estimated speed scaled by the pace of its workers' type."""
        if not snapshot.typed:
            return super().gain_function(snapshot)
        view = gpu_speed.normalised_snapshot(snapshot)
        est = self.estimator_factory(view)
        normal = {j.name: j for j in view.jobs}

        def gain(job: JobView, ledger: Ledger, total: np.ndarray) -> tuple[float, Role]:
            seen = normal[job.name]
            pace = gpu_speed.pace(job, ledger.worker_types(job)) if ledger.count(job, "worker") else 1.0

            def time(p: int, n: int) -> float:
                f = est.epochs_per_s(seen, p, n) * pace
                return job.remaining_epochs / f if f > 0 else float("inf")
            return self.best_gain(job, ledger, est, total, time)
        return gain
