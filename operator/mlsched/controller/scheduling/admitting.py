"""An admission step: between rounds, whenever a job arrives or capacity frees up, the policy's
waiting jobs decided with every running job held at the counts and nodes the last decision
gave it (policies.round.run_admission); running jobs are changed only when their spec was
edited out of their decision (re-decided) or a task lost its node (displaced), else only at
the interval, as in the papers. The pipeline is the step engine's (step.py)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from typing import Any

from mlsched.api import InvalidObject, SchedulingPolicy
from mlsched.controller.dataset import rewards
from mlsched.controller.dataset.dataset import Opening
from mlsched.controller.kube.events import ObjectRef
from mlsched.controller.scheduling import displacement, grouping_guard, guard, pool_steps, pools
from mlsched.controller.scheduling.runtime import Runtime
from mlsched.controller.scheduling.indexes import Indexes, flatten
from mlsched.controller.scheduling.step import (
    Outcome, RoundReport, Step, algorithms, begin, report_jobs, run_step, serving_for,
)
from mlsched.controller.scheduling.step_jobs import (
    children_ready, displaced_jobs, job_counts, outgrown, queue_counts,
)
from mlsched.policies.round import run_admission

log = logging.getLogger("mlsched.controller.scheduling.admitting")


async def run_policy_admission(rt: Runtime, live_body: Mapping[str, Any], idx: Indexes,
                               now: float | None = None) -> RoundReport | None:
    """Give waiting jobs tasks from free capacity now; None when there was nothing to admit."""
    started, now, body, ref, key = begin(live_body, now)
    try:
        spec = SchedulingPolicy.from_k8s(body).spec
    except InvalidObject:
        return None  # the next round reports it
    jobs = idx.jobs_of_policy(ref.namespace, ref.name)
    # A job is held where the last decision put it; a job the last decision gave nothing is
    # waiting once all its StatefulSets exist (admitting it earlier would reserve capacity for
    # replicas that nothing can scale yet).
    decided = {j.key: rt.scheduling.placements.of(j.key) for j in jobs}
    schedulable = [j for j in jobs if j.schedulable and not rt.jobs.preflight.holds(j)
                   and ((decided[j.key] or {}).get("worker") or children_ready(rt.scheduling, j, idx))]
    # Jobs whose spec was edited so that their decision no longer fits it are re-decided now
    # with the waiting ones, their tasks not held.
    node_records = {n.name: n for n in flatten(idx.nodes)}
    redecided = {j.key: why for j in schedulable if (decided[j.key] or {}).get("worker")
                 and (why := outgrown(j, decided[j.key], node_records,
                                      rt.scheduling.reservations.usage_of(j.key)))}
    for job_key in redecided:
        decided[job_key] = None
    # Running jobs some of whose tasks lost their node (drained, deleted, tainted): those
    # tasks are placed again now (displacement.py).
    displaced = displaced_jobs(rt, idx, schedulable, decided, node_records, now)
    waiting = [j for j in schedulable if not (decided[j.key] or {}).get("worker")]
    if not waiting and not displaced:
        queue_counts(rt, ref, body, jobs)  # e.g. a job finished or was deleted
        return None
    resolved = await rt.models.resolve(key, spec, rt.scheduling.per_policy.adopted.get(key))
    book = rt.scheduling.per_policy.guards.get(key)
    if spec.guard is not None and book is not None and book.state.tripped \
            and guard.learned_serves(resolved):
        guard.serve_fallback(resolved, book)  # admission steps follow the guard's round
    setup = pools.configure(resolved, spec, ref.namespace, ref.name, rt.process.config.label_nodes,
                            rt.process.config.interval_scale)
    grouping_guard.for_admission(rt.scheduling.per_policy.grouping_guards, key, resolved, setup, spec)
    interval_s = rt.process.config.round_seconds(spec.interval)
    open_interval = rt.scheduling.per_policy.intervals.get(key)
    number = open_interval.number if open_interval else 0
    serving = serving_for(rt, ref, spec, resolved, number, "admission", now,
                          rt.scheduling.per_policy.served_versions.get(key, {}))

    def rule(snapshot):
        index = {name: i for i, name in enumerate(snapshot.node_names)}
        slots = {j.name: displacement.slots(decided[j.key], displaced[j.key], index)
                 for j in schedulable if j.key in displaced}
        avoid = {j.name: displacement.avoided(j, decided[j.key], rt.pods.refusals, now, index)
                 for j in schedulable if j.key in displaced}
        return lambda allocation, placement, grouping, _cycles: run_admission(
            snapshot, allocation, placement, grouping, slots, avoid)

    def admitted_of(targets) -> list:
        # Admitted: given tasks now; a re-decided or displaced job is changed even when it is
        # given none (it could not get its starting gang back: it waits).
        return ([j for j in waiting if targets[j.name].count("worker") or j.key in redecided]
                + [j for j in schedulable if j.key in displaced])

    async def announce(outcome: Outcome) -> bool:
        admitted = outcome.applied
        if open_interval is not None and not outcome.failure:
            rt.writers.dataset.admitted(key, number, open_interval.start,
                                        Opening(body["metadata"].get("uid", ""), algorithms(resolved),
                                                len(outcome.snapshot.node_names)),
                                        serving.decisions(), spec.retraining.dataset_limit)
        if not admitted:
            queue_counts(rt, ref, body, jobs)  # e.g. a job arrived and waits
            return False
        await asyncio.gather(*(rt.writers.events.emit(
            ObjectRef("MLJob", j.namespace, j.name, j.uid), "Normal", "Redecided",
            f"spec edited: {redecided[j.key]}; decided again now, not at the next round")
            for j in admitted if j.key in redecided))
        for tasks in displaced.values():
            for d in tasks.values():
                rt.process.metrics.displaced_tasks.labels(ref.namespace, ref.name,
                                                          "scheduler" if d.by_scheduler else "node").inc()
        await asyncio.gather(*(rt.writers.events.emit(
            ObjectRef("MLJob", j.namespace, j.name, j.uid), "Normal", "Displaced",
            f"{displacement.describe(j.name, displaced[j.key])}: placed again now, not at the "
            f"next round") for j in admitted if j.key in displaced))
        return True

    step = Step("admission", ref, body, resolved, serving, setup, now, interval_s, jobs,
                schedulable, held={j.name: decided[j.key] for j in schedulable}, rule=rule,
                applied=admitted_of, waiting=waiting,
                released=frozenset(name for _, name in redecided))
    outcome = await run_step(rt, idx, step, started, announce)
    admitted, targets = outcome.applied, outcome.targets
    if not admitted:
        return None
    opened = {}
    if open_interval is not None:  # the admitted jobs' rewards count from now, in this interval
        for j in admitted:
            if j.key in displaced and j.name in open_interval.grants:
                continue  # a repair, not a decision: the interval keeps the round's grant
            grant = open_interval.grants[j.name] = rewards.Grant(
                targets[j.name].count("ps"), targets[j.name].count("worker"),
                targets[j.name].placement(), rt.jobs.epochs_done(j), j.epochs, since=now)
            opened[j.name] = rewards.open_status(open_interval.number, open_interval.start, grant)
    job_patches = await report_jobs(rt, step, outcome, admitted, [], opened, spec)
    groups_patch = await pool_steps.policy_groups(rt, body, ref, outcome.snapshot,
                                                  outcome.decision, setup, spec, targets, now,
                                                  round_=False)
    groups_patch.update(job_counts(rt.scheduling, key, jobs, body.get("status") or {}))
    if groups_patch:
        rt.writers.status.enqueue("SchedulingPolicy", ref.namespace, ref.name,
                                  uid=body["metadata"].get("uid"), fields=groups_patch)
    duration = time.perf_counter() - started
    log.info("policy %s/%s admission: %d of %d waiting jobs admitted, %d changes, %.0f ms",
             ref.namespace, ref.name, len(admitted), len(waiting), len(outcome.actions),
             duration * 1000)
    return RoundReport(open_interval.number if open_interval else 0, interval_s,
                       {j.name: targets[j.name] for j in admitted}, outcome.actions, None,
                       duration, resolved.allocation.name, job_patches)
