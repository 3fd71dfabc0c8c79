"""Optimus allocation (Peng et al., EuroSys'18), greedy by marginal gain.

Every job first gets its starting gang (in arrival order, where it fits). Then, repeatedly,
the task (one PS or one worker) with the largest gain goes to its job, where gain = the drop
in the job's estimated remaining time divided by the task's dominant-resource share of the
cluster. It stops when no task shortens any job. A task that does not fit anywhere takes its
job out of the running and the others go on.

`optimus` estimates speeds from what jobs have shown (ObservedSpeed), as a deployed Optimus
must; `optimus-oracle` is handed the simulator's true speed function (TrueSpeed): an upper
bound on what Optimus could do, and a hard baseline.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable

import numpy as np

from mlsched.cluster.ledger import Ledger
from mlsched.cluster.types import JobView, Role, Snapshot
from mlsched.policies.speed_estimate import ObservedSpeed, SpeedEstimator


class Optimus:
    name = "optimus"
    learned = False

    def __init__(self, estimator_factory=ObservedSpeed, name: str | None = None):
        self.estimator_factory = estimator_factory
        if name:
            self.name = name

    @staticmethod
    def _time(job: JobView, est: SpeedEstimator, ps: int, workers: int) -> float:
        f = est.epochs_per_s(job, ps, workers)
        return job.remaining_epochs / f if f > 0 else float("inf")

    def best_gain(self, job: JobView, ledger: Ledger, est: SpeedEstimator, total: np.ndarray,
                  time: Callable[[int, int], float] | None = None) -> tuple[float, Role]:
        """The job's best next task and its gain. `time(ps, workers)`: its estimated remaining
        time at those counts (default: the estimator's speed; optimus-hetero scales it by the
        pace of its workers' GPU type)."""
        if time is None:
            def time(p: int, n: int) -> float:
                return self._time(job, est, p, n)
        ps, w = ledger.count(job, "ps"), ledger.count(job, "worker")
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

    def gain_function(self, snapshot: Snapshot) -> Callable[[JobView, Ledger, np.ndarray], tuple[float, Role]]:
        """(job, ledger, total capacity) -> the job's best next task and its gain, this round."""
        est = self.estimator_factory(snapshot)
        return lambda job, ledger, total: self.best_gain(job, ledger, est, total)

    def allocate(self, snapshot: Snapshot, ledger: Ledger) -> None:
        gain_of = self.gain_function(snapshot)
        total = np.where(snapshot.total_capacity > 0, snapshot.total_capacity, 1.0)
        heap = []
        for i, job in enumerate(sorted(snapshot.jobs, key=lambda j: (j.arrival_s, j.name))):
            if ledger.grow_bundle(job):
                gain, role = gain_of(job, ledger, total)
                heap.append((-gain, job.arrival_s, i, role, job))
        heapq.heapify(heap)
        while heap:
            neg_gain, arrival, i, role, job = heapq.heappop(heap)
            if -neg_gain <= 0:
                break
            if ledger.grow(job, role):
                gain, role = gain_of(job, ledger, total)
                heapq.heappush(heap, (-gain, arrival, i, role, job))
