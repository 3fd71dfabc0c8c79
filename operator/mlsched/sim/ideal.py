"""A job's ideal time: alone on the empty cluster at its best allocation, the bound no
scheduler beats (SimResult.ideal_s, the slowdowns' denominator)."""

from __future__ import annotations

import numpy as np

from mlsched.cluster.ledger import Ledger
from mlsched.cluster.types import JobView, Snapshot
from mlsched.policies.placement.heuristics import LoadBalance
from mlsched.sim.config import SimConfig
from mlsched.workloads import gpu_types
from mlsched.workloads.speed_models import SpeedModel, epochs_per_s
from mlsched.workloads.traces import TraceJob


class IdealTimes:
    """Ideal times on one simulated cluster; the best rate of each (model, architecture) is
    searched once."""

    def __init__(self, speed: SpeedModel, config: SimConfig, capacity: np.ndarray,
                 node_names: list[str], types: tuple[str, ...] | None):
        self.speed = speed
        self.config = config
        self.capacity = capacity
        self.node_names = node_names
        self.gpu_types = types
        self._best_rates: dict[tuple[str, str, bool], float] = {}

    def of(self, job: TraceJob, pairs: bool = False) -> float:
        """`job`'s ideal time; `pairs`: at its best allocation with as many PS as workers (the
        bound of a policy that grows jobs by worker-PS pairs, Chic-Pair)."""
        best = self.best_rate(job.model, job.arch, pairs)
        if self.gpu_types is not None:  # on the fastest type the cluster has for it
            best *= max(gpu_types.relative_speed(job.model, t, self.config.uses_gpu(job.model))
                        for t in set(self.gpu_types))
        return job.epochs / best if best > 0 else float("inf")

    def best_rate(self, model: str, arch: str, pairs: bool = False) -> float:
        key = (model, arch, pairs)
        if key not in self._best_rates:
            self._best_rates[key] = self._search_best_rate(model, arch, pairs)
        return self._best_rates[key]

    def _search_best_rate(self, model: str, arch: str, pairs: bool = False) -> float:
        """Try configurations from the fastest down; the first that fits the empty cluster wins
        (an all-reduce ring inside one node can beat its inter-node estimate, so we also look
        at the next few)."""
        cfg = self.config
        snap = Snapshot(0.0, cfg.interval_s, self.node_names, self.capacity, [])
        ps_range = range(1, cfg.max_ps + 1) if arch == "ps" else [0]
        configs = sorted(((epochs_per_s(self.speed, model, arch, ps, w), ps, w)
                          for ps in ps_range for w in range(1, cfg.max_workers + 1)
                          if not (pairs and arch == "ps" and ps != w)), reverse=True)
        best, feasible_seen = 0.0, 0
        for _, ps, w in configs:
            job = JobView("ideal", model, arch, 0.0, 1.0, min_ps=ps, min_workers=w,
                          max_ps=max(ps, 1), max_workers=w,
                          ps_demand=cfg.demand(model, "ps"), worker_demand=cfg.demand(model, "worker"))
            ledger = Ledger(snap, LoadBalance())
            if not ledger.grow(job, "worker"):
                continue
            nodes = ledger.jobs["ideal"].worker_nodes
            best = max(best, epochs_per_s(self.speed, model, arch, ps, w, len(set(nodes))))
            feasible_seen += 1
            if arch == "ps" or feasible_seen >= 8:
                break
        return best
