"""How fast a job trains where the simulator runs it, beyond the speed model's epochs/s: the
GPU type that sets its pace on a typed cluster (its slowest worker's), the split of its
iteration into compute and communication (workloads/phases.py) and the busy time that keeps
its nodes at, and what the cluster measures of it: Optimus-style profiling runs on arrival
and Harmony's per-slot phase measurements, each with noise.
"""

from __future__ import annotations

import math

import numpy as np

from mlsched.cluster.types import SpeedObservation
from mlsched.sim.colocation import PhasedJob, worker_compute_share
from mlsched.sim.config import SimConfig
from mlsched.sim.job_state import BusyPerStep, JobState
from mlsched.workloads import catalog, gpu_types
from mlsched.workloads.phases import phase_times
from mlsched.workloads.speed_models import SpeedModel, epochs_per_s
from mlsched.workloads.traces import TraceJob

PROFILE_CONFIGS_PS = ((1, 1), (1, 2), (2, 2), (2, 4))
PROFILE_CONFIGS_ALLREDUCE = ((0, 1), (0, 2), (0, 4))


class JobPace:
    """The pace rules of one simulated cluster (its speed model, configuration, capacity and
    GPU types, fixed for the simulator's life); the random streams are the caller's."""

    def __init__(self, speed: SpeedModel, config: SimConfig, capacity: np.ndarray,
                 types: tuple[str, ...] | None):
        self.speed = speed
        self.config = config
        self.capacity = capacity
        self.gpu_types = types

    def type_factor(self, model: str, worker_nodes: tuple[int, ...]) -> float:
        """The pace of a job whose workers run on these nodes: its slowest worker's type."""
        types = self.gpu_types
        return gpu_types.slowest(model, (types[n] for n in worker_nodes), self.config.uses_gpu(model))

    def pace_type(self, s: JobState) -> str | None:
        """The GPU type that sets the job's pace where it runs (its slowest worker's)."""
        types = self.gpu_types
        if types is None or not s.worker_nodes:
            return None
        model = s.spec.model
        return min((types[n] for n in s.worker_nodes),
                   key=lambda t: gpu_types.relative_speed(model, t))

    def profile_type(self) -> str | None:
        """Where profiling runs on a typed cluster: a node of the first type listed."""
        return self.gpu_types[0] if self.gpu_types is not None else None

    def profile(self, job: TraceJob, rng: np.random.Generator) -> list[SpeedObservation]:
        """Short profiling runs on arrival (Optimus §4): true speed, alone, with noise."""
        configs = PROFILE_CONFIGS_PS if job.arch == "ps" else PROFILE_CONFIGS_ALLREDUCE
        noise = self.config.profiling_noise
        out = []
        for ps, w in configs:
            f = epochs_per_s(self.speed, job.model, job.arch, ps, w)
            if self.gpu_types is not None:
                f *= gpu_types.relative_speed(job.model, self.profile_type(), self.config.uses_gpu(job.model))
            out.append(SpeedObservation(ps, w, f * (1 + noise * rng.uniform(-1, 1))))
        return out

    def phased(self, s: JobState) -> PhasedJob:
        """The job's iteration split into its phases where it runs (sim/colocation.py)."""
        j = s.spec
        t, c, n = phase_times(self.speed, j.model, j.arch, len(s.ps_nodes), len(s.worker_nodes),
                              len(set(s.worker_nodes)))
        return PhasedJob(t, c, n, s.worker_nodes, s.ps_nodes + s.worker_nodes,
                         self.config.demand(j.model, "worker"))

    def measure_phases(self, s: JobState, ps: int, w: int, rng: np.random.Generator) -> None:
        """Fold this slot's measured (compute, comm) per iteration into the job's moving average;
        a new (ps, workers) starts it afresh (the old one was measured at other counts)."""
        j = s.spec
        _, c, n = phase_times(self.speed, j.model, j.arch, ps, w, len(set(s.worker_nodes)) or 2)
        if not math.isfinite(c):
            return
        noise = self.config.phase_noise
        c *= 1 + noise * rng.uniform(-1, 1)
        n *= 1 + noise * rng.uniform(-1, 1)
        a = self.config.phase_ema_weight
        if s.phase_s is None or s.phase_at != (ps, w):
            s.phase_s = (c, n)
        else:
            s.phase_s = (a * c + (1 - a) * s.phase_s[0], a * n + (1 - a) * s.phase_s[1])
        s.phase_at = (ps, w)

    def count_busy(self, s: JobState, epochs: float) -> None:
        """Busy node-seconds of the iterations just trained: compute on each worker's share
        of its node, communication on the NIC of every node the job uses."""
        if epochs <= 0:
            return
        layout = (s.ps_nodes, s.worker_nodes)
        if s.busy_per_step is None or s.busy_per_step[0] != layout:
            s.busy_per_step = (layout, self.busy_per_step(s))
        busy = s.busy_per_step[1]
        if busy is None:
            return
        steps = epochs * catalog.MODELS[s.spec.model].steps_per_epoch
        s.busy_compute_s += steps * busy.compute_s * busy.compute_shares
        s.busy_net_s += steps * busy.comm_s * busy.nodes

    def busy_per_step(self, s: JobState) -> BusyPerStep | None:
        """The factors of count_busy that depend only on where the job runs (None: its
        iteration never ends there, nothing is busy)."""
        phased = self.phased(s)
        if not math.isfinite(phased.iteration_s):
            return None
        demand = phased.worker_demand
        shares = sum(worker_compute_share(demand, self.capacity[n]) for n in s.worker_nodes)
        compute_s = phased.compute_s
        if self.gpu_types is not None:  # a step computes for longer on a slower GPU
            compute_s /= self.type_factor(s.spec.model, s.worker_nodes)
        return BusyPerStep(compute_s, shares, phased.comm_s, len(set(phased.nodes)))
