"""The step engine: what a round (rounds.py) and an admission step (admitting.py) both do, once.

A `Step` describes what differs between them: which jobs the snapshot decides and where the
others are held, the rule that decides (a round: `run_served_round` through the policy's cycle
guard; an admission step: `run_admission` with the displaced tasks' slots), whether the
policy's bookings are replaced (a round) or added to (an admission step), and which jobs the
decision is applied to. `run_step` runs the pipeline: snapshot → decide → book → plan → apply →
Events, under the round lock where capacity is read and booked. `report_jobs` writes what a
step did to the jobs' status and the policy's groups.

One fallback path (`decide`): when a learned phase (or its model) raises, the step is decided
again by the same rule with the fallback allocation (and the heuristic placement where the
placement was learned), the same grouping and no cycle guard; the ModelLoaded condition says
InferenceFailed, the waiting jobs' reasons name the fallback, and the dataset records no
decisions for it (the learned phase did not decide).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from mlsched.cluster.types import Decision
from mlsched.controller.dataset import rewards
from mlsched.controller.dataset.dataset import rfc3339
from mlsched.controller.kube.events import ObjectRef
from mlsched.controller.objects.apply import execute_all, ordered, summarize
from mlsched.controller.objects.desired import (
    Action, JobTarget, job_targets, plan_pods, plan_statefulset, roles_of,
)
from mlsched.controller.objects.records import PodPool
from mlsched.controller.objects.job_records import JobRecord
from mlsched.controller.process.loop_health import collection_paused
from mlsched.controller.process.supervision import plain
from mlsched.controller.scheduling import fair_share, pool_steps, pools, reporting, waiting
from mlsched.controller.scheduling.policy_view import held_as_decided, policy_snapshot
from mlsched.controller.scheduling.runtime import Runtime
from mlsched.controller.scheduling.indexes import Indexes, JobKey
from mlsched.controller.scheduling.step_jobs import reservation, wake_others
from mlsched.controller.serving.models import ResolvedPolicy
from mlsched.formats.serving import RoundServing, applied_epsilon, serve
from mlsched.policies import registry
from mlsched.policies.cycle_guard import CycleGuard

log = logging.getLogger("mlsched.controller.scheduling.step")

#: A step's decision rule: (allocation, placement, grouping, cycle guard or None) -> Decision,
#: on the snapshot it was made for.
Rule = Callable[[Any, Any, Any, "CycleGuard | None"], Decision]


@dataclass
class RoundReport:
    """What a round did (returned for tests and logs)."""

    interval: int
    interval_s: float  # wall-clock seconds until the next round
    targets: dict[str, JobTarget]
    actions: list[Action]
    closed: rewards.ClosedInterval | None
    duration_s: float
    allocation: str
    job_patches: dict[str, dict] = field(default_factory=dict)


@dataclass
class Step:
    """One step of a policy: what a round and an admission step do differently."""

    kind: str  # "round" or "admission"
    ref: ObjectRef
    body: Mapping[str, Any]  # the policy as the step read it (one_version)
    resolved: ResolvedPolicy
    serving: RoundServing
    setup: pools.PoolSetup | None
    now: float
    interval_s: float
    jobs: list[JobRecord]  # the policy's jobs
    schedulable: list[JobRecord]  # those the snapshot decides on
    held: Mapping[str, Mapping[str, tuple[str, ...]] | None]  # job name -> nodes it is held at
    rule: Callable[[Any], Rule]  # snapshot -> how this step decides on it
    applied: Callable[[Mapping[str, JobTarget]], list[JobRecord]]  # jobs whose targets apply
    waiting: list[JobRecord]  # whose waiting reasons are noted
    released: frozenset[str] = frozenset()  # jobs held at nothing (re-decided)
    replaces_bookings: bool = False  # a round books the policy afresh; admission adds
    cycle_guard: CycleGuard | None = None

    @property
    def key(self) -> tuple[str, str]:
        return (self.ref.namespace, self.ref.name)


@dataclass
class Outcome:
    """What `run_step` decided and applied."""

    snapshot: Any
    decision: Decision
    targets: dict[str, JobTarget]
    applied: list[JobRecord]
    failure: str | None  # why the learned phase failed (the fallback decided), or None
    actions: list[Action] = field(default_factory=list)
    decided_in: float = 0.0  # seconds from the step's start to booked
    planned_at: float = 0.0  # perf_counter when applying began
    applied_in: float = 0.0  # seconds the API calls took


def one_version(live_body: Mapping[str, Any]) -> tuple[dict[str, Any], ObjectRef]:
    """The policy as it is now, copied, and its reference: the live view is replaced while a
    step awaits, and an edit landing mid-step must not be reported as observed (its generation
    written next to the old spec's decision)."""
    body = plain(live_body)
    return body, ObjectRef.of({**body, "kind": "SchedulingPolicy"})


def begin(live_body: Mapping[str, Any], now: float | None
          ) -> tuple[float, float, dict[str, Any], ObjectRef, tuple[str, str]]:
    """A step's start: its clock (perf_counter), its time, the policy as it is now
    (`one_version`) and the policy's key."""
    started = time.perf_counter()
    now = time.time() if now is None else now
    body, ref = one_version(live_body)
    return started, now, body, ref, (ref.namespace, ref.name)


def algorithms(resolved: ResolvedPolicy) -> dict[str, str]:
    return {phase: getattr(getattr(resolved, phase), "name", type(getattr(resolved, phase)).__name__)
            for phase in ("grouping", "allocation", "placement")}


def serving_for(rt: Runtime, ref: ObjectRef, spec, resolved: ResolvedPolicy, number: int,
                kind: str, now: float, versions: dict[str, int | None]) -> RoundServing:
    """The phases this step runs: learned ones explore and record as the spec and the operator
    allow (serving.py)."""
    return serve({"grouping": resolved.grouping, "allocation": resolved.allocation,
                  "placement": resolved.placement},
                 namespace=ref.namespace, policy=ref.name, interval=number, kind=kind,
                 time=rfc3339(now),
                 epsilon=applied_epsilon(spec.exploration.epsilon, rt.process.config.max_exploration),
                 record=spec.retraining.dataset_limit > 0, versions=versions)


async def decide(rule: Rule, resolved: ResolvedPolicy, serving: RoundServing, grouping,
                 guard: CycleGuard | None = None) -> tuple[Decision, str | None]:
    """Decide with the served phases (`serving`: this step's copies of the learned ones;
    `grouping`: the grouping as the cluster runs it, pools.grouping_for; `guard`: the policy's
    cycle guard, policies/cycle_guard.py). The one fallback path: if a (learned) phase raises,
    decide again by the same rule with the fallback allocation, the heuristic placement and
    the same grouping (a failing learned phase must not take the pools' labels and affinity
    away), without the cycle guard. Returns the decision and why the learned phase failed."""
    phases = serving.phases
    try:
        return await asyncio.to_thread(rule, phases["allocation"], phases["placement"],
                                       grouping, guard), None
    except Exception as err:  # noqa: BLE001 - a policy bug must not stop scheduling
        log.exception("%s failed; deciding with %s allocation", resolved.allocation.name,
                      resolved.fallback)
        decision = await asyncio.to_thread(rule, registry.make_allocation(resolved.fallback),
                                           resolved.fallback_placement or resolved.placement,
                                           grouping, None)
        return decision, f"{type(err).__name__}: {err}"


def inference_failed(resolved: ResolvedPolicy, failure: str) -> None:
    """The ModelLoaded condition after the fallback decided (written by a round's status)."""
    resolved.model_loaded.status, resolved.model_loaded.reason = False, "InferenceFailed"
    resolved.model_loaded.message = failure
    resolved.active_models.clear()


async def note_waiting(rt: Runtime, jobs: list[JobRecord], targets: Mapping[str, JobTarget],
                       snapshot, decision: Decision, allocation: str) -> None:
    """Why each of `jobs` that the decision gave nothing still waits (waiting.py), for its
    Admitted condition; forgotten for the jobs it admitted."""
    for j in jobs:
        if targets[j.name].count("worker"):
            rt.jobs.waiting.pop(j.key, None)
    if all(targets[j.name].count("worker") for j in jobs):
        return
    share = rt.scheduling.per_policy.fair_shares.get((jobs[0].namespace, jobs[0].policy)) if jobs else None
    reasons = await asyncio.to_thread(waiting.why_waiting, snapshot, decision, allocation,
                                      fair_share.describe(share) if share else None)
    for j in jobs:
        if not targets[j.name].count("worker") and j.name in reasons:
            rt.jobs.waiting[j.key] = reasons[j.name]


def plan_job(rt: Runtime, job: JobRecord, target: JobTarget, idx: Indexes,
             pool: PodPool | None = None) -> list[Action]:
    current = {s.role: s for s in idx.statefulsets.get(job.key, ())}
    # The templates from the spec as it is now: one edited since the snapshot has its
    # refresh waiting for this step (jobs._create_children), which would otherwise be undone.
    newest = idx.job(job.namespace, job.name)
    if newest is not None and newest.uid == job.uid and newest.error is None:
        job = newest
    actions: list[Action] = []
    for role in roles_of(job):
        if role in current:  # a missing StatefulSet is recreated by the lifecycle timer
            plan = plan_statefulset(job, role, current[role], target.counts, rt.pod_settings, pool)
            if plan:
                actions.append(plan)
    actions += plan_pods(job.namespace, idx.pods.get(job.key, ()), target.nodes)
    return actions


def _book(rt: Runtime, step: Step, applied: list[JobRecord],
          targets: Mapping[str, JobTarget]) -> None:
    """Reservations and placements of the applied jobs, before the round lock goes: others'
    snapshots and quota budgets read them."""
    key = step.key
    if step.replaces_bookings:
        held_before = rt.scheduling.reservations.gpus(key)
        rt.scheduling.reservations.set(key, {j.key: reservation(j, targets[j.name]) for j in applied
                                  if targets[j.name].count("worker")})
        if rt.scheduling.reservations.gpus(key) < held_before - 1e-9:
            wake_others(rt.scheduling, key)  # what it gave back (e.g. a borrowed fair share) is free now
    else:
        rt.scheduling.reservations.add(key, {j.key: reservation(j, targets[j.name]) for j in applied})
    for job in applied:
        rt.scheduling.placements.set(job.key, targets[job.name].nodes)


async def run_step(rt: Runtime, idx: Indexes, step: Step, started: float,
                   announce: Callable[[Outcome], Any] | None = None) -> Outcome:
    """Snapshot, decide and book under the round lock (two policies deciding at once would
    each hand out the capacity the other is about to take); then, while the applied jobs'
    StatefulSet events are known to predate the patches, note why jobs wait, plan the smallest
    set of changes, apply them, and send the jobs' Events in the background. `announce` runs
    before anything is applied (an admission step's Events and dataset record); it returns
    False to apply nothing (no job was admitted)."""
    resolved = step.resolved
    applying = contextlib.ExitStack()
    async with rt.scheduling.round_lock:
        with collection_paused():  # its garbage is freed as it ends (loop_health.py)
            # Sticky to the last decision, not only to pods that exist: a job admitted seconds
            # ago has gated pods with no node yet, and must not be placed anew (and moved).
            snapshot = held_as_decided(policy_snapshot(rt, idx, step.jobs, step.schedulable,
                                                       step.now, step.interval_s, step.setup,
                                                       step.key),
                                       step.held, released=step.released)
            snapshot, grouping = pool_steps.grouped(rt, idx, snapshot, step.setup,
                                                    step.schedulable, step.body.get("status") or {},
                                                    step.serving.phases["grouping"])
            decision, failure = await decide(step.rule(snapshot), resolved, step.serving,
                                             grouping, step.cycle_guard)
            targets = pool_steps.with_pools(job_targets(decision, snapshot), decision, step.setup)
        applied = step.applied(targets)
        _book(rt, step, applied, targets)
        # Until its patches are answered, events of these StatefulSets predate them.
        applying.enter_context(rt.scheduling.placements.applying(j.key for j in applied))
    outcome = Outcome(snapshot, decision, targets, applied, failure,
                      decided_in=time.perf_counter() - started)
    with applying:
        await note_waiting(rt, step.waiting, targets, snapshot, decision,
                           resolved.fallback if failure else resolved.allocation.name)
        if failure:
            inference_failed(resolved, failure)
        if announce is not None and await announce(outcome) is False:
            return outcome
        # Pools' labels before the templates that require them.
        await pool_steps.sync_node_labels(rt, idx, step.ref, snapshot, decision, step.setup)
        by_job: dict[JobKey, list[Action]] = {
            j.key: plan_job(rt, j, targets[j.name], idx,
                            pools.pod_pool(decision.pools, j.name, step.setup)) for j in applied}
        actions = outcome.actions = ordered(a for plan in by_job.values() for a in plan)
        # Counts before the changes, for the Events: the indexes move as soon as the watch reports.
        before = {j.key: {s.role: s.replicas for s in idx.statefulsets.get(j.key, ())}
                  for j in applied}
        outcome.planned_at = time.perf_counter()
        results = await execute_all(rt.api, actions)
        outcome.applied_in = time.perf_counter() - outcome.planned_at
    failed = {id(a): r for a, r in zip(actions, results) if isinstance(r, BaseException)}
    for kind, count in summarize([a for a in actions if id(a) not in failed]).items():
        if count:
            rt.process.metrics.decisions.labels(step.ref.namespace, step.ref.name, kind).inc(count)
    if failed:
        rt.process.metrics.api_errors.labels("apply").inc(len(failed))
    rt.writers.events.in_background(asyncio.gather(*(reporting.job_events(
        rt, job, targets[job.name], [a for a in by_job[job.key] if id(a) not in failed],
        before[job.key], [(a, failed[id(a)]) for a in by_job[job.key] if id(a) in failed])
        for job in applied)))
    return outcome


async def report_jobs(rt: Runtime, step: Step, outcome: Outcome, reported: list[JobRecord],
                      closings: list, opened: Mapping[str, Any], spec) -> dict[str, dict]:
    """The jobs' groups (their Events) and status records after a step, queued (written in the
    background by rt.writers.status); `reported`: the jobs whose status is written (a round: all the
    policy's, an admission step: those it admitted). Returns the queued job patches."""
    moved = set(outcome.decision.pools.moved) if step.replaces_bookings else set()
    group_fields, group_changes = pool_steps.settle_groups(rt, reported, outcome.targets, step.now)
    await pool_steps.group_events(rt, group_changes, moved)
    return reporting.record_job_status(rt, step.ref.namespace, reported, outcome.applied,
                                       outcome.targets, closings, opened, spec.history_limit,
                                       group_fields)
