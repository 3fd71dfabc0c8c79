"""`none`: every job shares the whole cluster (one pool)."""

from __future__ import annotations

from mlsched.cluster.types import PoolPlan, Snapshot


class NoGrouping:
    name = "none"

    def group(self, snapshot: Snapshot) -> PoolPlan:
        return PoolPlan()
