"""The two baselines Harmony is measured against (Lee et al., §V-A), as fixed partitions.

The nodes are cut into partitions of `nodes_per_pool` consecutive nodes (the last one takes
the remainder). A job keeps the partition it is in (read from `JobView.pool`, so nothing
lives in the object between rounds); a new one takes the lowest partition with room, in
arrival order; when none has room it waits (the waiting pool, no nodes).

- `isolated` (Optimus/SLAQ-like): one job per partition, dedicated machines. The paper picks
  the DoP that maximises CPU utilisation, the smallest in our profiles: one node each.
- `naive` (Gandiva-like, without its matching): `jobs_per_pool` jobs share a partition in
  arrival order, which is random with respect to their phases, and time-share its compute
  without coordination: the simulator charges both the co-location model and interference.
"""

from __future__ import annotations

from mlsched.cluster.types import WAITING_POOL, PoolPlan, Snapshot


class Partitioned:
    def __init__(self, name: str, jobs_per_pool: int, nodes_per_pool: int, prefix: str):
        if jobs_per_pool < 1 or nodes_per_pool < 1:
            raise ValueError("jobs_per_pool and nodes_per_pool must be >= 1")
        self.name = name
        self.jobs_per_pool = jobs_per_pool
        self.nodes_per_pool = nodes_per_pool
        self.prefix = prefix

    def group(self, snapshot: Snapshot) -> PoolPlan:
        n_nodes = len(snapshot.node_names)
        count = max(1, n_nodes // self.nodes_per_pool)
        names = [f"{self.prefix}{i}" for i in range(count)]
        node_pools = tuple(names[min(n // self.nodes_per_pool, count - 1)] for n in range(n_nodes))
        members: dict[str, int] = {p: 0 for p in names}
        job_pools: dict[str, str] = {}
        newcomers = []
        for j in snapshot.jobs:  # arrival order
            if j.pool in members and members[j.pool] < self.jobs_per_pool:
                job_pools[j.name] = j.pool
                members[j.pool] += 1
            else:
                newcomers.append(j)
        free = iter(p for p in names for _ in range(self.jobs_per_pool - members[p]))
        for j in newcomers:
            job_pools[j.name] = next(free, WAITING_POOL)
        return PoolPlan(job_pools, node_pools, {p: self.jobs_per_pool for p in names},
                        coordinated=False)


def isolated(nodes_per_job: int = 1) -> Partitioned:
    return Partitioned("isolated", 1, nodes_per_job, "iso")


def naive(jobs_per_pool: int = 2, nodes_per_pool: int = 2) -> Partitioned:
    return Partitioned("naive", jobs_per_pool, nodes_per_pool, "naive")
