"""A round: every `spec.interval` seconds, the policy's jobs decided afresh.

Close the previous interval (rewards) → resolve the policy's algorithms and models (published
versions adopted; the regret guard may serve the fallback) → the step (step.py: snapshot,
decide with `run_served_round`, for heuristic phases to its fixed point, book, plan, apply) →
open the next interval → the retraining dataset's records → the jobs' and the policy's status,
Events and metrics. Status records are queued in the runtime's StatusWriter and written in
the background: deciding and scaling never wait for them."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from typing import Any

from mlsched.api import InvalidObject, SchedulingPolicy
from mlsched.controller.dataset import rewards
from mlsched.controller.dataset.dataset import Opening, job_intervals, rfc3339
from mlsched.controller.kube.events import ObjectRef
from mlsched.controller.objects.apply import summarize
from mlsched.controller.objects.job_records import JobRecord
from mlsched.controller.scheduling import domain, guard, pool_steps, pools, reporting
from mlsched.controller.scheduling import grouping_guard as grouping_guards
from mlsched.controller.scheduling.runtime import Runtime
from mlsched.controller.scheduling.indexes import Indexes
from mlsched.controller.scheduling.step import (
    RoundReport, Step, algorithms, begin, report_jobs, run_step, serving_for,
)
from mlsched.controller.scheduling.step_jobs import children_ready, job_counts
from mlsched.controller.serving import version_adoption
from mlsched.formats.serving import applied_epsilon
from mlsched.policies.cycle_guard import CycleGuard
from mlsched.policies.decision_log import IntervalRecord
from mlsched.policies.model_domain import shape_of
from mlsched.policies.round import run_served_round
from mlsched.policies.work_conservation import idle_capacity

log = logging.getLogger("mlsched.controller.scheduling.rounds")


async def run_policy_round(rt: Runtime, live_body: Mapping[str, Any], idx: Indexes,
                           now: float | None = None) -> RoundReport | None:
    started, now, body, ref, key = begin(live_body, now)
    status = body.get("status") or {}
    try:
        policy = SchedulingPolicy.from_k8s(body)
    except InvalidObject as err:
        await reporting.report_invalid_policy(rt, body, ref, str(err))
        return None
    spec = policy.spec
    interval_s = rt.process.config.round_seconds(spec.interval)
    versions = await published_versions(rt, ref, spec)
    rt.scheduling.per_policy.adopted[key] = version_adoption.adopted(spec, versions)
    resolved = await rt.models.resolve(key, spec, rt.scheduling.per_policy.adopted[key])
    setup = pools.configure(resolved, spec, ref.namespace, ref.name, rt.process.config.label_nodes,
                            rt.process.config.interval_scale)
    if resolved.load_failed:
        rt.process.metrics.model_load_failures.labels(ref.namespace, ref.name,
                                                      resolved.model_loaded.reason).inc()
    rt.process.metrics.fallback.labels(ref.namespace, ref.name).set(
        1.0 if resolved.ready.reason == "FallbackActive" else 0.0)

    jobs = idx.jobs_of_policy(ref.namespace, ref.name)
    # One reading of progress closes the old interval and opens the new one: a report landing
    # in between must count in one of them, not in neither.
    epochs_now = {j.name: rt.jobs.epochs_done(j) for j in jobs}
    previous = rt.scheduling.per_policy.intervals.get(key)
    if previous is not None:
        to_close, continuing = [previous], None
    else:
        # The first round of this process: the intervals a previous run left open
        # (status.openInterval) are not lost. The newest goes on to the next round, which
        # closes it with all the progress made in it: what the jobs trained while no operator
        # ran is reported only after this restart. Older ones (jobs whose latest record the
        # previous run did not get written) are closed now.
        restored = rewards.restore(jobs)
        to_close, continuing = restored[:-1], (restored[-1] if restored else None)
    measured = {j.name: rt.jobs.measured(j) for j in jobs} if to_close else {}
    closings = [rewards.close(interval, epochs_now, measured) for interval in to_close]
    closed = closings[-1] if closings else None
    # The number of the interval this round opens (exploration is seeded by it). On the first
    # round of a process it also follows the dataset's records (a recreated policy's numbers
    # must not overwrite the records kept of the earlier one).
    if continuing is not None:
        number = continuing.number
    elif previous is not None:
        number = previous.number + 1
    else:
        number = max([rewards.next_interval_number(status.get("rewards"), (j.history for j in jobs)),
                      *(i.number + 1 for i in to_close)])
        if spec.retraining.dataset_limit > 0:
            number = max(number, await rt.writers.dataset.first_free(key))
    versions_served = version_adoption.report(spec, versions, resolved.served_refs,
                                              resolved.active_models).served
    rt.scheduling.per_policy.served_versions[key] = versions_served
    # The regret guard (controller/scheduling/guard.py) judges the intervals just closed before the round
    # decides: while tripped, the fallback serves this round.
    book = await guard_round(rt, ref, body, spec, resolved, jobs, to_close, closings, now)
    # Harmony's grouping guard (grouping_guard.py): harmony, isolated or none, by rollouts.
    grouping_guard = grouping_guards.for_round(rt.scheduling.per_policy.grouping_guards, key, resolved,
                                               setup, spec, float(spec.interval),
                                               rt.process.config.interval_scale)
    serving = serving_for(rt, ref, spec, resolved, number, "round", now, versions_served)
    # A job whose StatefulSets do not all exist yet is left to the admission step that their
    # creation triggers: deciding it now would reserve capacity and record a placement for
    # replicas nothing can scale, until the next round. One whose pods the API server would
    # refuse (preflight.py), or whose Service could not be created (services.py), gets nothing.
    schedulable = [j for j in jobs if j.schedulable and children_ready(rt.scheduling, j, idx)
                   and not rt.jobs.preflight.holds(j)]

    step = Step(
        "round", ref, body, resolved, serving, setup, now, interval_s, jobs, schedulable,
        held={j.name: rt.scheduling.placements.of(j.key) for j in schedulable},
        # A heuristic round is decided to its fixed point (policies/round.py), so that the
        # rounds after it, finding nothing new, restart nobody; a learned one goes through
        # the policy's cycle guard.
        rule=lambda snapshot: (lambda allocation, placement, grouping, cycles: run_served_round(
            snapshot, allocation, placement, grouping, cycles)),
        applied=lambda targets: schedulable, waiting=schedulable, replaces_bookings=True,
        cycle_guard=rt.scheduling.per_policy.cycle_guards.setdefault(key, CycleGuard()))
    outcome = await run_step(rt, idx, step, started)
    snapshot, decision, targets, failure = (outcome.snapshot, outcome.decision, outcome.targets,
                                            outcome.failure)

    grants = {j.name: rewards.Grant(targets[j.name].count("ps"), targets[j.name].count("worker"),
                                    targets[j.name].placement(), epochs_now[j.name], j.epochs)
              for j in schedulable}
    if continuing is not None:  # a job it did not cover counts from now, as when admitted
        opening = continuing
        for name, grant in grants.items():
            opening.grants.setdefault(name, grant)
    else:
        opening = rewards.OpenInterval(number=number, start=rewards.utc(now), grants=grants,
                                       started_s=now)
    rt.scheduling.per_policy.intervals[key] = opening

    # The dataset (dataset.py): the intervals closed, complete; the one opened, with the
    # decisions just made (a fallback's decision has none: the learned phase did not decide).
    facts = Opening(body["metadata"].get("uid", ""), algorithms(resolved),
                    len(snapshot.node_names))
    limit = spec.retraining.dataset_limit
    by_name = {j.name: j for j in jobs}
    for interval, closing in zip(to_close, closings):
        rt.writers.dataset.closed(key, interval, closing, by_name, facts, now, limit)
    if decision.kept:  # in the allocation's decision log, and the operator's
        serving.keep(decision.kept)
        log.info("SchedulingPolicy %s/%s: cycle guard kept %d job(s) at their counts "
                 "(kept <- decided): %s", *key, len(decision.kept),
                 ", ".join(f"{n} {k} <- {d}" for n, (k, d) in sorted(decision.kept.items())[:10]))
    rt.writers.dataset.opened(key, number, opening.start, facts, [] if failure else serving.decisions(),
                              limit, continued=continuing is not None)

    # Queued, not awaited: the records are written in the background (rt.writers.status).
    job_patches = await report_jobs(
        rt, step, outcome, jobs, closings,
        {j.name: (rewards.open_status(number, opening.start, opening.grants[j.name])
                  if j.name in opening.grants else None) for j in jobs}, spec)
    duration = time.perf_counter() - started
    extra = await reporting.policy_versions_and_exploration(
        rt, body, ref, version_adoption.report(spec, versions, resolved.served_refs,
                                               resolved.active_models),
        spec.exploration.epsilon, applied_epsilon(spec.exploration.epsilon,
                                                  rt.process.config.max_exploration))
    extra.update(await pool_steps.policy_groups(rt, body, ref, snapshot, decision, setup, spec,
                                                targets, now))
    await grouping_guards.report(grouping_guard, extra, status, ref, snapshot, decision, targets,
                                 {j.name: rt.jobs.progress.get(j.key, (0, 0, j.speed))[2] or j.speed
                                  for j in jobs}, rt.process.metrics, rt.writers.events, rfc3339)
    extra.update(job_counts(rt.scheduling, key, jobs, status))
    # Every allocation, learned or not, checked for leaving idle what a waiting job's minimum
    # would fit (policies/work_conservation.py; reported by conservation.py's rules).
    idle = await asyncio.to_thread(idle_capacity, snapshot, decision)
    fields, ready = await reporting.work_conservation(rt, ref, status, idle, resolved.ready)
    extra.update(fields)
    # The served learned models' trained domains against this round (controller/scheduling/domain.py).
    in_domain = domain.verdict(domain.served_cards(resolved.grouping, resolved.allocation,
                                                   resolved.placement), shape_of(snapshot))
    await reporting.model_domain(rt, ref, status, in_domain)
    guard_verdict = None
    if book is not None:
        book.cluster = guard.replay_cluster(snapshot, float(spec.interval))
        guard_verdict = guard.verdict(book)
        extra["guard"] = guard.status_of(book)
    elif status.get("guard") is not None:
        extra["guard"] = None  # the guard was removed from the spec
    await reporting.record_policy_status(rt, body, ref, resolved, decision, closings, now,
                                         duration, spec.history_limit, extra, ready, in_domain,
                                         guard_verdict)
    rt.process.metrics.round_duration.labels(ref.namespace, ref.name).observe(duration)
    if closed:
        rt.process.metrics.reward.labels(ref.namespace, ref.name).set(closed.reward["reward"])
    actions = outcome.actions
    kinds = summarize(actions)
    log.info("policy %s/%s round %d: %d jobs, %d changes, allocation %s, %.0f ms (decided in "
             "%.0f ms, planned in %.0f ms, %.0f ms to apply %d scale, %d place, %d evict)",
             ref.namespace, ref.name, number, len(schedulable), len(actions),
             resolved.allocation.name, duration * 1000, outcome.decided_in * 1000,
             (outcome.planned_at - started - outcome.decided_in) * 1000,
             outcome.applied_in * 1000, kinds["scale"], kinds["place"], kinds["evict"])
    return RoundReport(number, interval_s, targets, actions, closed, duration,
                       resolved.allocation.name, job_patches)


async def guard_round(rt: Runtime, ref: ObjectRef, body: Mapping[str, Any], spec, resolved,
                      jobs: list[JobRecord], to_close, closings, now: float):
    """The regret guard's part of a round (controller/scheduling/guard.py): the intervals it closed
    added, a full window judged (in a thread: two replays), the Event and metrics of a change,
    and, while tripped, `resolved` serving the fallback. Returns the policy's book, None
    without a guard (or with no learned phase to guard). Never raises."""
    key = (ref.namespace, ref.name)
    if spec.guard is None or not guard.learned_serves(resolved):
        rt.scheduling.per_policy.guards.pop(key, None)
        for gauge in (rt.process.metrics.guard_tripped, rt.process.metrics.guard_estimate):
            gauge.remove_by_labels({"namespace": ref.namespace, "policy": ref.name})
        return None
    try:
        book = guard.book_for(rt.scheduling.per_policy.guards, key, guard.GuardSpec.of(spec.guard.fallback_when_worse_by,
                                                                 spec.guard.window))
        edited = guard.on_edit(book, body["metadata"].get("generation"), now)
        by_name = {j.name: j for j in jobs}
        records = [IntervalRecord(namespace=ref.namespace, policy=ref.name, policy_uid="",
                                  interval=interval.number, start=rfc3339(interval.start),
                                  end=rfc3339(now),
                                  length_s=interval.length_s(now, rt.process.config.interval_scale),
                                  algorithms={}, nodes=0,
                                  reward=float(closing.reward.get("reward") or 0.0),
                                  jobs=job_intervals(interval, closing, by_name))
                   for interval, closing in zip(to_close, closings)]
        cycles = rt.scheduling.per_policy.cycle_guards.get(key)
        change = await asyncio.to_thread(guard.add_and_judge, book, records,
                                         (resolved.allocation, resolved.placement),
                                         guard.fallback_of(resolved), now,
                                         cycles.remembered() if cycles is not None else None)
    except Exception:  # noqa: BLE001 - the guard must never stop a round
        log.exception("regret guard of %s/%s failed; the model keeps serving", *key)
        return rt.scheduling.per_policy.guards.get(key)
    event = guard.event(change, edited, book)
    if event is not None:
        rt.writers.events.in_background(rt.writers.events.emit(ref, *event))
    rt.process.metrics.guard_tripped.labels(ref.namespace, ref.name).set(1.0 if book.state.tripped else 0.0)
    last = book.state.last
    if last is not None:
        for name, value in (("learned", last.learned), ("fallback", last.fallback),
                            ("recorded", last.recorded)):
            rt.process.metrics.guard_estimate.labels(ref.namespace, ref.name, name).set(value)
    if book.state.tripped:
        guard.serve_fallback(resolved, book)
        rt.process.metrics.fallback.labels(ref.namespace, ref.name).set(1.0)
    return book


async def published_versions(rt: Runtime, ref: ObjectRef, spec) -> list:
    """The policy's published model versions; on a listing error, none this round (logged;
    what serves is then what the spec and the shipped models say)."""
    if not version_adoption.learned_phases(spec):
        return []
    try:
        return await version_adoption.list_versions(rt.api, ref.namespace, ref.name)
    except Exception as err:  # noqa: BLE001 - an API fault must not stop the round
        rt.process.metrics.api_errors.labels("versions").inc()
        log.warning("SchedulingPolicy %s/%s: cannot list published model versions: %s",
                    ref.namespace, ref.name, err)
        return []

