"""What the simulated cluster is: its configuration (SimConfig: nodes, interval, costs, the
speed, interference and admission models) and what one task of a model asks of it there.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from mlsched.cluster.types import shared_demand
from mlsched.workloads import catalog

ADMISSION = ("interval", "arrival")


@dataclass
class SimConfig:
    nodes: int = 13
    node_cpus: float = 8
    node_gpus: float = 2
    node_mem_gib: float = 48
    interval_s: float = 1200.0
    max_ps: int = 16
    max_workers: int = 16
    scaling_cost_s: float = 30.0  # checkpoint-restart; hot scaling would be ~0.05
    # A job's first start (or a start after holding nothing): pods created, the program and
    # its libraries loaded, peers found, before the first step. None: scaling_cost_s, as the
    # shipped figures were measured. A real cluster's records give it (sim-to-real, issue 53).
    start_cost_s: float | None = None
    # False: a cost still unpaid when its slot ends is forgiven (as the shipped figures were
    # measured; with 20-minute slots it rarely matters). True: it goes on into the next slot
    # while the job keeps its tasks, as a restart does in a cluster whose interval is short.
    costs_span_slots: bool = False
    # Tasks a running job gives up are free only once its pods have stopped (checkpointed and
    # terminated): a job that starts in the same decision on a node where a running job lost
    # tasks waits this much longer. None: they are free at once, as the shipped figures were
    # measured. On the real node a stop took 13-17 s (docs/simulator.md, "Against a real node").
    handover_s: float | None = None
    speed_model: str = "measured"
    interference: bool = True
    profiling_noise: float = 0.05  # Optimus-style profiling runs, ±5 % measurement noise
    seed: int = 0
    max_slots: int = 20000
    # 'arrival' (default): jobs get tasks at slot starts and also when a job arrives or one
    # finishes, by an admission step (policies.round.run_admission), as the operator does;
    # arrivals within admission_delay_s of the first are one step. 'interval': only at slot
    # starts (the papers' rule; bench/bench_admission.py compares the two).
    admission: str = "arrival"
    admission_delay_s: float = 1.0
    event_driven: bool = False  # rounds on finishes and arrivals (sim/simulator.py), not every interval
    arrival_trigger_below: int | None = None  # event-driven: an arrival starts a round only below this many jobs
    # model -> (ps demand, worker demand), each (cpu, gpu, mem_gib): overrides the catalog's
    demands: dict[str, tuple[tuple[float, float, float], tuple[float, float, float]]] | None = None
    # Harmony's profile: each slot a job's measured (compute, communication) per iteration
    # joins a moving average with this weight (the paper gives none), measured with ±noise.
    phase_ema_weight: float = 0.5
    phase_noise: float = 0.05
    # model -> factor on its speed (speed_models.ScaledSpeed): a calibration to a real cluster
    # (`mlsched retrain`), or a benchmark's "cluster" that differs from the catalog. None: off.
    speed_factors: dict[str, float] | None = None
    # model -> factor on its sensitivity to co-tenants (interference.job_speed_factors): the
    # same kind of calibration, for interference. None: the table's sensitivities.
    sensitivity_factors: dict[str, float] | None = None
    # `harmony` grouping compared at every arrival with `isolated` and `none` by rollouts in
    # this simulator, the best one kept (sim/grouping_guard.py). False: harmony alone.
    grouping_guard: bool = True
    # `harmony` placement judged by rollouts to the end at every arrival against LIF-Line, the
    # better one served until the next arrival (sim/placement_guard.py). Off by default: it
    # costs 4-55 x the simulator time, and it keeps harmony at or below LIF-Line mostly by
    # serving LIF-Line (docs/placement.md); bench_placement's `harmony-rollout` column and
    # `mlsched simulate --placement-rollout` turn it on. Only without a grouping or regret guard.
    placement_rollout: bool = False
    # Learned rounds go through the operator's cycle guard (policies/cycle_guard.py): a job is
    # not sent back to counts it held since anything else changed. False: the policy alone.
    cycle_guard: bool = True
    # One GPU type per node (workloads/gpu_types.py; gpu_types.parse_cluster reads
    # `v100:4,p100:4,k80:4`): a job trains at its catalog speed times the relative speed of the
    # slowest type among its workers' nodes. None: untyped, every GPU the same (as before).
    gpu_types: tuple[str, ...] | None = None
    # A namespace quota on all the jobs' requests together, (cpu, gpu, mem_gib), inf where
    # unbounded (sim/quota.py; `mlsched simulate --quota cpu=32,gpu=8`): Snapshot.budget, as
    # the operator mirrors a ResourceQuota. None: no quota.
    quota: tuple[float, float, float] | None = None
    # Rounds decided as the operator serves them (round.run_served_round): heuristic rounds
    # settled, learned ones decided once through the cycle guard, so what the simulator trains
    # and scores is what the cluster serves. False (`mlsched simulate --decided-once`): every
    # round decided once, as the figures before this became the default (30 Nov 2026) were measured.
    served_round: bool = True

    def capacity(self) -> np.ndarray:
        row = np.array([self.node_cpus, self.node_gpus, self.node_mem_gib], dtype=float)
        return np.tile(row, (self.nodes, 1))

    def demand(self, model: str, role: str) -> np.ndarray:
        """(cpu, gpu, mem_gib) of one task of `model` in `role` in this simulated cluster."""
        if self.demands and model in self.demands:
            return np.asarray(self.demands[model][0 if role == "ps" else 1], dtype=float)
        return catalog.MODELS[model].demand(role)

    def uses_gpu(self, model: str) -> bool:
        """Whether a worker of `model` takes a GPU here (only then does a node's GPU type
        set its pace)."""
        return bool(self.demand(model, "worker")[1] > 0)


class TaskDemands:
    """(cpu, gpu, mem) one task of a model in a role asks for in a pool `share` jobs
    time-share, and what a job's tasks hold together. Asked for every task at every admission
    step's capacity check, and per job at every stretch: computed once per combination (a
    handful)."""

    def __init__(self, config: SimConfig):
        self.config = config
        self._task: dict[tuple[str, str, int], np.ndarray] = {}
        self._held: dict[tuple[str, int, int, int], np.ndarray] = {}

    def task(self, model: str, role: str, share: int) -> np.ndarray:
        key = (model, role, share)
        found = self._task.get(key)
        if found is None:
            found = self._task[key] = shared_demand(self.config.demand(model, role), share)
        return found

    def held(self, model: str, ps: int, workers: int, share: int) -> np.ndarray:
        """What a job of `model` with `ps` and `workers` tasks holds."""
        key = (model, ps, workers, share)
        found = self._held.get(key)
        if found is None:
            found = self._held[key] = (ps * self.task(model, "ps", share)
                                       + workers * self.task(model, "worker", share))
        return found
