"""One SchedulingPolicy's scheduling loop: every `spec.interval` seconds, one round.

A round: close the previous interval (rewards) → resolve the policy's algorithms and models →
snapshot the cluster from the indexes → grouping, allocation, placement (`run_round`) →
plan the smallest set of changes → apply them → record status, Events and metrics.

The policy body is read afresh every round, so an edited SchedulingPolicy takes effect at the
next interval without a restart. Nothing in a round may stop the loop: a failing round is logged
and the next one runs on time.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from mlsched.api import InvalidObject, SchedulingPolicy
from mlsched.cluster.types import Decision
from mlsched.controller import reporting, rewards
from mlsched.controller.apply import execute_all, ordered, summarize
from mlsched.controller.desired import (
    Action, JobTarget, job_targets, plan_pods, plan_statefulset, roles_of,
)
from mlsched.controller.events import ObjectRef
from mlsched.controller.models import ResolvedPolicy
from mlsched.controller.records import JobRecord, Resources, add
from mlsched.controller.runtime import Indexes, JobKey, Runtime
from mlsched.controller.snapshot import build_snapshot, held_elsewhere
from mlsched.policies import registry
from mlsched.policies.round import run_round

log = logging.getLogger("mlsched.controller.loop")
INVALID_RETRY_SECONDS = 60.0


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


def reservation(job: JobRecord, target: JobTarget) -> dict[str, Resources]:
    usage: dict[str, Resources] = {}
    for role, nodes in target.nodes.items():
        demand = job.demands.get(role, (0.0, 0.0, 0.0))
        for node in nodes:
            usage[node] = add(usage.get(node, (0.0, 0.0, 0.0)), demand)  # type: ignore[arg-type]
    return usage


def plan_job(rt: Runtime, job: JobRecord, target: JobTarget, idx: Indexes) -> list[Action]:
    current = {s.role: s for s in idx.statefulsets.get(job.key, ())}
    actions: list[Action] = []
    for role in roles_of(job):
        if role in current:  # a missing StatefulSet is recreated by the lifecycle timer
            plan = plan_statefulset(job, role, current[role], target.counts, rt.pod_settings)
            if plan:
                actions.append(plan)
    actions += plan_pods(job.namespace, idx.pods.get(job.key, ()), target.nodes)
    return actions


async def _decide(snapshot, resolved: ResolvedPolicy) -> tuple[Decision, str | None]:
    """Run the policies; if a (learned) allocation raises, decide again with the fallback."""
    try:
        return await asyncio.to_thread(run_round, snapshot, resolved.allocation,
                                       resolved.placement, resolved.grouping), None
    except Exception as err:  # noqa: BLE001 - a policy bug must not stop scheduling
        fallback = resolved.fallback
        log.exception("a learned phase failed; deciding with %s allocation and no grouping", fallback)
        decision = await asyncio.to_thread(run_round, snapshot, registry.make_allocation(fallback),
                                           resolved.fallback_placement or resolved.placement, None)
        return decision, f"{type(err).__name__}: {err}"


def frozen(value: Any) -> Any:
    """A plain deep copy of a (kopf live-view) object, so a round sees one version of it."""
    if isinstance(value, Mapping):
        return {k: frozen(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [frozen(v) for v in value]
    return value


async def run_policy_round(rt: Runtime, live_body: Mapping[str, Any], idx: Indexes,
                           now: float | None = None) -> RoundReport | None:
    started = time.perf_counter()
    now = time.time() if now is None else now
    # kopf updates the live view while the round awaits; an edit landing mid-round must not
    # be reported as observed (its generation written next to the old spec's decision).
    body = frozen(live_body)
    ref = ObjectRef.of({**body, "kind": "SchedulingPolicy"})
    key = (ref.namespace, ref.name)
    status = body.get("status") or {}
    try:
        policy = SchedulingPolicy.from_k8s(body)
    except InvalidObject as err:
        await reporting.report_invalid_policy(rt, body, ref, str(err))
        return None
    spec = policy.spec
    interval_s = rt.config.round_seconds(spec.interval)
    resolved = await rt.models.resolve(ref.namespace, spec)
    if resolved.load_failed:
        rt.metrics.model_load_failures.labels(ref.namespace, ref.name,
                                              resolved.model_loaded.reason).inc()

    jobs = idx.jobs_of_policy(ref.namespace, ref.name)
    previous = rt.intervals.get(key)
    closed = None
    if previous is not None:
        closed = rewards.close(previous, {j.name: rt.epochs_done(j) for j in jobs})
    schedulable = [j for j in jobs if j.schedulable]

    # Snapshot, decision and reservations under one lock: two policies deciding at once would
    # each hand out the capacity the other is about to take.
    async with rt.round_lock:
        cluster = idx.cluster()
        others = {k: v for k, v in rt.reservations.all().items()
                  if k not in {j.key for j in jobs}}
        held = held_elsewhere(cluster, {j.key for j in schedulable}, others)
        snapshot = build_snapshot(schedulable, cluster, now_s=now, interval_s=interval_s, held=held,
                                  node_selector=rt.config.node_selector,
                                  tolerated_taints=rt.config.tolerated_taints)
        decision, failure = await _decide(snapshot, resolved)
        targets = job_targets(decision, snapshot)
        rt.reservations.set(key, {j.key: reservation(j, targets[j.name]) for j in schedulable
                                  if targets[j.name].count("worker")})
    if failure:
        resolved.model_loaded.status, resolved.model_loaded.reason = False, "InferenceFailed"
        resolved.model_loaded.message = failure
        resolved.active_models.clear()

    by_job: dict[JobKey, list[Action]] = {}
    for job in schedulable:
        by_job[job.key] = plan_job(rt, job, targets[job.name], idx)
        rt.placements.set(job.key, targets[job.name].nodes)
    actions = ordered(a for plan in by_job.values() for a in plan)
    # Counts before the changes, for the Events: the indexes move as soon as the watch reports.
    before = {j.key: {s.role: s.replicas for s in idx.statefulsets.get(j.key, ())}
              for j in schedulable}
    results = await execute_all(rt.api, actions)
    failed = {id(a): r for a, r in zip(actions, results) if isinstance(r, BaseException)}
    done = [a for a in actions if id(a) not in failed]
    for kind, count in summarize(done).items():
        if count:
            rt.metrics.decisions.labels(ref.namespace, ref.name, kind).inc(count)
    if failed:
        rt.metrics.api_errors.labels("apply").inc(len(failed))
    await asyncio.gather(*(reporting.job_events(
        rt, job, targets[job.name], [a for a in by_job[job.key] if id(a) not in failed],
        before[job.key], [(a, failed[id(a)]) for a in by_job[job.key] if id(a) in failed])
        for job in schedulable))

    number = (previous.number + 1 if previous
              else rewards.next_interval_number(status.get("rewards"), (j.history for j in jobs)))
    rt.intervals[key] = rewards.OpenInterval(number=number, start=rewards.utc(now), grants={
        j.name: rewards.Grant(targets[j.name].count("ps"), targets[j.name].count("worker"),
                              targets[j.name].placement(), rt.epochs_done(j), j.epochs)
        for j in schedulable})

    job_patches = await reporting.write_job_status(rt, ref.namespace, jobs, schedulable, targets,
                                                   closed, spec.history_limit)
    duration = time.perf_counter() - started
    await reporting.write_policy_status(rt, body, ref, resolved, decision, closed, now, duration,
                               spec.history_limit)
    rt.metrics.round_duration.labels(ref.namespace, ref.name).observe(duration)
    if closed:
        rt.metrics.reward.labels(ref.namespace, ref.name).set(closed.reward["reward"])
    log.info("policy %s/%s round %d: %d jobs, %d changes, allocation %s, %.0f ms", ref.namespace,
             ref.name, number, len(schedulable), len(actions), resolved.allocation.name,
             duration * 1000)
    return RoundReport(number, interval_s, targets, actions, closed, duration,
                       resolved.allocation.name, job_patches)


async def run_policy_forever(rt: Runtime, body: Mapping[str, Any], idx: Indexes,
                             sleep: Callable[[float], Awaitable[Any]],
                             stopped: Callable[[], bool]) -> None:
    """The daemon body: `body` is kopf's live view, so each round sees the latest spec."""
    key = (body["metadata"].get("namespace"), body["metadata"]["name"])
    try:
        while not stopped():
            began = time.monotonic()
            try:
                report = await run_policy_round(rt, body, idx)
            except Exception:  # noqa: BLE001 - the loop must outlive any one round
                log.exception("SchedulingPolicy %s/%s: round failed", *key)
                report = None
            wait = report.interval_s if report else rt.config.round_seconds(INVALID_RETRY_SECONDS)
            await sleep(max(0.0, wait - (time.monotonic() - began)))
    finally:
        rt.reservations.drop_policy(key)
        rt.intervals.pop(key, None)
