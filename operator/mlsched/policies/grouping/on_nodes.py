"""A grouping that may pool only some of the snapshot's nodes (the operator's LabelNodes mode:
nodes that other tenants' pods or other policies' reservations use are not its to label,
controller/scheduling/pools.py `poolable`; docs/grouping.md, "In the cluster").

The inner policy (harmony, isolated, naive) decides on a snapshot of the allowed nodes only,
and its plan is mapped back: the other nodes belong to no pool. The policy's jobs may still
use them: a job the plan leaves ungrouped runs on the nodes in no pool (policies.round
.with_pools), and those are among them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from mlsched.cluster.types import JobView, PoolPlan, Snapshot


class OnNodes:
    def __init__(self, inner, allowed: Sequence[bool]):
        """`allowed`: per snapshot node, whether the grouping may put it in a pool."""
        self.inner = inner
        self.allowed = np.asarray(allowed, dtype=bool)
        self.name = getattr(inner, "name", type(inner).__name__)

    def group(self, snapshot: Snapshot) -> PoolPlan:
        if len(self.allowed) != len(snapshot.node_names):
            raise ValueError("`allowed` needs one entry per snapshot node")
        if self.allowed.all():
            return self.inner.group(snapshot)
        if not self.allowed.any():
            return PoolPlan()  # no node to pool: nothing is grouped
        plan = self.inner.group(restricted(snapshot, self.allowed))
        if plan.node_pools is None:
            return plan
        node_pools: list[str | None] = [None] * len(snapshot.node_names)
        for i, pool in zip(np.flatnonzero(self.allowed).tolist(), plan.node_pools):
            node_pools[i] = pool
        return dataclasses.replace(plan, node_pools=tuple(node_pools))


def restricted(snapshot: Snapshot, allowed: np.ndarray) -> Snapshot:
    """The snapshot of the allowed nodes only: per-node fields cut, each job's task nodes
    renumbered (tasks on the other nodes dropped from the node lists; the counts stay, so a
    grouping still sees which jobs run) and its node filters cut likewise."""
    keep = np.flatnonzero(allowed)
    index = {int(old): new for new, old in enumerate(keep.tolist())}
    cut: dict[int, np.ndarray] = {}  # one cut array per filter: jobs share filters

    def cut_mask(mask: np.ndarray) -> np.ndarray:
        found = cut.get(id(mask))
        if found is None:
            found = cut[id(mask)] = mask[keep]
        return found

    def job(j: JobView) -> JobView:
        return dataclasses.replace(
            j, ps_nodes=tuple(index[n] for n in j.ps_nodes if n in index),
            worker_nodes=tuple(index[n] for n in j.worker_nodes if n in index),
            node_filters={r: cut_mask(m) for r, m in (j.node_filters or {}).items()})

    return dataclasses.replace(
        snapshot, node_names=[snapshot.node_names[i] for i in keep],
        capacity=snapshot.capacity[keep], jobs=[job(j) for j in snapshot.jobs],
        node_pools=_pools([snapshot.node_pools[i] for i in keep]) if snapshot.node_pools else None,
        exclusive_in_use=[snapshot.exclusive_in_use[i] for i in keep]
        if snapshot.exclusive_in_use is not None else None,
        topology={k: v[keep] for k, v in snapshot.topology.items()},
        counted_free={k: v[keep] for k, v in snapshot.counted_free.items()})


def _pools(node_pools: list[str | None]) -> list[str | None] | None:
    """None when no node is in a pool (as the snapshot says "no pool in force")."""
    return node_pools if any(p is not None for p in node_pools) else None
