"""What the simulator keeps of each job of the trace: its progress, where its tasks run, its
speed observations and measured phases, and the busy time it has kept its nodes at.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from mlsched.cluster.types import SpeedObservation
from mlsched.workloads.traces import TraceJob


@dataclass
class JobState:
    spec: TraceJob
    epochs_done: float = 0.0
    ps_nodes: tuple[int, ...] = ()
    worker_nodes: tuple[int, ...] = ()
    slots_run: int = 0
    observations: list[SpeedObservation] = field(default_factory=list)
    # the GPU type each observation was measured at (its slowest worker's); typed clusters only
    observation_types: list[str | None] = field(default_factory=list)
    finish_s: float | None = None
    gpu_s: float = 0.0
    cpu_s: float = 0.0
    cost_left: float = 0.0  # seconds of scaling cost still to pay in this slot
    pool: str | None = None  # the pool it is in (grouping)
    pool_since_s: float | None = None
    phase_s: tuple[float, float] | None = None  # moving average of measured (compute, comm)
    phase_at: tuple[int, int] | None = None  # the (ps, workers) phase_s was measured at
    busy_compute_s: float = 0.0  # node-seconds of compute its iterations kept busy
    busy_net_s: float = 0.0  # node-seconds of NIC time
    # What JobPace.count_busy derives from where the job runs, kept while it runs there (a
    # slot has a stretch per arrival and completion): (ps nodes, worker nodes) -> its
    # BusyPerStep.
    busy_per_step: tuple[tuple[tuple[int, ...], tuple[int, ...]], BusyPerStep | None] | None = None


@dataclass(frozen=True)
class BusyPerStep:
    """Per training step of a job where it runs: compute seconds, the summed share of their
    nodes' compute its workers keep busy, communication seconds, how many NICs it uses."""

    compute_s: float
    compute_shares: float
    comm_s: float
    nodes: int
