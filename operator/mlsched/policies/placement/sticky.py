"""Stickiness, as a wrapper around any per-task placement rule.

Task ordinal k of a role goes back to the node it ran on last interval when that node still
has room (and is in the job's pool), so an unchanged job keeps its pods where they are
(StatefulSet ordinals map to task ordinals in the operator); otherwise the wrapped rule
chooses. Moving a running task costs a checkpoint-restart, which the heuristics do not weigh.
"""

from __future__ import annotations

import numpy as np

from mlsched.cluster.ledger import Ledger
from mlsched.cluster.types import JobView, Role
from mlsched.policies.base import PlacementPolicy, TaskByTaskPlacement


class Sticky(TaskByTaskPlacement):
    def __init__(self, inner: PlacementPolicy):
        self.inner = inner
        self.name = inner.name

    @property
    def card(self):
        """The wrapped policy's model card (a learned placement), else None."""
        return getattr(self.inner, "card", None)

    @property
    def for_round(self):
        """The wrapped learned placement's per-round copy (exploration, decision log), sticky
        too. A heuristic has none: reading it raises AttributeError, so hasattr is False."""
        inner_for_round = self.inner.for_round
        return lambda serving: Sticky(inner_for_round(serving))

    def choose_node(self, ledger: Ledger, job: JobView, role: Role, demand: np.ndarray) -> int | None:
        previous = job.ps_nodes if role == "ps" else job.worker_nodes
        if previous:  # (a new job, most of a cold round, has none)
            ordinal = ledger.count(job, role)  # tasks of this role the job holds so far this round
            if ordinal < len(previous):
                node = previous[ordinal]
                if node < len(ledger.snapshot.node_names) and ledger.fits_on(demand, node, job, role):
                    return node
        return self.inner.choose_node(ledger, job, role, demand)
