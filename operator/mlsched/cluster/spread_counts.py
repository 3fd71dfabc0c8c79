"""Topology spread constraints in a round's ledger (JobView.spreads, Spread): per spread token,
the tasks each domain of its topology holds, kept as tasks are booked and released, and the
nodes one more task may go on.
"""

from __future__ import annotations

from collections.abc import Hashable

import numpy as np

from mlsched.cluster.types import JobView, Role, Snapshot, Spread


class SpreadCounts:
    """Counts per spread token, starting from what `snapshot` says is held (spread_held); the
    snapshot itself is never changed."""

    def __init__(self, snapshot: Snapshot):
        self.snapshot = snapshot
        self._counts_of: dict[Hashable, np.ndarray] = {}

    def room(self, spread: Spread) -> np.ndarray:
        """The nodes one more task under `spread` may go on (see Spread)."""
        domains = self.snapshot.topology[spread.key]
        counts = self._counts(spread.token, domains)
        eligible = counts[spread.eligible]
        low = int(eligible.min()) if len(eligible) >= spread.min_domains and len(eligible) else 0
        room = counts + 1 - low <= spread.max_skew  # per domain
        return (domains >= 0) & room[np.maximum(domains, 0)]

    def count(self, job: JobView, role: Role, node: int, step: int) -> None:
        """Add `step` (1: booked, -1: released) for a task of `job`'s `role` on `node`."""
        for token, key in job.spread_counts.get(role, ()):
            domains = self.snapshot.topology[key]
            if domains[node] >= 0:
                self._counts(token, domains)[domains[node]] += step

    def _counts(self, token: Hashable, domains: np.ndarray) -> np.ndarray:
        counts = self._counts_of.get(token)
        if counts is None:
            held = self.snapshot.spread_held.get(token)
            counts = self._counts_of[token] = (
                np.array(held, dtype=np.int32) if held is not None  # a copy: booking changes it
                else np.zeros(int(domains.max(initial=-1)) + 1, dtype=np.int32))
        return counts
