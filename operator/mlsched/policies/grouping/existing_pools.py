"""A grouping onto node pools that already exist (an admin's labels, e.g. a cloud provider's
node-pool label): the operator's ExistingPools mode (docs/grouping.md, "In the cluster").

The inner policy (harmony, isolated, naive) groups jobs and gives each group machines as if
it could draw any pool; `OntoExistingPools` then gives each group one existing pool, whole:
a group already named after an existing pool keeps it; the others, largest first, take the
free pool whose node count is nearest above what the policy wanted (else the largest free
one); a group left without a pool waits. Nodes of pools no group took belong to no pool. The
forecasts keep the policy's prediction for the machines it wanted, with the pool's node count.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from mlsched.cluster.types import WAITING_POOL, PoolPlan, Snapshot


class OntoExistingPools:
    def __init__(self, inner, labels: Sequence[str | None]):
        """`labels`: the existing pool of each snapshot node (None: in no pool)."""
        self.inner = inner
        self.labels = tuple(labels)
        self.name = getattr(inner, "name", type(inner).__name__)

    def group(self, snapshot: Snapshot) -> PoolPlan:
        plan = self.inner.group(snapshot)
        if plan.is_shared:
            return plan
        return project(plan, self.labels, snapshot)


def project(plan: PoolPlan, labels: Sequence[str | None], snapshot: Snapshot) -> PoolPlan:
    existing: dict[str, int] = {}
    for label in labels:
        if label is not None:
            existing[label] = existing.get(label, 0) + 1
    members: dict[str, list[str]] = {}
    for job, pool in plan.job_pools.items():
        if pool != WAITING_POOL:
            members.setdefault(pool, []).append(job)
    wanted = {pool: sum(1 for p in plan.node_pools or () if p == pool) for pool in members}
    rename: dict[str, str] = {}
    for pool in members:
        if pool in existing:
            rename[pool] = pool
    free = [p for p in existing if p not in rename.values()]
    for pool in sorted((p for p in members if p not in rename), key=lambda p: (-wanted[p], p)):
        if not free:
            break
        above = [p for p in free if existing[p] >= wanted[pool]]
        pick = (min(above, key=lambda p: (existing[p], p)) if above
                else max(free, key=lambda p: (existing[p], p)))
        rename[pool] = pick
        free.remove(pick)
    taken = set(rename.values())
    job_pools = {job: rename.get(pool, WAITING_POOL) for job, pool in plan.job_pools.items()}
    node_pools = tuple(label if label in taken else None for label in labels)
    shares = {rename[p]: s for p, s in plan.shares.items() if p in rename}
    forecasts = {rename[p]: dataclasses.replace(f, nodes=existing[rename[p]])
                 for p, f in plan.forecasts.items() if p in rename}
    moved = tuple(j.name for j in snapshot.jobs
                  if j.workers > 0 and j.pool is not None and job_pools.get(j.name) != j.pool)
    return dataclasses.replace(plan, job_pools=job_pools, node_pools=node_pools, shares=shares,
                               forecasts=forecasts, moved=moved)
