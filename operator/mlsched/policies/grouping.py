"""Grouping policies (Harmony co-location). `none`: every job shares the whole cluster."""

from __future__ import annotations

from mlsched.cluster.types import Snapshot


class NoGrouping:
    name = "none"

    def group(self, snapshot: Snapshot) -> dict[str, str]:
        return {}
