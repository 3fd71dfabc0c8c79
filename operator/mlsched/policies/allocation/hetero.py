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
from mlsched.policies.speed_estimate import ObservedSpeed, SpeedEstimator


class HeteroDRF:
    name = "drf-hetero"

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

    def __init__(self, estimator_factory=ObservedSpeed, name: str | None = None):
        super().__init__(estimator_factory, name)

    def allocate(self, snapshot: Snapshot, ledger: Ledger) -> None:
        if not snapshot.typed:
            super().allocate(snapshot, ledger)
            return
        view = gpu_speed.normalised_snapshot(snapshot)
        est = self.estimator_factory(view)
        normal = {j.name: j for j in view.jobs}
        total = np.where(snapshot.total_capacity > 0, snapshot.total_capacity, 1.0)
        heap = []
        for i, job in enumerate(sorted(snapshot.jobs, key=lambda j: (j.arrival_s, j.name))):
            if ledger.grow_bundle(job):
                gain, role = self._gain(job, normal[job.name], ledger, est, total)
                heap.append((-gain, job.arrival_s, i, role, job))
        heapq.heapify(heap)
        while heap:
            neg_gain, arrival, i, role, job = heapq.heappop(heap)
            if -neg_gain <= 0:
                break
            if ledger.grow(job, role):
                gain, role = self._gain(job, normal[job.name], ledger, est, total)
                heapq.heappush(heap, (-gain, arrival, i, role, job))

    def _gain(self, job: JobView, seen: JobView, ledger: Ledger, est: SpeedEstimator,
              total: np.ndarray) -> tuple[float, Role]:
        """best_gain with the job's normalised observations (`seen`) and its ledger counts."""
        ps, w = ledger.count(job, "ps"), ledger.count(job, "worker")
        pace = gpu_speed.pace(job, ledger.worker_types(job)) if w else 1.0

        def time(p: int, n: int) -> float:
            f = est.epochs_per_s(seen, p, n) * pace
            return job.remaining_epochs / f if f > 0 else float("inf")

        now = time(ps, w)
        best: tuple[float, Role] = (-np.inf, "worker")
        roles: tuple[Role, ...] = ("worker", "ps") if job.uses_ps else ("worker",)
        for role in roles:
            if ledger.at_cap(job, role):
                continue
            after = time(ps + (role == "ps"), w + (role == "worker"))
            if not np.isfinite(after):
                continue
            gain = (now - after) if np.isfinite(now) else np.inf
            need = float(np.max(ledger.demand(job, role) / total))
            gain = gain / max(need, 1e-9)
            if gain > best[0]:
                best = (gain, role)
        return best
