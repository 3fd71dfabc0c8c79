"""The three decision kinds, as Protocols every policy (heuristic or learned) implements.

A round runs grouping -> allocation (which places each task through the Packer and hence the
placement policy). The same objects are driven by the simulator and by the operator.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from mlsched.cluster.packing import Packer
from mlsched.cluster.types import Decision, JobView, Role, Snapshot


class PlacementPolicy(Protocol):
    """Chooses the node for one task; None when no allowed node fits it."""

    name: str

    def choose_node(self, packer: Packer, job: JobView, role: Role, demand: np.ndarray) -> int | None: ...


class AllocationPolicy(Protocol):
    """Decides how many PS and workers each job gets this interval by growing jobs in `packer`."""

    name: str

    def allocate(self, snapshot: Snapshot, packer: Packer) -> None: ...


class GroupingPolicy(Protocol):
    """Assigns jobs to node pools (Harmony co-location); an empty map means one shared pool."""

    name: str

    def group(self, snapshot: Snapshot) -> dict[str, str]: ...


def run_round(snapshot: Snapshot, allocation: AllocationPolicy, placement: PlacementPolicy,
              grouping: GroupingPolicy | None = None, sticky: bool = True) -> Decision:
    """One scheduling decision: a pure function of the snapshot (policies may keep learned
    parameters, never cluster state)."""
    if grouping is not None:
        pools = grouping.group(snapshot)
        for job in snapshot.jobs:
            job.pool = pools.get(job.name)
    packer = Packer(snapshot, placement, sticky=sticky)
    allocation.allocate(snapshot, packer)
    return packer.decision()
