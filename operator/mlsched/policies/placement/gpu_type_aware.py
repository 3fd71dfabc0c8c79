"""`gpu-type-aware` placement: the GPU type as well as the node (Gavel's heterogeneity, OSDI'20).

On a cluster whose nodes carry GPU types (Snapshot.gpu_types), a job trains at the pace of its
slowest worker's type (workloads/gpu_types.py), so a job's workers spread over types waste the
faster GPUs. The rule, per task:

- a job's first worker goes to the type where the job would train fastest with the workers
  it could get there: its relative speed on the type (the measured table, or the prior) times
  its speed curve at min(the type's room, the workers it wants: as many as it ran with last
  interval, its gang, or an even split of the cluster's GPUs among the GPU jobs), among the
  types with room for its gang; among that type's nodes, the least loaded. Where types rank
  alike for every model, the jobs granted first (the allocation's order) take the fastest
  GPUs, and the rest go where room is left;
- every further worker goes only to nodes of the type its workers already have (none fits:
  the job grows no further this round). A job is spread over types only when no single type
  has room for its gang;
- PS tasks and workers that request no GPU are placed as load-balance places them.

Stickiness is built in (a type-blind wrapper could send a task back to a node of another type):
ordinal k goes back to last interval's node when it fits and is of the type chosen for the
job. On an untyped cluster every task is placed exactly as sticky load-balance places it.
"""

from __future__ import annotations

import numpy as np

from mlsched.cluster.ledger import Ledger
from mlsched.cluster.types import JobView, Role, Snapshot
from mlsched.policies import gpu_speed
from mlsched.policies.base import PlacementRequest, TaskByTaskPlacement
from mlsched.policies.placement.heuristics import LoadBalance
from mlsched.policies.placement.sticky import Sticky


class GpuTypeAware(TaskByTaskPlacement):
    name = "gpu-type-aware"

    def __init__(self, sticky: bool = True):
        self.sticky = sticky
        self._untyped = Sticky(LoadBalance()) if sticky else LoadBalance()
        self._lb = LoadBalance()
        self._masks: tuple[object, dict[str | None, np.ndarray]] | None = None
        self._share: tuple[Snapshot, int] | None = None

    def place(self, request: PlacementRequest):
        if not request.snapshot.typed:
            return self._untyped.place(request)
        return super().place(request)

    def choose_node(self, ledger: Ledger, job: JobView, role: Role, demand: np.ndarray) -> int | None:
        snap = ledger.snapshot
        if not snap.typed:
            return self._untyped.choose_node(ledger, job, role, demand)
        if role == "ps" or not gpu_speed.uses_gpu(job):
            previous = self._previous(ledger, job, role, demand)
            return previous if previous is not None else self._lb.choose_node(ledger, job, role, demand)
        have = ledger.worker_types(job)
        if have:
            target = min(have, key=lambda t: gpu_speed.relative_speed(job, t))
        else:
            target = self._first_type(ledger, job, demand)
            if target is None:  # no single type has room for its gang: wherever it fits
                return self._lb.choose_node(ledger, job, role, demand)
        previous = self._previous(ledger, job, role, demand)
        if previous is not None and snap.gpu_type(previous) == target:
            return previous
        mask = ledger.fits_mask(demand, job, role) & self._type_mask(snap, target)
        if not mask.any():
            return None
        return int(np.where(mask, ledger.load, np.inf).argmin())

    def _previous(self, ledger: Ledger, job: JobView, role: Role, demand: np.ndarray) -> int | None:
        """Last interval's node of the task's ordinal, when it fits (stickiness)."""
        if not self.sticky:
            return None
        previous = job.ps_nodes if role == "ps" else job.worker_nodes
        ordinal = ledger.count(job, role)
        if ordinal < len(previous):
            node = previous[ordinal]
            if node < len(ledger.snapshot.node_names) and ledger.fits_on(demand, node, job, role):
                return node
        return None

    def _first_type(self, ledger: Ledger, job: JobView, demand: np.ndarray) -> str | None:
        """The type where `job` would train fastest with the workers it can get there: its
        relative speed on the type times its speed curve at min(room on the type, the workers
        it wants), among the types with room for its gang; None if none has."""
        snap = ledger.snapshot
        gang = max(job.starting_gang[1], 1)
        want = max(gang, len(job.worker_nodes) if self.sticky else 0, self._fair_share(snap),
                   job.requested_workers or 0)
        want = min(want, job.max_workers)
        fits = ledger.fits_mask(demand, job, "worker")
        free = ledger.free_by_resource  # (3, N)
        used = demand > 0
        per_node = np.floor(np.min(free[used] / demand[used, None], axis=0) + 1e-9)
        per_node = np.where(fits, per_node, 0)
        best, best_score = None, -1.0
        for t, mask in self._type_masks(snap).items():
            room = int(per_node[mask].sum())
            if room < gang:
                continue
            k = min(room, want)
            score = gpu_speed.relative_speed(job, t) * job.prior.epochs_per_s(k if job.uses_ps else 0, k)
            if score > best_score:
                best, best_score = t, score
        return best

    def _fair_share(self, snap: Snapshot) -> int:
        """Workers per GPU job if the cluster's GPUs were split evenly among them (once per
        snapshot: a round asks for every job's gang)."""
        if self._share is None or self._share[0] is not snap:
            gpu_jobs = sum(1 for j in snap.jobs if gpu_speed.uses_gpu(j))
            self._share = (snap, int(snap.total_capacity[1] // max(gpu_jobs, 1)))
        return self._share[1]

    def _type_masks(self, snap: Snapshot) -> dict[str | None, np.ndarray]:
        """Per GPU type, its nodes (made once per snapshot)."""
        if self._masks is None or self._masks[0] is not snap.gpu_types:  # (held: ids stay unique)
            types = np.array([str(t) for t in snap.gpu_types], dtype=object)
            masks = {t: types == str(t) for t in dict.fromkeys(snap.gpu_types)}
            self._masks = (snap.gpu_types, masks)
        return self._masks[1]

    def _type_mask(self, snap: Snapshot, gpu_type: str | None) -> np.ndarray:
        return self._type_masks(snap)[gpu_type]
