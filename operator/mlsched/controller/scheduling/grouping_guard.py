"""Harmony's grouping guard and its co-location model's error in the operator (issue 51, part
4; docs/grouping.md, "Never worse than its baselines" and "In the cluster").

The guard is the simulator's (sim/grouping_guard.py, GuardedGrouping): at the first full
round after an arrival (a job the last decision did not know), harmony's grouping is compared
with `isolated` and `none` by a rollout of each in the simulator, and the one with the lowest
summed JCT governs until the next arrival; ties keep the one in force. Admission steps use the
one in force. The simulator forks itself; the operator builds a simulator from the round's
snapshot as the grouping sees it (the policy's poolable nodes):

- the cluster: the snapshot's nodes, each of the median shape (guard.replay_cluster, as the
  regret guard's replays), `spec.interval` of policy time a round, admission on arrival;
- the jobs: those of catalog models (others are left out, counted), each with the epochs it
  has done, its tasks on the nodes they hold, its pool and when it joined it; the pools in
  force with their shares; demands and speeds are the catalog's (the simulator's models);
- the future: the simulator guard's (GuardedGrouping.forecasts): once arrivals have been
  watched for an hour (policy time), 8 sampled futures of Poisson arrivals at the rate seen,
  jobs drawn from those seen; before, the last hour's arrivals replayed (for the report:
  isolated governs then whatever the rollouts say).

Rollouts are bounded (`MAX_SLOTS` rounds each; a job still running at the end counts until
then, the same horizon for every candidate) and skipped beyond `MAX_JOBS` jobs (harmony then
governs, said why). They run where the grouping does: in the round's decide thread
(step.decide, asyncio.to_thread), never on the event loop, holding the round lock.

The co-location error: per harmony pool of two or more members, each member running in the
pool it was in before the round at the counts it runs at now compares the speed the model
predicts for it (its speed alone × its iteration time alone / the group's, PoolPlan.forecasts)
with the speed it reports (progress): |predicted / observed − 1|, the simulator's
colocation_error.ColocationError, accumulated over the rounds of this process.
"""

from __future__ import annotations

import logging
import time
from dataclasses import replace

import numpy as np

from mlsched.cluster.types import PoolPlan, Snapshot
from mlsched.policies.grouping.profiles import profile_table
from mlsched.sim.colocation_error import ColocationError
from mlsched.sim.grouping_guard import GuardedGrouping
from mlsched.sim.simulator import Simulator
from mlsched.workloads import catalog
from mlsched.workloads.traces import TraceJob

log = logging.getLogger("mlsched.controller.scheduling.grouping_guard")

HISTORY_S = 3600.0  # policy seconds of arrivals replayed as the next ones
MAX_SLOTS = 400  # rounds per rollout
MAX_JOBS = 32  # more active jobs than this: no rollout, harmony governs (10 s at 64)
EVENT = "GroupingGoverned"


