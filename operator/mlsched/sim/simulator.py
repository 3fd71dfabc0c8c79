"""A time-slotted, trace-driven simulator of a GPU cluster running PS and all-reduce jobs.

Every slot (default 1200 s, like DL²): the jobs that have arrived and not finished form a
Snapshot; the policies return a Decision (counts and nodes per task); jobs then train for the
slot at speed x interference factor, minus a scaling cost when their tasks changed, and a job
that finishes inside the slot finishes at its fractional time. JCT runs from the true arrival
time. Use it as an environment (snapshot() / advance(decision)) or call run(...).

Event-driven rounds (`SimConfig.event_driven`, Chic §2.3; off by default): a decision then
lasts until the first job finishes, or until a job arrives while fewer than
`arrival_trigger_below` jobs are active (every arrival when None), and at most `interval_s`;
a "slot" is one such period. An arrival that triggers nothing waits for the next round.
`SimConfig.demands` overrides the catalog's per-task demands per model (the Chic paper's).

Co-location (docs/grouping.md): when the pool plan in force time-shares pools
(`PoolPlan.shares`, from the isolated/naive/harmony groupings), jobs in those pools also
progress by Harmony's group model (sim/colocation.py), a job that changes pool pays the
scaling cost, and in coordinated pools the interference model leaves co-members out. With
no grouping, or `none`, nothing of this applies and results are exactly as before. Every
run also records busy compute and network time (a job's iteration split into its phases,
workloads/phases.py) for the utilisation figures Harmony reports.
"""

from __future__ import annotations

import copy
import math
from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Callable

import numpy as np

from mlsched.cluster.ledger import Ledger
from mlsched.cluster.types import Decision, JobView, PoolPlan, Snapshot, SpeedObservation, shared_demand
from mlsched.policies.placement.heuristics import LoadBalance
from mlsched.policies.cycle_guard import CycleGuard
from mlsched.policies.round import run_admission, run_round, run_served_round, settles
from mlsched.policies.model_domain import DomainTally, served_cards, shape_of
from mlsched.policies.work_conservation import IdleCapacity, idle_capacity
from mlsched.sim.colocation import PhasedJob, colocation_factors, worker_compute_share
from mlsched.sim.colocation_error import ColocationError
from mlsched.sim.grouping_guard import GuardedGrouping, simulator_rollout
from mlsched.sim.placement_guard import RolloutPlacement
from mlsched.sim import quota
from mlsched.sim.gpu_restrictions import GpuRestrictions
from mlsched.workloads import catalog, gpu_types, interference
from mlsched.workloads.phases import phase_times
from mlsched.workloads.speed_models import ScaledSpeed, SpeedModel, epochs_per_s, get_speed_model
from mlsched.workloads.traces import TraceJob

PROFILE_CONFIGS_PS = ((1, 1), (1, 2), (2, 2), (2, 4))
PROFILE_CONFIGS_ALLREDUCE = ((0, 1), (0, 2), (0, 4))
MAX_OBSERVATIONS = 24  # per job; older ones fall off
#: Changes whenever the simulated environment changes (speed, interference, scaling models):
#: model cards record the version a policy was trained in.
#: sim-2: interference normalised by node capacity and bounded (workloads/interference.py).
SIMULATOR_VERSION = "sim-2"


_EPS_S = 1e-9  # a job due to finish at a stretch's end finishes in it, whatever the rounding
Admit = Callable[[Snapshot], Decision]
ADMISSION = ("interval", "arrival")


class CapacityExceeded(RuntimeError):
    pass


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
    event_driven: bool = False  # rounds on finishes and arrivals (module doc), not every interval
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
    # settled. False: heuristic rounds decided once (as the shipped figures were measured).
    served_round: bool = False

    def capacity(self) -> np.ndarray:
        row = np.array([self.node_cpus, self.node_gpus, self.node_mem_gib], dtype=float)
        return np.tile(row, (self.nodes, 1))

    def demand(self, model: str, role: str) -> np.ndarray:
        """(cpu, gpu, mem_gib) of one task of `model` in `role` in this simulated cluster."""
        if self.demands and model in self.demands:
            return np.asarray(self.demands[model][0 if role == "ps" else 1], dtype=float)
        return catalog.MODELS[model].demand(role)


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
    # What _count_busy derives from where the job runs, kept while it runs there (a slot has
    # a stretch per arrival and completion): (ps nodes, worker nodes) -> its _BusyPerStep.
    busy_per_step: tuple[tuple[tuple[int, ...], tuple[int, ...]], _BusyPerStep | None] | None = None


@dataclass(frozen=True)
class _BusyPerStep:
    """Per training step of a job where it runs: compute seconds, the summed share of their
    nodes' compute its workers keep busy, communication seconds, how many NICs it uses."""

    compute_s: float
    compute_shares: float
    comm_s: float
    nodes: int


