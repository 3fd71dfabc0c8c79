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

Beside it: SimConfig (sim/config.py), each job's state (sim/job_state.py), its pace, phases
and measurements (sim/pace.py), ideal times (sim/ideal.py), a whole run (sim/runner.py) and
its SimResult (sim/result.py).
"""

from __future__ import annotations

import copy
import math
from collections import Counter
from dataclasses import replace
from typing import Callable

import numpy as np

from mlsched.cluster.types import Decision, JobView, PoolPlan, Snapshot, SpeedObservation
from mlsched.policies.work_conservation import IdleCapacity
from mlsched.sim import quota, runner
from mlsched.sim.colocation import colocation_factors
from mlsched.sim.colocation_error import ColocationError
from mlsched.sim.config import ADMISSION, SimConfig, TaskDemands
from mlsched.sim.gpu_restrictions import GpuRestrictions
from mlsched.sim.ideal import IdealTimes
from mlsched.sim.job_state import JobState
from mlsched.sim.pace import JobPace
from mlsched.sim.result import SimResult
from mlsched.workloads import gpu_types, interference
from mlsched.workloads.phases import phase_times
from mlsched.workloads.speed_models import ScaledSpeed, SpeedModel, epochs_per_s, get_speed_model
from mlsched.workloads.traces import TraceJob

MAX_OBSERVATIONS = 24  # per job; older ones fall off
#: Changes whenever the simulated environment changes (speed, interference, scaling models):
#: model cards record the version a policy was trained in.
#: sim-2: interference normalised by node capacity and bounded (workloads/interference.py).
SIMULATOR_VERSION = "sim-2"


_EPS_S = 1e-9  # a job due to finish at a stretch's end finishes in it, whatever the rounding
Admit = Callable[[Snapshot], Decision]


class CapacityExceeded(RuntimeError):
    pass


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
        self.demands = TaskDemands(self.config)
        self.pace = JobPace(self.speed, self.config, self.capacity, types)
        self.node_names = [f"node-{i}" for i in range(self.config.nodes)]
        self.ideal = IdealTimes(self.speed, self.config, self.capacity, self.node_names, types)
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
    def finished(self) -> int:
        """How many of the trace's jobs have finished (arrived and no longer active)."""
        return self._next_arrival - len(self.active)

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
                    s.observation_types.append(self.pace.pace_type(s))
                    del s.observation_types[:-MAX_OBSERVATIONS]
            self.pace.measure_phases(s, ps, w, self.phase_rng)
        self._retire_finished()
        self.total_reward += reward
        self.time_s = start + interval
        self.last_slot_s = interval  # the slot's length (event-driven: until its event)
        self.slot += 1
        self._admit()
        self._skip_idle()
        return reward

    def run(self, allocation, placement, grouping=None, progress=None, guard=None) -> SimResult:
        """Run to the end under these policies (sim/runner.py); `guard`: a
        sim.regret_guard.SimGuard serving its fallback while it is tripped."""
        return runner.run(self, allocation, placement, grouping, progress, guard)

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
        coloc = colocation_factors({n: self.pace.phased(self.states[n]) for n in shared}, self.capacity) if shared else {}
        rates = {}
        for s in self.active:
            if s.spec.name in placements:
                j = s.spec
                base = epochs_per_s(self.speed, j.model, j.arch, len(s.ps_nodes), len(s.worker_nodes),
                                    len(set(s.worker_nodes)))
                rates[j.name] = base * factors.get(j.name, 1.0) * coloc.get(j.name, 1.0)
                if self.gpu_types is not None:  # (untyped: the arithmetic exactly as before)
                    rates[j.name] *= self.pace.type_factor(j.model, s.worker_nodes)
        return rates

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
            self.pace.count_busy(s, trained)
            share = self.plan.share_of(s.pool) if self.plan.shares else 1
            demand = self.demands.held(j.model, ps, w, share)
            s.cpu_s += demand[0] * held
            s.gpu_s += demand[1] * held
            trained_in.setdefault(j.name, []).append((rate, usable, ps, w))
        return reward

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
            s.observations.extend(self.pace.profile(s.spec, self.rng))
            if self.gpu_types is not None:
                s.observation_types.extend([self.pace.profile_type()] * (len(s.observations)
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

    def ideal_time(self, job: TraceJob, pairs: bool = False) -> float:
        """`job` alone on the empty cluster at its best allocation: the bound no scheduler
        beats. `pairs`: its best allocation with as many PS as workers (the bound of a policy
        that grows jobs by worker-PS pairs, Chic-Pair)."""
        return self.ideal.of(job, pairs)

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
                    demands.append(self.demands.task(model, role, share))
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