class ClusterGuard(GuardedGrouping):
    """GuardedGrouping whose rollouts run in a simulator built from the snapshot it decides
    on. `phases` (allocation, placement) and the inner harmony are set by each round."""

    def __init__(self, inner, interval_s: float, scale: float = 1.0):
        super().__init__(inner, self._rollout, history_s=HISTORY_S * scale)
        # scale: wall seconds per policy second (--interval-scale); rollouts run policy time
        self.interval_s, self.scale = float(interval_s), max(float(scale), 1e-9)
        self.phases: tuple | None = None
        self.estimates: dict[str, float] = {}  # candidate -> summed JCT, policy seconds
        self.since: float | None = None  # when the candidate in force took over (wall)
        self.message = "no decision yet: harmony governs until the first full round"
        self.cost_s = 0.0  # the latest decision's rollouts, wall seconds
        self.changed: tuple[str, str] | None = None  # (old, new) at the latest round, or None
        self.colocation = ColocationError()
        self._snapshot: Snapshot | None = None
        self._sim: Simulator | None = None
        self._now = 0.0

    def serve(self, inner, phases: tuple) -> None:
        """This round's harmony (its spec may have changed) and allocation and placement."""
        self.inner = self.candidates[self.name] = inner
        self.phases = phases
        self.changed = None

    def group(self, snapshot: Snapshot) -> PoolPlan:
        self._snapshot, self._now, before = snapshot, snapshot.time_s, self.choice
        try:
            return super().group(snapshot)
        finally:
            self._snapshot = self._sim = None
            if self.choice != before:
                self.changed, self.since = (before, self.choice), snapshot.time_s
            elif self.since is None:
                self.since = snapshot.time_s

    def _best(self, now_s: float) -> str:
        started = time.perf_counter()
        active = len(self._snapshot.jobs) if self._snapshot is not None else 0
        if active > MAX_JOBS:
            self.estimates = {}
            self.message = (f"{active} jobs, more than the {MAX_JOBS} the guard rolls out: "
                            f"{self.name} governs")
            return self.name
        try:
            self._sim, left_out = simulator_of(self._snapshot, self.interval_s, self.scale)
            futures = [[replace(j, model=catalog.canonical_name(j.model),
                                arrival_s=round((j.arrival_s - now_s) / self.scale, 3))
                        for j in arrivals if catalog.is_known(j.model)]
                       for arrivals in self.forecasts(now_s)]
            order = [self.choice] + [c for c in self.candidates if c != self.choice]
            scores = {name: [self.rollout(arrivals, None if name == "none" else self._policy_time(name))
                             for arrivals in futures] for name in order}
        except Exception as err:  # noqa: BLE001 - the guard must never stop a round
            log.warning("grouping guard: no rollout: %s", err)
            self.estimates = {}
            self.message = f"the rollouts failed, {self.choice} stays in force: {err}"[:1024]
            return self.choice
        finally:
            self.cost_s = time.perf_counter() - started
        best = self.pick(scores, now_s)  # the simulator's rule (sim/grouping_guard.py)
        scores = {n: sum(v) / len(v) for n, v in scores.items()}  # the mean over the futures
        self.estimates = scores
        hours = ", ".join(f"{n} {scores[n] / 3600:.3g}" for n in self.candidates)
        why = ""
        if self.arrived() and now_s - self._first_look < self.history_s:
            why = " (arrivals watched for less than the history replayed: isolated governs)"
        elif best == "isolated" and self.arrived() and min(scores, key=scores.get) != best:
            why = f" (none beats isolated by the {self.margin:.0%} margin in every future)"
        if len(futures) > 1:
            ahead = (f"mean over {len(futures)} sampled futures of "
                     f"{min(map(len, futures))}-{max(map(len, futures))} arrivals")
        else:
            ahead = f"{len(futures[0])} replayed arrival(s)"
        self.message = (f"{best} governs{why}: summed JCT of rollouts (job-hours) {hours}; "
                        f"{ahead}"
                        + (f", {left_out} job(s) of models outside the catalog left out"
                           if left_out else ""))
        return best

    def _policy_time(self, name: str):
        """The candidate as rollouts run it: harmony's minimum stay in policy seconds."""
        grouping = self.candidates[name]
        config = getattr(grouping, "config", None)
        if config is None or self.scale == 1.0:
            return grouping
        return type(grouping)(replace(config, min_pool_s=config.min_pool_s / self.scale))

    def _rollout(self, arrivals: list[TraceJob], grouping) -> float:
        fork = self._sim.fork(arrivals)
        allocation, placement = self.phases
        fork.run(allocation, placement, grouping)
        end = fork.time_s
        return float(sum((s.finish_s if s.finish_s is not None else end) - s.spec.arrival_s
                         for s in fork.states.values() if s.spec.arrival_s <= end))


def simulator_of(snapshot: Snapshot, interval_s: float, scale: float) -> tuple[Simulator, int]:
    """A simulator of the snapshot's jobs as they stand (time 0 = now), and how many jobs it
    leaves out (models outside the catalog). Raises ValueError when nothing can be run."""
    from mlsched.controller.scheduling.guard import replay_cluster

    cluster = replay_cluster(snapshot, interval_s)
    if cluster is None:
        raise ValueError("no node")
    config, names = cluster
    views = [j for j in snapshot.jobs if catalog.is_known(j.model)
             and j.epochs_done < j.total_epochs * (1 - 1e-9)]
    if not views:
        raise ValueError("no job of a catalog model to roll out")
    trace = [TraceJob(j.name, 0.0, catalog.canonical_name(j.model), float(j.total_epochs),
                      j.arch, j.requested_workers, j.requested_ps) for j in views]
    # Rounds decided once (served_round False): under a guarded grouping the operator's rounds
    # are never settled (the guard bears the inner grouping's name: round.settles), whichever
    # candidate governs, so its rollouts decide as it does.
    sim = Simulator(trace, replace(config, seed=0, grouping_guard=False, max_slots=MAX_SLOTS,
                                   served_round=False))
    sim.node_names = list(names)
    for j in views:
        s = sim.states[j.name]
        s.epochs_done = float(j.epochs_done)
        if j.worker_nodes:
            s.ps_nodes, s.worker_nodes = tuple(j.ps_nodes), tuple(j.worker_nodes)
        s.pool = j.pool
        if j.pool_since_s is not None:
            s.pool_since_s = (j.pool_since_s - snapshot.time_s) / max(scale, 1e-9)
    pools = {j.name: j.pool for j in views if j.pool is not None}
    if snapshot.node_pools is not None and pools:
        sim.plan = PoolPlan(pools, tuple(snapshot.node_pools), dict(snapshot.pool_shares or {}),
                            coordinated=True)
    return sim, len(snapshot.jobs) - len(views)