@dataclass
class SimResult:
    jct_s: dict[str, float]
    ideal_s: dict[str, float]
    makespan_s: float
    gpu_util: float
    cpu_util: float
    jobs: int
    completed: int
    slots: int
    inferences: int
    total_reward: float
    compute_util: float = 0.0  # busy compute (cpu/gpu) node-seconds / (nodes x makespan)
    net_util: float = 0.0  # busy NIC node-seconds / (nodes x makespan)
    # Work conservation (policies/work_conservation.py), over the rounds of `run` (admission
    # steps not counted): rounds that left idle capacity a waiting job's minimum would fit,
    # and the mean of what those jobs' minimums would have used in them.
    rounds: int = 0
    nonconserving_rounds: int = 0
    idle_gpus: float = 0.0
    idle_cpus: float = 0.0
    idle_tasks: float = 0.0
    # Model domain (policies/model_domain.py): rounds of `run` checked (those a learned model
    # served; 0 for heuristics), those outside the trained domain of a served model (its
    # card's), what was outside (first value found, per model and figure; "" when nothing),
    # and the served models whose cards record no domain.
    domain_rounds: int = 0
    rounds_outside_domain: int = 0
    outside_domain: str = ""
    no_domain: tuple[str, ...] = ()
    # Harmony grouping (sim/grouping_guard.py, sim/colocation_error.py): decisions won by each
    # candidate (harmony, isolated, none), and the co-location model's mean absolute relative
    # error of predicted vs true co-located speed over the job-slots in pools of 2+ jobs.
    grouping_choices: dict[str, int] = field(default_factory=dict)
    colocation_samples: int = 0
    colocation_mare: float = 0.0
    # A guarded learned placement (policies/placement/guarded.py): decisions won by the
    # network's layout ("learned") and by the fallback's ("fallback") in this run.
    placement_choices: dict[str, int] = field(default_factory=dict)

    def summary(self) -> dict:
        jct = np.array(list(self.jct_s.values())) if self.jct_s else np.array([np.nan])
        ideal = np.array([self.ideal_s[n] for n in self.jct_s]) if self.jct_s else np.array([np.nan])
        return {
            "avg_jct_s": float(jct.mean()),
            "p50_jct_s": float(np.percentile(jct, 50)),
            "p95_jct_s": float(np.percentile(jct, 95)),
            "makespan_s": self.makespan_s,
            "gpu_util": self.gpu_util,
            "cpu_util": self.cpu_util,
            "avg_slowdown": float((jct / ideal).mean()),
            "ideal_avg_jct_s": float(ideal.mean()),
            "jobs": self.jobs,
            "completed": self.completed,
            "compute_util": self.compute_util,
            "net_util": self.net_util,
            "rounds": self.rounds,
            "nonconserving_rounds": self.nonconserving_rounds,
            "idle_gpus": self.idle_gpus,
            "idle_cpus": self.idle_cpus,
            "idle_tasks": self.idle_tasks,
            "rounds_outside_domain": self.rounds_outside_domain,
            "outside_domain": self.outside_domain,
            "grouping_choices": dict(self.grouping_choices),
            "colocation_samples": self.colocation_samples,
            "colocation_mare": self.colocation_mare,
            "placement_choices": dict(self.placement_choices),
        }


