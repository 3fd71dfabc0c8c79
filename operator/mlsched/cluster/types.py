"""What a policy sees (a Snapshot) and what it returns (a Decision).

A decision is a pure function of a snapshot. The simulator and the operator both build these
types, so a policy cannot tell which of them called it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import numpy as np

Role = Literal["ps", "worker"]
Arch = Literal["ps", "allreduce"]
ROLES: tuple[Role, Role] = ("ps", "worker")


@dataclass(frozen=True)
class SpeedObservation:
    """A speed a job really showed: epochs per second at (ps, workers), interference included."""

    ps: int
    workers: int
    epochs_per_s: float


@dataclass
class JobView:
    """One active (arrived, unfinished) job as a policy sees it."""

    name: str
    model: str  # canonical catalog name
    arch: Arch
    arrival_s: float
    total_epochs: float  # the user's estimate
    epochs_done: float = 0.0
    slots_run: int = 0  # intervals in which the job had tasks
    ps: int = 0  # counts and placement during the previous interval
    workers: int = 0
    ps_nodes: tuple[int, ...] = ()  # node index of PS ordinal k
    worker_nodes: tuple[int, ...] = ()
    min_ps: int = 1
    max_ps: int = 16
    min_workers: int = 1
    max_workers: int = 16
    requested_ps: int | None = None  # counts the user asked for (the `fixed` policy)
    requested_workers: int | None = None
    observations: tuple[SpeedObservation, ...] = ()
    pool: str | None = None  # node pool chosen by a grouping policy

    @property
    def remaining_epochs(self) -> float:
        return max(0.0, self.total_epochs - self.epochs_done)

    @property
    def uses_ps(self) -> bool:
        return self.arch == "ps"

    def bounds(self, role: Role) -> tuple[int, int]:
        if role == "ps":
            return (0, 0) if not self.uses_ps else (self.min_ps, self.max_ps)
        return self.min_workers, self.max_workers


@dataclass
class Snapshot:
    """The cluster at a decision point: nodes, their capacities and the active jobs."""

    time_s: float
    interval_s: float
    node_names: list[str]
    capacity: np.ndarray  # (N, 3) cpu, gpu, mem_gib
    jobs: list[JobView]  # arrival order
    node_pools: list[str] | None = None  # pool label per node, for grouping

    def __post_init__(self) -> None:
        self.capacity = np.asarray(self.capacity, dtype=np.float64)
        if self.capacity.ndim != 2 or self.capacity.shape[0] != len(self.node_names):
            raise ValueError("capacity must be an (N, 3) array with one row per node")

    @property
    def total_capacity(self) -> np.ndarray:
        return self.capacity.sum(axis=0)


@dataclass
class JobDecision:
    ps_nodes: list[int] = field(default_factory=list)
    worker_nodes: list[int] = field(default_factory=list)

    @property
    def ps(self) -> int:
        return len(self.ps_nodes)

    @property
    def workers(self) -> int:
        return len(self.worker_nodes)


@dataclass
class Decision:
    """Counts and node of every task, per job. Jobs absent from `jobs` get nothing this round."""

    jobs: dict[str, JobDecision]
    inferences: int = 0  # how many single-task decisions were made (for throughput figures)

    def counts(self, name: str) -> tuple[int, int]:
        d = self.jobs.get(name)
        return (d.ps, d.workers) if d else (0, 0)