def colocation_samples(snapshot: Snapshot, plan: PoolPlan, counts: dict[str, tuple[int, int]],
                       speeds: dict[str, float], max_dop: int = 16) -> list[tuple[float, float]]:
    """(predicted, observed) speed of each member of a forecast pool of 2+ members that ran in
    it before this round at the counts it has now and reports a speed."""
    out = []
    views = {j.name: j for j in snapshot.jobs}
    for pool, f in plan.forecasts.items():
        if f.jobs < 2 or f.iteration_s <= 0:
            continue
        jobs = [views[n] for n, p in plan.job_pools.items() if p == pool and n in views
                and views[n].pool == pool and speeds.get(n, 0.0) > 0 and views[n].prior is not None
                and counts.get(n, (0, 0)) == (views[n].ps, views[n].workers) and views[n].workers > 0]
        if not jobs:
            continue
        C, N = profile_table(jobs, max_dop)
        d = int(min(max(f.nodes, 1), max_dop))
        for i, job in enumerate(jobs):
            alone = job.prior.epochs_per_s(job.ps, job.workers)
            t_alone = float(C[i, d] + N[i, d])
            if alone > 0 and np.isfinite(t_alone) and t_alone > 0:
                out.append((alone * t_alone / f.iteration_s, speeds[job.name]))
    return out


def add_error(guard: ClusterGuard, samples: list[tuple[float, float]]) -> None:
    for predicted, observed in samples:
        # ColocationError takes iteration times; speeds are their inverses
        guard.colocation.add(1.0 / predicted, 1.0 / observed)


def status_of(guard: ClusterGuard, rfc3339) -> dict:
    """The guard's fields of status.grouping."""
    # Status is merge-patched: a candidate without a finite estimate is null (removed), and no
    # estimates at all removes the field, so that no older figure is left beside new ones.
    estimates = {n: round(v, 3) if np.isfinite(v) else None for n, v in guard.estimates.items()}
    out = {"governing": guard.choice, "governingMessage": guard.message,
           "estimates": estimates or None, "colocationSamples": guard.colocation.samples}
    if guard.since is not None:
        out["governingSince"] = rfc3339(guard.since)
    if guard.colocation.samples:
        out["colocationError"] = round(guard.colocation.mare, 6)
    return out


def event(guard: ClusterGuard) -> tuple[str, str, str] | None:
    """(type, reason, message) when the candidate in force changed at the latest round."""
    if guard.changed is None:
        return None
    old, new = guard.changed
    return "Normal", EVENT, f"{new} governs (was {old}): {guard.message}"


def for_round(books: dict, key, resolved, setup, spec, interval_s: float,
              scale: float) -> ClusterGuard | None:
    """The policy's guard serving this round's harmony (`resolved.grouping` becomes it), None
    (and the book dropped) when the policy does not group with guarded harmony."""
    from mlsched.policies.grouping.harmony import Harmony

    if setup is None or not spec.pools.guard or not isinstance(resolved.grouping, Harmony):
        books.pop(key, None)
        return None
    guard = books.get(key)
    if guard is None:
        guard = books[key] = ClusterGuard(resolved.grouping, interval_s, scale)
    guard.interval_s, guard.scale = float(interval_s), max(float(scale), 1e-9)
    guard.history_s = HISTORY_S * scale
    guard.serve(resolved.grouping, (resolved.allocation, resolved.placement))
    resolved.grouping = guard
    return guard


def for_admission(books: dict, key, resolved, setup, spec) -> None:
    """Admission steps group with the candidate in force (a switch there could not move
    running jobs); they never decide."""
    from mlsched.policies.grouping.harmony import Harmony

    guard = books.get(key)
    if (guard is not None and setup is not None and spec.pools.guard
            and isinstance(resolved.grouping, Harmony) and guard.in_force is not guard.inner):
        resolved.grouping = guard.in_force  # isolated before the first decision too


async def report(guard: ClusterGuard | None, extra: dict, status: dict, ref, snapshot, decision,
                 targets, speeds: dict[str, float], metrics, recorder, rfc3339) -> None:
    """After a round: the co-location error's samples added, the guard's fields merged into
    status.grouping (in `extra`), the metric, and the Event of a change of candidate."""
    if guard is None:
        metrics.colocation_error.remove_by_labels({"namespace": ref.namespace, "policy": ref.name})
        return
    counts = {n: (t.count("ps"), t.count("worker")) for n, t in targets.items()}
    add_error(guard, colocation_samples(snapshot, decision.pools, counts, speeds))
    base = extra.get("grouping", status.get("grouping"))
    if base is not None:
        merged = {**base, **status_of(guard, rfc3339)}
        if merged != status.get("grouping"):
            extra["grouping"] = merged
        else:
            extra.pop("grouping", None)
    if guard.colocation.samples:
        metrics.colocation_error.labels(ref.namespace, ref.name).set(guard.colocation.mare)
    found = event(guard)
    if found is not None:
        await recorder.emit(ref, *found)