class Simulator:
    def __init__(self, trace: list[TraceJob], config: SimConfig | None = None,
                 speed_model: SpeedModel | None = None):
        if not trace:
            raise ValueError("the trace has no jobs")
        self.config = config or SimConfig()
        if self.config.admission not in ADMISSION:
            raise ValueError(f"unknown admission {self.config.admission!r}; choose one of {', '.join(ADMISSION)}")
        self.speed = speed_model or get_speed_model(self.config.speed_model)
        if self.config.speed_factors:
            self.speed = ScaledSpeed(self.speed, self.config.speed_factors)
        self.sensitivity = interference.sensitivity_factors(self.config.sensitivity_factors)
        self.capacity = self.config.capacity()
        types = self.config.gpu_types
        if types is not None:
            if len(types) != self.config.nodes:
                raise ValueError(f"gpu_types names {len(types)} nodes' types, the cluster has "
                                 f"{self.config.nodes} nodes")
            types = tuple(gpu_types.canonical_type(t) for t in types)
        self.gpu_types = types
        self.restrictions = GpuRestrictions(trace, types)  # jobs' own GPU types (TraceJob.gpu_types)
        self._task_demands: dict[tuple[str, str, int], np.ndarray] = {}  # _task_demand's
        self._held_demands: dict[tuple[str, int, int, int], np.ndarray] = {}  # _held_demand's
        self.node_names = [f"node-{i}" for i in range(self.config.nodes)]
        self.trace = sorted(trace, key=lambda j: (j.arrival_s, j.name))
        self.ideal_s = {j.name: self.ideal_time(j) for j in self.trace}
        impossible = [n for n, t in self.ideal_s.items() if not math.isfinite(t)]
        if impossible:
            raise ValueError(f"job(s) {', '.join(impossible[:5])} cannot run on this cluster at all "
                             "(their smallest gang does not fit on the nodes)")
        self.reset()

    # ---- environment API ----------------------------------------------------------------
    def reset(self) -> None:
        self.rng = np.random.default_rng(self.config.seed)
        # Phase measurements draw from their own stream, so runs without grouping stay as
        # they were (their profiling noise comes from self.rng in the same order).
        self.phase_rng = np.random.default_rng([self.config.seed, 17])
        self.plan = PoolPlan()  # the pools in force
        # Every stretch needs every placed job's interference, and a stretch changes few jobs.
        self._pressures = interference.PressureTracker(interference.node_capacity(self.config.node_cpus))
        self.time_s = 0.0
        self.last_slot_s = 0.0
        self.slot = 0
        self.states = {j.name: JobState(j) for j in self.trace}
        self._next_arrival = 0  # index into self.trace
        self.active: list[JobState] = []
        self.inferences = 0
        self.total_reward = 0.0
        self.colocation_error = ColocationError()
        self._admit()
        self._skip_idle()

    def fork(self, arrivals: list[TraceJob] = ()) -> "Simulator":
        """A copy of this simulator as it stands, holding only the jobs active now (as they
        are: progress, tasks, pools) and `arrivals` (new names, arriving after now) instead of
        the rest of the trace, with no grouping or placement rollouts of its own: what a rollout
        runs (sim/grouping_guard.py, sim/placement_guard.py).
        Nothing of this simulator changes."""
        fork = copy.copy(self)
        fork.config = replace(self.config, grouping_guard=False, placement_rollout=False)
        fork.states = {s.spec.name: copy.deepcopy(s) for s in self.active}
        fork.active = [fork.states[s.spec.name] for s in self.active]
        later = sorted(arrivals, key=lambda j: (j.arrival_s, j.name))
        fork.trace = [s.spec for s in fork.active] + later
        fork._next_arrival = len(fork.active)
        fork.states.update({j.name: JobState(j) for j in later})
        fork.ideal_s = {**{n: self.ideal_s[n] for n in fork.states if n in self.ideal_s},
                        **{j.name: self.ideal_time(j) for j in later}}
        fork.rng, fork.phase_rng = copy.deepcopy(self.rng), copy.deepcopy(self.phase_rng)
        fork._pressures = copy.deepcopy(self._pressures)
        fork.colocation_error = ColocationError()
        fork.inferences, fork.total_reward = 0, 0.0
        return fork

    @property
    def done(self) -> bool:
        return (not self.active and self._next_arrival >= len(self.trace)) or self.slot >= self.config.max_slots

    def snapshot(self) -> Snapshot:
        cfg = self.config
        jobs = []
        for s in self.active:
            j = s.spec
            jobs.append(JobView(
                name=j.name, model=j.model, arch=j.arch, arrival_s=j.arrival_s,
                total_epochs=j.epochs, epochs_done=s.epochs_done, slots_run=s.slots_run,
                ps=len(s.ps_nodes), workers=len(s.worker_nodes), ps_nodes=s.ps_nodes,
                worker_nodes=s.worker_nodes, max_ps=cfg.max_ps, max_workers=cfg.max_workers,
                min_ps=1 if j.arch == "ps" else 0,
                requested_ps=j.ps, requested_workers=j.workers, observations=tuple(s.observations),
                ps_demand=cfg.demand(j.model, "ps"), worker_demand=cfg.demand(j.model, "worker"),
                pool=s.pool, pool_since_s=s.pool_since_s, phase_s=s.phase_s,
                observation_types=tuple(s.observation_types),
                **self.restrictions.view_fields(j),
            ))
        plan = self.plan
        node_pools = list(plan.node_pools) if plan.node_pools is not None else None
        return Snapshot(self.time_s, cfg.interval_s, self.node_names, self.capacity, jobs,
                        node_pools, dict(plan.shares) or None, gpu_types=self.gpu_types,
                        budget=quota.budget(cfg.quota))

    def advance(self, decision: Decision, admit: Admit | None = None) -> float:
        """Run one slot under `decision`; returns the slot reward Σ epochs trained / total.

        With `admit` (admission 'arrival', see `run`), the slot is cut at every arrival (after
        `admission_delay_s`, which coalesces bursts) and every completion: there `admit` is
        asked for a decision with running jobs held (policies.round.run_admission), and the
        jobs it starts train from then on. Without it, or with no event inside the slot, the
        slot is one stretch and the arithmetic is exactly the interval rule's."""
        cfg = self.config
        self._check_capacity(decision)
        self.inferences += decision.inferences
        start, interval = self.time_s, cfg.interval_s
        self.plan = decision.pools
        self._apply(decision, cost_cap=math.inf if cfg.costs_span_slots else interval, only_idle=False)
        if cfg.event_driven:  # this decision lasts until the next event (module doc)
            interval = self._event_period(self._rates())
        end = start + interval
        reward, t = 0.0, start
        trained_in: dict[str, list[tuple[float, float, int, int]]] = {}  # job -> (rate, usable s, ps, w)
        while True:
            rates = self._rates()
            if t == start:
                self._check_colocation(rates)
            cut = self._next_event(t, end, rates) if admit is not None else end
            length = interval if (t == start and cut >= end) else min(cut, end) - t
            reward += self._train(t, length, rates, trained_in)
            if cut >= end:
                break
            t = cut
            self._retire_finished()  # their nodes are free for the admission step
            self.time_s = t  # jobs arriving by now join; the admission snapshot is taken now
            self._admit()
            if any(not s.worker_nodes for s in self.active):
                step = admit(self.snapshot())
                self._check_capacity(step)
                self.inferences += step.inferences
                self.plan = step.pools  # run_admission keeps running jobs' pools (round.admissible)
                self._apply(step, cost_cap=max(cfg.scaling_cost_s, cfg.start_cost_s or 0.0), only_idle=True)
        for name, runs in trained_in.items():
            s = self.states[name]
            s.slots_run += 1
            # The rate it trained at (interference included); time-weighted if it changed.
            rate, _, ps, w = runs[-1]
            if len(runs) > 1:
                rate = sum(r * u for r, u, _, _ in runs) / max(sum(u for _, u, _, _ in runs), 1e-12)
            if rate > 0:
                s.observations.append(SpeedObservation(ps, w, rate))
                del s.observations[:-MAX_OBSERVATIONS]
                if self.gpu_types is not None:
                    s.observation_types.append(self._pace_type(s))
                    del s.observation_types[:-MAX_OBSERVATIONS]
            self._measure_phases(s, ps, w)
        self._retire_finished()
        self.total_reward += reward
        self.time_s = start + interval
        self.last_slot_s = interval  # the slot's length (event-driven: until its event)
        self.slot += 1
        self._admit()
        self._skip_idle()
        return reward

    def run(self, allocation, placement, grouping=None, progress=None, guard=None) -> SimResult:
        """`guard`: a sim.regret_guard.SimGuard serving its fallback while it is tripped."""
        rollout_placement = None  # harmony placement judged by rollouts (sim/placement_guard.py)
        if (self.config.placement_rollout and guard is None and getattr(placement, "name", None) == "harmony"
                and getattr(grouping, "name", "none") == "none"):
            placement = rollout_placement = RolloutPlacement(placement, self, allocation)
        learned = (allocation, placement)
        if guard is not None:  # the policies in force are the guard's choice, round by round
            def allocation_now():
                return guard.serving(*learned)[0]

            def placement_now():
                return guard.serving(*learned)[1]
        else:
            def allocation_now():
                return learned[0]

            def placement_now():
                return learned[1]
        if grouping is not None and self.config.grouping_guard and getattr(grouping, "name", None) == "harmony":
            grouping = GuardedGrouping(grouping, simulator_rollout(self, allocation, placement))
        # The guard decides at full rounds, where its rollouts start; admission steps use the
        # grouping it chose (a switch there could not move running jobs: round.admissible).
        admit = ((lambda snapshot: run_admission(snapshot, allocation_now(), placement_now(),
                                                 getattr(grouping, "in_force", grouping)))
                 if self.config.admission == "arrival" else None)
        idle: list[IdleCapacity] = []  # one per round: what it left idle (work conservation)
        domain = DomainTally.of(served_cards(grouping, allocation, placement))
        # The rounds the operator does not settle (a learned phase) go through the cycle
        # guard, as its served round does (round.run_served_round); heuristic rounds are
        # decided as the simulator always has (the operator settles those instead).
        self.cycle_guard = CycleGuard() if self.config.cycle_guard else None
        placed_before = Counter(getattr(placement, "choices", {}))  # a guarded placement's tally
        while not self.done:
            snapshot = self.snapshot()
            if rollout_placement is not None:
                rollout_placement.round_starts(snapshot)
            domain.add(shape_of(snapshot))
            phases = (allocation_now(), placement_now())
            if self.config.served_round:
                decision = run_served_round(snapshot, *phases, grouping, guard=self.cycle_guard)
            else:
                decision = run_round(snapshot, *phases, grouping)
                if self.cycle_guard is not None and not settles(*phases, grouping):
                    decision = self.cycle_guard.apply(snapshot, decision)
            idle.append(idle_capacity(snapshot, decision))
            before = {s.spec.name: s.epochs_done for s in self.active}
            start = self.time_s
            reward = self.advance(decision, admit)
            if guard is not None:
                guard.closed(self, start, before, decision, reward, learned)
            if progress is not None:
                progress(len(self.trace) - len(self.active) - (len(self.trace) - self._next_arrival))
        return replace(self.result(idle), domain_rounds=domain.rounds,
                       rounds_outside_domain=domain.outside_rounds,
                       outside_domain=domain.outside(), no_domain=domain.unknown,
                       grouping_choices=dict(getattr(grouping, "choices", {})),
                       placement_choices=dict(Counter(getattr(placement, "choices", {})) - placed_before))

    # ---- one slot, stretch by stretch ----------------------------------------------------
    def _apply(self, decision: Decision, cost_cap: float, only_idle: bool) -> None:
        """Put the decided tasks in place; a job whose tasks changed pays the scaling cost.
        `only_idle`: an admission step, which may only start jobs holding nothing."""
        freed = set()  # nodes where a running job lost tasks (SimConfig.handover_s)
        if self.config.handover_s and not only_idle:
            for s in self.active:
                d = decision.jobs.get(s.spec.name)
                now = Counter(tuple(d.ps_nodes) + tuple(d.worker_nodes)) if d else Counter()
                freed |= {n for n, k in Counter(s.ps_nodes + s.worker_nodes).items() if now[n] < k}
        for s in self.active:
            if only_idle and s.worker_nodes:
                continue
            d = decision.jobs.get(s.spec.name)
            new_ps = tuple(d.ps_nodes) if d else ()
            new_w = tuple(d.worker_nodes) if d else ()
            changed = (new_ps, new_w) != (s.ps_nodes, s.worker_nodes)
            starting = not (s.ps_nodes or s.worker_nodes)
            pool = decision.pools.job_pools.get(s.spec.name)
            if pool != s.pool:
                # Moving to another group is a checkpoint-restart (Harmony §IV-B4), whether
                # or not the node indices happen to match.
                changed = changed or bool(new_w and s.worker_nodes)
                s.pool, s.pool_since_s = pool, self.time_s
            s.ps_nodes, s.worker_nodes = new_ps, new_w
            cost = self.config.scaling_cost_s
            if starting and self.config.start_cost_s is not None:
                cost = self.config.start_cost_s
            if starting and freed.intersection(new_ps + new_w):
                cost += self.config.handover_s
            if changed:
                s.cost_left = min(cost, cost_cap)
            elif not (self.config.costs_span_slots and new_w):
                s.cost_left = 0.0

    def _rates(self) -> dict[str, float]:
        """Epochs/s of every placed, unfinished job, interference included."""
        placements = {s.spec.name: (s.spec.model, s.ps_nodes + s.worker_nodes)
                      for s in self.active if s.worker_nodes and s.finish_s is None}
        shared = self._timeshared(placements)
        groups = shared if self.plan.coordinated else None
        factors = (interference.speed_factors(placements, self._pressures.pressures(placements, groups),
                                              self.sensitivity)
                   if self.config.interference else {})
        coloc = colocation_factors({n: self._phased(self.states[n]) for n in shared}, self.capacity) if shared else {}
        rates = {}
        for s in self.active:
            if s.spec.name in placements:
                j = s.spec
                base = epochs_per_s(self.speed, j.model, j.arch, len(s.ps_nodes), len(s.worker_nodes),
                                    len(set(s.worker_nodes)))
                rates[j.name] = base * factors.get(j.name, 1.0) * coloc.get(j.name, 1.0)
                if self.gpu_types is not None:  # (untyped: the arithmetic exactly as before)
                    rates[j.name] *= self._type_factor(j.model, s.worker_nodes)
        return rates

    def _uses_gpu(self, model: str) -> bool:
        return bool(self.config.demand(model, "worker")[1] > 0)

    def _type_factor(self, model: str, worker_nodes: tuple[int, ...]) -> float:
        """The pace of a job whose workers run on these nodes: its slowest worker's type."""
        types = self.gpu_types
        return gpu_types.slowest(model, (types[n] for n in worker_nodes), self._uses_gpu(model))

    def _pace_type(self, s: JobState) -> str | None:
        """The GPU type that sets the job's pace where it runs (its slowest worker's)."""
        types = self.gpu_types
        if types is None or not s.worker_nodes:
            return None
        model = s.spec.model
        return min((types[n] for n in s.worker_nodes),
                   key=lambda t: gpu_types.relative_speed(model, t))

    def _profile_type(self) -> str | None:
        """Where profiling runs on a typed cluster: a node of the first type listed."""
        return self.gpu_types[0] if self.gpu_types is not None else None

    def _check_colocation(self, rates: dict[str, float]) -> None:
        """Each slot: every job in a forecast pool of 2+ members, harmony's predicted iteration
        time against the one it runs at (sim/colocation_error.py)."""
        forecasts = self.plan.forecasts
        if not forecasts:
            return
        for s in self.active:
            f = forecasts.get(s.pool) if s.pool is not None else None
            rate = rates.get(s.spec.name, 0.0)
            if f is None or f.jobs < 2 or rate <= 0:
                continue
            j = s.spec
            ps, w, spanned = len(s.ps_nodes), len(s.worker_nodes), len(set(s.worker_nodes))
            alone = epochs_per_s(self.speed, j.model, j.arch, ps, w, spanned)
            t_alone = phase_times(self.speed, j.model, j.arch, ps, w, spanned)[0]
            self.colocation_error.add(f.iteration_s, t_alone * alone / rate)

    def _timeshared(self, placements: dict) -> dict[str, str]:
        """job -> pool for the placed jobs in time-shared pools of the plan in force."""
        shares = self.plan.shares
        if not shares:
            return {}
        return {s.spec.name: s.pool for s in self.active
                if s.spec.name in placements and s.pool in shares}

    def _phased(self, s: JobState) -> PhasedJob:
        j = s.spec
        t, c, n = phase_times(self.speed, j.model, j.arch, len(s.ps_nodes), len(s.worker_nodes),
                              len(set(s.worker_nodes)))
        return PhasedJob(t, c, n, s.worker_nodes, s.ps_nodes + s.worker_nodes,
                         self.config.demand(j.model, "worker"))

    def _measure_phases(self, s: JobState, ps: int, w: int) -> None:
        """Fold this slot's measured (compute, comm) per iteration into the job's moving average;
        a new (ps, workers) starts it afresh (the old one was measured at other counts)."""
        j = s.spec
        _, c, n = phase_times(self.speed, j.model, j.arch, ps, w, len(set(s.worker_nodes)) or 2)
        if not math.isfinite(c):
            return
        noise = self.config.phase_noise
        c *= 1 + noise * self.phase_rng.uniform(-1, 1)
        n *= 1 + noise * self.phase_rng.uniform(-1, 1)
        a = self.config.phase_ema_weight
        if s.phase_s is None or s.phase_at != (ps, w):
            s.phase_s = (c, n)
        else:
            s.phase_s = (a * c + (1 - a) * s.phase_s[0], a * n + (1 - a) * s.phase_s[1])
        s.phase_at = (ps, w)

    def _next_event(self, t: float, end: float, rates: dict[str, float]) -> float:
        """The next arrival (plus the debounce) or completion after t; `end` if none comes first."""
        cut = end
        if self._next_arrival < len(self.trace):
            cut = min(cut, max(self.trace[self._next_arrival].arrival_s, t) + self.config.admission_delay_s)
        for s in self.active:
            rate = rates.get(s.spec.name, 0.0)
            if rate > 0:
                cut = min(cut, t + s.cost_left + (s.spec.epochs - s.epochs_done) / rate)
        return cut

    def _train(self, t: float, length: float, rates: dict[str, float],
               trained_in: dict[str, list[tuple[float, float, int, int]]]) -> float:
        """Every placed job trains for `length` seconds from `t`; returns Σ epochs / total."""
        reward = 0.0
        for s in self.active:
            j = s.spec
            if j.name not in rates:
                continue
            rate = rates[j.name]
            ps, w = len(s.ps_nodes), len(s.worker_nodes)
            cost = min(s.cost_left, length)
            s.cost_left -= cost
            usable = length - cost
            remaining = j.epochs - s.epochs_done
            held = length
            # (the tolerance: a stretch may end exactly at a job's finish, computed the other way)
            if rate > 0 and remaining / rate <= usable * (1 + 1e-12) + _EPS_S:
                trained = remaining
                held = cost + remaining / rate
                s.finish_s = t + held
            else:
                trained = rate * usable
            s.epochs_done += trained
            reward += trained / j.epochs
            self._count_busy(s, trained)
            share = self.plan.share_of(s.pool) if self.plan.shares else 1
            demand = self._held_demand(j.model, ps, w, share)
            s.cpu_s += demand[0] * held
            s.gpu_s += demand[1] * held
            trained_in.setdefault(j.name, []).append((rate, usable, ps, w))
        return reward

    def _task_demand(self, model: str, role: str, share: int) -> np.ndarray:
        """(cpu, gpu, mem) one task of `model` in `role` asks for in a pool `share` jobs
        time-share. Asked for every task at every admission step's capacity check, and per
        job at every stretch: computed once per combination (a handful)."""
        key = (model, role, share)
        found = self._task_demands.get(key)
        if found is None:
            found = self._task_demands[key] = shared_demand(self.config.demand(model, role), share)
        return found

    def _held_demand(self, model: str, ps: int, workers: int, share: int) -> np.ndarray:
        """What a job of `model` with `ps` and `workers` tasks holds (as _task_demand)."""
        key = (model, ps, workers, share)
        found = self._held_demands.get(key)
        if found is None:
            found = self._held_demands[key] = (ps * self._task_demand(model, "ps", share)
                                               + workers * self._task_demand(model, "worker", share))
        return found

    def _count_busy(self, s: JobState, epochs: float) -> None:
        """Busy node-seconds of the iterations just trained: compute on each worker's share
        of its node, communication on the NIC of every node the job uses."""
        if epochs <= 0:
            return
        layout = (s.ps_nodes, s.worker_nodes)
        if s.busy_per_step is None or s.busy_per_step[0] != layout:
            s.busy_per_step = (layout, self._busy_per_step(s))
        busy = s.busy_per_step[1]
        if busy is None:
            return
        steps = epochs * catalog.MODELS[s.spec.model].steps_per_epoch
        s.busy_compute_s += steps * busy.compute_s * busy.compute_shares
        s.busy_net_s += steps * busy.comm_s * busy.nodes

    def _busy_per_step(self, s: JobState) -> _BusyPerStep | None:
        """The factors of _count_busy that depend only on where the job runs (None: its
        iteration never ends there, nothing is busy)."""
        phased = self._phased(s)
        if not math.isfinite(phased.iteration_s):
            return None
        demand = phased.worker_demand
        shares = sum(worker_compute_share(demand, self.capacity[n]) for n in s.worker_nodes)
        compute_s = phased.compute_s
        if self.gpu_types is not None:  # a step computes for longer on a slower GPU
            compute_s /= self._type_factor(s.spec.model, s.worker_nodes)
        return _BusyPerStep(compute_s, shares, phased.comm_s, len(set(phased.nodes)))

    def _retire_finished(self) -> None:
        for s in [s for s in self.active if s.finish_s is not None]:
            self.active.remove(s)
            s.ps_nodes = s.worker_nodes = ()

    def result(self, idle: list[IdleCapacity] = ()) -> SimResult:
        """The run's figures; `idle`: each round's work-conservation check, when it was made."""
        done = [s for s in self.states.values() if s.finish_s is not None]
        jct = {s.spec.name: s.finish_s - s.spec.arrival_s for s in done}
        first = self.trace[0].arrival_s
        end = max((s.finish_s for s in done), default=self.time_s)
        makespan = max(end - first, 1e-9)
        total = self.capacity.sum(axis=0)
        gpu_s = sum(s.gpu_s for s in self.states.values())
        cpu_s = sum(s.cpu_s for s in self.states.values())
        node_s = len(self.node_names) * makespan
        wasted = [i for i in idle if not i.conserving]
        return SimResult(
            jct_s=jct, ideal_s=self.ideal_s, makespan_s=makespan,
            gpu_util=gpu_s / (total[1] * makespan) if total[1] > 0 else 0.0,
            cpu_util=cpu_s / (total[0] * makespan) if total[0] > 0 else 0.0,
            jobs=len(self.trace), completed=len(done), slots=self.slot,
            inferences=self.inferences, total_reward=self.total_reward,
            compute_util=sum(s.busy_compute_s for s in self.states.values()) / node_s,
            net_util=sum(s.busy_net_s for s in self.states.values()) / node_s,
            rounds=len(idle), nonconserving_rounds=len(wasted),
            idle_gpus=_mean(i.gpus for i in wasted), idle_cpus=_mean(i.cpus for i in wasted),
            idle_tasks=_mean(i.tasks for i in wasted),
            colocation_samples=self.colocation_error.samples,
            colocation_mare=self.colocation_error.mare,
        )

    # ---- internals ----------------------------------------------------------------------
    def _admit(self) -> None:
        while self._next_arrival < len(self.trace) and self.trace[self._next_arrival].arrival_s <= self.time_s:
            s = self.states[self.trace[self._next_arrival].name]
            s.observations.extend(self._profile(s.spec))
            if self.gpu_types is not None:
                s.observation_types.extend([self._profile_type()] * (len(s.observations)
                                                                     - len(s.observation_types)))
            self.active.append(s)
            self._next_arrival += 1

    def _event_period(self, rates: dict[str, float]) -> float:
        """How long an event-driven decision lasts: until the first job finishes, or the next
        arrival if it triggers a round, and at most interval_s."""
        period = self.config.interval_s
        for s in self.active:
            rate = rates.get(s.spec.name, 0.0)
            if rate > 0:
                period = min(period, s.cost_left + (s.spec.epochs - s.epochs_done) / rate)
        trigger = self.config.arrival_trigger_below
        if self._next_arrival < len(self.trace) and (trigger is None or len(self.active) < trigger):
            # Arrivals only add jobs, so if the next one does not trigger, none before a finish does.
            period = min(period, self.trace[self._next_arrival].arrival_s - self.time_s)
        return max(period, 0.0)

    def _skip_idle(self) -> None:
        """Jump over empty slots: to the slot boundary where the next job is first seen; with
        admission on arrival to the start of the slot it arrives in; event-driven, to the
        arrival itself."""
        if self.active or self._next_arrival >= len(self.trace):
            return
        nxt = self.trace[self._next_arrival].arrival_s
        if self.config.event_driven:
            self.slot += 1
            self.time_s = max(self.time_s, nxt)
            self._admit()
            return
        if self.config.admission == "arrival":
            slots = math.floor((nxt - self.time_s) / self.config.interval_s)
            if slots <= 0:
                return
        else:
            slots = max(1, math.ceil((nxt - self.time_s) / self.config.interval_s))
        self.time_s += slots * self.config.interval_s
        self.slot += slots
        self._admit()

    def _profile(self, job: TraceJob) -> list[SpeedObservation]:
        """Short profiling runs on arrival (Optimus §4): true speed, alone, with noise."""
        configs = PROFILE_CONFIGS_PS if job.arch == "ps" else PROFILE_CONFIGS_ALLREDUCE
        noise = self.config.profiling_noise
        out = []
        for ps, w in configs:
            f = epochs_per_s(self.speed, job.model, job.arch, ps, w)
            if self.gpu_types is not None:
                f *= gpu_types.relative_speed(job.model, self._profile_type(), self._uses_gpu(job.model))
            out.append(SpeedObservation(ps, w, f * (1 + noise * self.rng.uniform(-1, 1))))
        return out

    def ideal_time(self, job: TraceJob, pairs: bool = False) -> float:
        """`job` alone on the empty cluster at its best allocation: the bound no scheduler
        beats. `pairs`: its best allocation with as many PS as workers (the bound of a policy
        that grows jobs by worker-PS pairs, Chic-Pair)."""
        best = self._best_rate(job.model, job.arch, pairs)
        if self.gpu_types is not None:  # on the fastest type the cluster has for it
            best *= max(gpu_types.relative_speed(job.model, t, self._uses_gpu(job.model))
                        for t in set(self.gpu_types))
        return job.epochs / best if best > 0 else float("inf")

    def _best_rate(self, model: str, arch: str, pairs: bool = False) -> float:
        cache = self.__dict__.setdefault("_best_rate_cache", {})
        key = (model, arch, pairs)
        if key not in cache:
            cache[key] = self._search_best_rate(model, arch, pairs)
        return cache[key]

    def _search_best_rate(self, model: str, arch: str, pairs: bool = False) -> float:
        """Try configurations from the fastest down; the first that fits the empty cluster wins
        (an all-reduce ring inside one node can beat its inter-node estimate, so we also look
        at the next few)."""
        cfg = self.config
        snap = Snapshot(0.0, cfg.interval_s, self.node_names, self.capacity, [])
        ps_range = range(1, cfg.max_ps + 1) if arch == "ps" else [0]
        configs = sorted(((epochs_per_s(self.speed, model, arch, ps, w), ps, w)
                          for ps in ps_range for w in range(1, cfg.max_workers + 1)
                          if not (pairs and arch == "ps" and ps != w)), reverse=True)
        best, feasible_seen = 0.0, 0
        for _, ps, w in configs:
            job = JobView("ideal", model, arch, 0.0, 1.0, min_ps=ps, min_workers=w,
                          max_ps=max(ps, 1), max_workers=w,
                          ps_demand=cfg.demand(model, "ps"), worker_demand=cfg.demand(model, "worker"))
            ledger = Ledger(snap, LoadBalance())
            if not ledger.grow(job, "worker"):
                continue
            nodes = ledger.jobs["ideal"].worker_nodes
            best = max(best, epochs_per_s(self.speed, model, arch, ps, w, len(set(nodes))))
            feasible_seen += 1
            if arch == "ps" or feasible_seen >= 8:
                break
        return best

    def _check_capacity(self, decision: Decision) -> None:
        names = {s.spec.name: s.spec for s in self.active}
        nodes: list[int] = []  # every task's node: an admission step's decision lists every
        demands: list[np.ndarray] = []  # running task (1,400 at 500 nodes); per (job, role) ...
        counts: list[int] = []  # ... its demand and how many tasks
        for name, d in decision.jobs.items():
            if name not in names:
                raise ValueError(f"decision names job {name!r}, which is not active")
            model = names[name].model
            self.restrictions.check(names[name], d.worker_nodes)
            share = decision.pools.share_of(decision.pools.job_pools.get(name))
            for role, placed in (("ps", d.ps_nodes), ("worker", d.worker_nodes)):
                if placed:
                    nodes.extend(placed)
                    demands.append(self._task_demand(model, role, share))
                    counts.append(len(placed))
        used = np.zeros_like(self.capacity)
        if nodes:
            per_task = np.repeat(np.array(demands, dtype=float), counts, axis=0)
            np.add.at(used, np.array(nodes, dtype=np.intp), per_task)
        over = np.argwhere(used > self.capacity + 1e-9)
        if over.size:
            n, r = over[0]
            raise CapacityExceeded(f"node {self.node_names[n]} over capacity in resource {r}: "
                                   f"{used[n, r]} > {self.capacity[n, r]}")
        if self.config.quota is not None:  # charged at full requests (sim/quota.py)
            requested = sum((self.config.demand(names[name].model, role) * len(placed)
                             for name, d in decision.jobs.items()
                             for role, placed in (("ps", d.ps_nodes), ("worker", d.worker_nodes))),
                            np.zeros(3))
            quota.check(self.config.quota, requested)


def _mean(values) -> float:
    values = list(values)
    return float(sum(values) / len(values)) if values else 0.0
