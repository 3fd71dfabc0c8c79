"""Tetris allocation (Grandl et al., SIGCOMM'14) as a job-level multi-resource ledger.

Each step scores every job that can still grow: packing alignment (the best dot product of a
node's normalised free resources with the job's bundle demand) plus a weighted preference for
the *shortest* remaining work, then gives the best job one bundle. The weight balances the two
terms' means, as the DL² code does, but that code adds remaining work to the score and so
favours the longest jobs, starving nearly finished ones; we follow the paper.
"""

from __future__ import annotations

import numpy as np

from mlsched.cluster.ledger import Ledger
from mlsched.cluster.types import Snapshot
from mlsched.policies.allocation.simple import SRTF
from mlsched.policies.speed_estimate import ObservedSpeed


class Tetris:
    name = "tetris"
    learned = False

    def __init__(self, estimator_factory=ObservedSpeed):
        self.estimator_factory = estimator_factory

    def allocate(self, snapshot: Snapshot, ledger: Ledger) -> None:
        jobs = list(snapshot.jobs)
        if not jobs:
            return
        est = self.estimator_factory(snapshot)
        remaining = np.array([SRTF.remaining_time(None, j, est) for j in jobs])  # type: ignore[arg-type]
        finite = remaining[np.isfinite(remaining)]
        scale = finite.max() if finite.size else 1.0
        shortness = np.where(np.isfinite(remaining), 1.0 - remaining / max(scale, 1e-12), 0.0)
        mean_node = snapshot.total_capacity / max(len(snapshot.capacity), 1)
        bundle = np.array([
            j.worker_demand + (j.ps_demand if j.uses_ps else 0) for j in jobs
        ]) / np.where(mean_node > 0, mean_node, 1)
        active = np.ones(len(jobs), dtype=bool)
        cap = ledger.capacity
        while active.any():
            free_norm = np.divide(ledger.free, cap, out=np.zeros_like(cap), where=cap > 0)
            align = (free_norm @ bundle.T).max(axis=0)  # best node per job
            a_mean = align[active].mean()
            s_mean = shortness[active].mean()
            weight = a_mean / s_mean if s_mean > 0 else 0.0
            score = np.where(active, align + weight * shortness, -np.inf)
            i = int(np.argmax(score))
            if not ledger.grow_bundle(jobs[i]):
                active[i] = False
