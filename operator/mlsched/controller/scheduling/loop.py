"""One SchedulingPolicy's scheduling loop: every `spec.interval` seconds a round, and in
between an admission step whenever a job arrives or capacity frees up.

A round: close the previous interval (rewards) → resolve the policy's algorithms and models →
snapshot the cluster from the indexes → grouping, allocation, placement (`run_served_round`:
for heuristic phases decided to its fixed point) → plan the smallest set of changes → apply
them → record status, Events and metrics. Status records are queued in the runtime's
StatusWriter and written in the background: deciding and scaling never wait for them, and a
record that cannot be written now is retried, not lost.

An admission step (`run_policy_admission`) decides for the policy's waiting jobs only, with
every running job held at the counts and nodes the last decision gave it
(policies.round.run_admission), and changes nothing for the running ones; running jobs are
re-decided only at the interval, as in the papers. The policy body is read afresh every round;
an edit of its spec wakes the loop for a full round at once. Nothing in a round may stop the
loop: a failing round is logged and the next one runs on time.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from mlsched.api import InvalidObject, SchedulingPolicy
from mlsched.cluster.types import Decision
from mlsched.controller.scheduling import (
    displacement, domain, fair_share, guard, pool_steps, pools, reporting, waiting,
)
from mlsched.controller.admission import quotas
from mlsched.controller.dataset import rewards
from mlsched.controller.serving import version_adoption
from mlsched.controller.dataset.dataset import Opening, job_intervals, rfc3339
from mlsched.controller.objects.apply import execute_all, ordered, summarize
from mlsched.controller.objects.desired import (
    Action, JobTarget, job_targets, plan_pods, plan_statefulset, roles_of,
)
from mlsched.controller.kube.events import ObjectRef
from mlsched.controller.process.loop_health import collection_paused
from mlsched.controller.serving.models import ResolvedPolicy
from mlsched.controller.objects.records import (
    TERMINAL_POD_PHASES, JobRecord, NodeRecord, PodPool, Resources, add,
)
from mlsched.controller.scheduling.runtime import Indexes, JobKey, Runtime, flatten, values
from mlsched.formats.serving import RoundServing, applied_epsilon, serve
from mlsched.controller.scheduling.snapshot import (
    build_snapshot, held_counted, held_elsewhere, held_labelled, held_ports, held_selected,
)
from mlsched.controller.process.supervision import plain
from mlsched.policies import registry
from mlsched.policies.cycle_guard import CycleGuard
from mlsched.policies.round import run_admission, run_round, run_served_round
from mlsched.policies.decision_log import IntervalRecord
from mlsched.policies.model_domain import shape_of
from mlsched.policies.work_conservation import idle_capacity

log = logging.getLogger("mlsched.controller.scheduling.loop")
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
    return usage_of(job, target.nodes)


def usage_of(job: JobRecord, nodes_by_role: Mapping[str, tuple[str, ...]]) -> dict[str, Resources]:
    """Per node, what the job's tasks there request (its templates' requests now)."""
    usage: dict[str, Resources] = {}
    for role, nodes in nodes_by_role.items():
        demand = job.demands.get(role, (0.0, 0.0, 0.0))
        for node in nodes:
            usage[node] = add(usage.get(node, (0.0, 0.0, 0.0)), demand)  # type: ignore[arg-type]
    return usage


def outgrown(job: JobRecord, decided: Mapping[str, tuple[str, ...]],
             nodes: Mapping[str, NodeRecord], reserved: Mapping[str, Resources] | None) -> str | None:
    """Why the job's spec, edited since its last decision, no longer admits that decision
    (None when it does): a role's count outside its new [min, max], a task on a node its
    template no longer allows, or pods that now request something else than what was
    reserved for them (`reserved`: the reservation made with the decision; None if unknown).
    Such a job is re-decided by the next admission step, not left so until the next round."""
    for role in roles_of(job):
        count = len(decided.get(role, ()))
        low, high = job.bounds(role)
        if not low <= count <= high:
            return f"its {count} {role} are outside the edited [{low}, {high}]"
        constraint = job.node_constraints.get(role)
        if constraint is not None:
            for name in decided.get(role, ()):
                node = nodes.get(name)
                if node is not None and not constraint.allows(name, node.labels, (), node.extended):
                    return f"its {role} on {name}, which the edited template does not allow"
    if reserved is not None:
        now = usage_of(job, {role: decided.get(role, ()) for role in roles_of(job)})
        if now.keys() != reserved.keys() or any(
                abs(a - b) > 1e-9 for node, r in now.items() for a, b in zip(r, reserved[node])):
            return "its pods' requests were edited"
    return None


def displaced_jobs(rt: Runtime, idx: Indexes, jobs: list[JobRecord],
                   decided: Mapping[JobKey, Mapping[str, tuple[str, ...]] | None],
                   nodes: Mapping[str, NodeRecord], now: float,
                   ) -> dict[JobKey, displacement.Displaced]:
    """The running jobs among `jobs` with tasks their decided node no longer takes."""
    # Nodes whose refusals may be the room a pod of ours holds or just left (displacement.py).
    vacating = frozenset(rt.refusals.settling(now).union(
        *(displacement.leaving(idx.pods.get(j.key, ()), decided.get(j.key)) for j in jobs)))
    cache: dict = {}
    out = {}
    for job in jobs:
        nodes_of = decided.get(job.key)
        if not (nodes_of or {}).get("worker"):
            continue
        moves = {role: rt.refusals.moves(job.key, role, now) for role in nodes_of}
        tasks = displacement.displaced_tasks(job, nodes_of, idx.pods.get(job.key, ()), nodes,
                                             rt.config.node_selector, rt.config.tolerated_taints,
                                             moves, vacating, cache)
        for role in nodes_of:  # remembered: not sent back there, and moves are counted
            refusing = {d.node for (r, _), d in tasks.items() if r == role and d.by_scheduler}
            if refusing:
                rt.refusals.note(job.key, role, refusing, now)
        if tasks:
            out[job.key] = tasks
    return out


def job_counts(rt: Runtime, key: tuple[str, str], jobs: list[JobRecord],
               status: Mapping[str, Any]) -> dict[str, Any]:
    """status.admittedJobs / waitingJobs / bookedGpus / fairShare after a step (the `kubectl
    get` columns), where they changed since last written or queued: the policy's jobs holding
    tasks as decided, those (not suspended or finished) holding nothing, the GPUs they hold,
    and its fair share while one bounds it (None clears it)."""
    admitted = sum(1 for j in jobs if j.schedulable and (rt.placements.of(j.key) or {}).get("worker"))
    share = rt.fair_shares.get(key)
    counts = {"admittedJobs": admitted,
              "waitingJobs": sum(1 for j in jobs if j.schedulable) - admitted,
              "bookedGpus": round(rt.reservations.gpus(key), 3),
              "fairShare": None if share is None else {
                  "entitledGpus": round(share.gpus, 3), "capacityGpus": round(share.capacity, 3),
                  "demandGpus": round(share.demand, 3), "contenders": share.contenders}}
    before = rt.policy_counts.get(key) or {k: status.get(k) for k in counts}
    rt.policy_counts[key] = counts
    return {k: v for k, v in counts.items() if before.get(k) != v}


def queue_counts(rt: Runtime, ref: ObjectRef, body: Mapping[str, Any],
                 jobs: list[JobRecord]) -> None:
    counts = job_counts(rt, (ref.namespace, ref.name), jobs, body.get("status") or {})
    if counts:
        rt.records.enqueue("SchedulingPolicy", ref.namespace, ref.name,
                           uid=body["metadata"].get("uid"), fields=counts)


async def note_waiting(rt: Runtime, jobs: list[JobRecord], targets: Mapping[str, JobTarget],
                       snapshot, decision: Decision, allocation: str) -> None:
    """Why each of `jobs` that the decision gave nothing still waits (waiting.py), for its
    Admitted condition; forgotten for the jobs it admitted."""
    for j in jobs:
        if targets[j.name].count("worker"):
            rt.waiting.pop(j.key, None)
    if all(targets[j.name].count("worker") for j in jobs):
        return
    share = rt.fair_shares.get((jobs[0].namespace, jobs[0].policy)) if jobs else None
    reasons = await asyncio.to_thread(waiting.why_waiting, snapshot, decision, allocation,
                                      fair_share.describe(share) if share else None)
    for j in jobs:
        if not targets[j.name].count("worker") and j.name in reasons:
            rt.waiting[j.key] = reasons[j.name]


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


async def _decide(snapshot, resolved: ResolvedPolicy,
                  serving: RoundServing | None = None, grouping=None,
                  guard: CycleGuard | None = None) -> tuple[Decision, str | None]:
    """Run the policies (`serving`: this round's copies of the learned ones; `grouping`: the
    grouping as the cluster runs it, pools.grouping_for; `guard`: the policy's cycle guard,
    through which a learned round goes, policies/cycle_guard.py); if a (learned) allocation raises,
    decide again with the fallback and the same (heuristic) grouping, so that a failing
    learned phase does not take the pools' labels and affinity away."""
    phases = serving.phases if serving is not None else {
        "allocation": resolved.allocation, "placement": resolved.placement,
        "grouping": resolved.grouping}
    grouping = grouping if grouping is not None else phases["grouping"]
    try:
        # A heuristic round is decided to its fixed point (policies/round.py), so that the
        # rounds after it, finding nothing new, restart nobody.
        return await asyncio.to_thread(run_served_round, snapshot, phases["allocation"],
                                       phases["placement"], grouping, guard), None
    except Exception as err:  # noqa: BLE001 - a policy bug must not stop scheduling
        fallback = resolved.fallback
        log.exception("a learned phase failed; deciding with %s allocation", fallback)
        decision = await asyncio.to_thread(run_round, snapshot, registry.make_allocation(fallback),
                                           resolved.fallback_placement or resolved.placement,
                                           grouping)
        return decision, f"{type(err).__name__}: {err}"


def policy_snapshot(rt: Runtime, idx: Indexes, jobs: list[JobRecord], schedulable: list[JobRecord],
                    now: float, interval_s: float, setup: pools.PoolSetup | None = None,
                    policy: tuple[str, str] | None = None):
    """What one policy may decide on: capacity less what other policies reserved and what
    pods outside its schedulable jobs hold (controller/scheduling/snapshot.py), its GPUs bounded by its
    fair share while policies contend for them (fair_share.py; `policy`: its key, whose
    entitlement is kept in rt.fair_shares). Call under round_lock. With a grouping (`setup`),
    only the nodes it may use (pools.usable)."""
    cluster = idx.cluster()
    share = None
    if policy is not None:
        share = policy_entitlement(rt, idx, policy, cluster)
        if share is None:
            rt.fair_shares.pop(policy, None)
        else:
            rt.fair_shares[policy] = share
    budget = fair_share.bounded(quota_budget(rt, idx, schedulable), share)
    if setup is not None:
        cluster = dataclasses.replace(cluster, nodes=[n for n in cluster.nodes
                                                      if pools.usable(n, setup)])
    mine = {j.key for j in jobs}  # built once: inside the comprehension it was O(jobs²), 50 %
    # of the operator's time and 8-15 s event-loop stalls per step at 2,000 jobs
    others = {k: v for k, v in rt.reservations.all().items() if k not in mine}
    deciding = {j.key for j in schedulable}
    selectors = {s for j in schedulable for found in j.anti_affinity.values() for s in found}
    spread = any(j.spread_constraints for j in schedulable)
    held = held_elsewhere(cluster, deciding, others)
    # Ports and counted resources (pod slots, devices) of the tasks other policies decided,
    # whose pods may not exist yet: their reservations are CPU, GPU and memory only.
    decided = {k: (job, nodes) for k in others
               if (nodes := rt.placements.of(k)) is not None and (job := idx.job(*k)) is not None}
    # Pods others hold matter only to jobs spread by anti-affinity or topology constraints.
    labelled = held_labelled(cluster, deciding, schedulable[0].namespace, decided) \
        if schedulable and (selectors or spread) else ()
    return build_snapshot(schedulable, cluster, now_s=now, interval_s=interval_s, held=held,
                          node_selector=rt.config.node_selector,
                          tolerated_taints=rt.config.tolerated_taints,
                          budget=budget,
                          # Others' ports matter only to tasks holding ports themselves.
                          ports=held_ports(cluster, deciding, decided)
                          if any(j.host_ports for j in schedulable) else None,
                          counted_used=held_counted(cluster, deciding, decided),
                          selected=held_selected(labelled, selectors) if selectors else None,
                          labelled=labelled,
                          # Other workloads' anti-affinity terms repelling job pods (rare).
                          repelled=cluster.foreign_repels.get(schedulable[0].namespace)
                          if schedulable else None)


def policy_entitlement(rt: Runtime, idx: Indexes, policy: tuple[str, str],
                       cluster) -> fair_share.Entitlement | None:
    """The policy's fair share of contended GPUs now (fair_share.py); None when unbounded.
    The cluster is read before a grouping narrows it: the policies share all the nodes."""
    weights = fair_share.weights(idx.policies)
    if len(weights) < 2:
        return None  # one policy: nothing to share (and no job to scan)
    every = flatten(idx.mljobs)
    running = {j.key for j in every if (rt.placements.of(j.key) or {}).get("worker")}
    return fair_share.entitlement(policy, every, weights, running, cluster,
                                  rt.config.node_selector)


def quota_budget(rt: Runtime, idx: Indexes, schedulable: list[JobRecord]):
    """What the namespace's ResourceQuotas leave the jobs a step decides (quotas.py): their
    own pods' usage counts as free, since the step books their tasks afresh; the tasks other
    jobs of the namespace were decided and have no pod for yet count as used, since the quota
    counts a pod only once it exists (two policies of one namespace deciding one after the
    other each booked what the quota had left, and both jobs were half-created). Each per
    quota scope: a PriorityClass-scoped quota counts the pods of its classes only, each pod
    by the class it was given when it was made."""
    if not schedulable:
        return None
    namespace = schedulable[0].namespace
    found = values(idx.quotas, namespace)
    if not found:
        return None
    scopes = quotas.scopes_of(found)
    scoped = len(scopes) > 1  # a PriorityClass-scoped quota: pods' classes matter
    default = idx.default_priority_class() if scoped else ""
    counts = any(q.counted for q in found)  # the counted resources (extended, DRA devices)
    own = {scope: quotas.Usage() for scope in scopes}
    for job in schedulable:
        for pod in idx.pods.get(job.key, ()):
            if pod.phase not in TERMINAL_POD_PHASES:
                priority = pod.priority_class  # set when it was made: the default may have moved
                taken = quotas.pod_takes(job, pod) if counts else ()
                for scope, usage in own.items():
                    if quotas.matches(scope, priority):
                        usage.add((*pod.requests, *pod.limits, 1.0), taken)
    mine = {j.key for j in schedulable}
    pending = {scope: quotas.Usage() for scope in scopes}
    for job in flatten(idx.mljobs):
        decided = rt.placements.of(job.key) if job.namespace == namespace else None
        if not decided or job.key in mine:
            continue
        exist = Counter(p.role for p in idx.pods.get(job.key, ())
                        if p.phase not in TERMINAL_POD_PHASES)
        for role, nodes in decided.items():
            missing = len(nodes) - exist[role]
            charge = job.charges.get(role)
            if missing > 0 and charge is not None:
                priority = quotas.priority_of(job, role, default) if scoped else ""
                for scope, usage in pending.items():
                    if quotas.matches(scope, priority):
                        usage.add(charge, quotas.quota_takes(job, role), missing)
    return quotas.budget(found, own, pending, default)


def wake_others(rt: Runtime, key: tuple[str, str]) -> None:
    """Every other policy's waiting jobs get an admission step now, not at their next round
    (one with nothing waiting does nothing)."""
    for other in rt.policy_loops.running() if rt.policy_loops is not None else ():
        if other != key:
            rt.wakeups.signal(other, "admission")


def one_version(live_body: Mapping[str, Any]) -> tuple[dict[str, Any], ObjectRef]:
    """The policy as it is now, copied, and its reference: the live view is replaced while a
    step awaits, and an edit landing mid-step must not be reported as observed (its generation
    written next to the old spec's decision)."""
    body = plain(live_body)
    return body, ObjectRef.of({**body, "kind": "SchedulingPolicy"})


async def run_policy_round(rt: Runtime, live_body: Mapping[str, Any], idx: Indexes,
                           now: float | None = None) -> RoundReport | None:
    started = time.perf_counter()
    now = time.time() if now is None else now
    body, ref = one_version(live_body)
    key = (ref.namespace, ref.name)
    status = body.get("status") or {}
    try:
        policy = SchedulingPolicy.from_k8s(body)
    except InvalidObject as err:
        await reporting.report_invalid_policy(rt, body, ref, str(err))
        return None
    spec = policy.spec
    interval_s = rt.config.round_seconds(spec.interval)
    versions = await published_versions(rt, ref, spec)
    rt.adopted[key] = version_adoption.adopted(spec, versions)
    resolved = await rt.models.resolve(key, spec, rt.adopted[key])
    setup = pools.configure(resolved, spec, ref.namespace, ref.name, rt.config.label_nodes,
                            rt.config.interval_scale)
    if resolved.load_failed:
        rt.metrics.model_load_failures.labels(ref.namespace, ref.name,
                                              resolved.model_loaded.reason).inc()
    rt.metrics.fallback.labels(ref.namespace, ref.name).set(
        1.0 if resolved.ready.reason == "FallbackActive" else 0.0)

    jobs = idx.jobs_of_policy(ref.namespace, ref.name)
    # One reading of progress closes the old interval and opens the new one: a report landing
    # in between must count in one of them, not in neither.
    epochs_now = {j.name: rt.epochs_done(j) for j in jobs}
    previous = rt.intervals.get(key)
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
    measured = {j.name: rt.measured(j) for j in jobs} if to_close else {}
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
            number = max(number, await rt.dataset.first_free(key))
    versions_served = version_adoption.report(spec, versions, resolved.served_refs,
                                              resolved.active_models).served
    rt.served_versions[key] = versions_served
    # The regret guard (controller/scheduling/guard.py) judges the intervals just closed before the round
    # decides: while tripped, the fallback serves this round.
    book = await guard_round(rt, ref, body, spec, resolved, jobs, to_close, closings, now)
    serving = serving_for(rt, ref, spec, resolved, number, "round", now, versions_served)
    # A job whose StatefulSets do not all exist yet is left to the admission step that their
    # creation triggers: deciding it now would reserve capacity and record a placement for
    # replicas nothing can scale, until the next round. One whose pods the API server would
    # refuse (preflight.py), or whose Service could not be created (services.py), gets nothing.
    schedulable = [j for j in jobs if j.schedulable and children_ready(rt, j, idx)
                   and not rt.preflight.holds(j)]

    # Snapshot, decision and reservations under one lock: two policies deciding at once would
    # each hand out the capacity the other is about to take.
    applying = contextlib.ExitStack()
    async with rt.round_lock:
        with collection_paused():  # its garbage is freed as it ends (loop_health.py)
            # Sticky to the last decision, not only to pods that exist: a job admitted seconds
            # ago has gated pods with no node yet, and must not be placed anew (and moved).
            snapshot = held_as_decided(policy_snapshot(rt, idx, jobs, schedulable, now,
                                                       interval_s, setup, key),
                                       {j.name: rt.placements.of(j.key) for j in schedulable})
            snapshot, grouping = pool_steps.grouped(rt, idx, snapshot, setup, schedulable, status,
                                                    serving.phases["grouping"])
            decision, failure = await _decide(snapshot, resolved, serving, grouping,
                                              rt.cycle_guards.setdefault(key, CycleGuard()))
            targets = pool_steps.with_pools(job_targets(decision, snapshot), decision, setup)
        held_before = rt.reservations.gpus(key)
        rt.reservations.set(key, {j.key: reservation(j, targets[j.name]) for j in schedulable
                                  if targets[j.name].count("worker")})
        if rt.reservations.gpus(key) < held_before - 1e-9:
            wake_others(rt, key)  # what it gave back (e.g. a borrowed fair share) is free now
        for job in schedulable:  # before the lock goes: others' quota budgets read it
            rt.placements.set(job.key, targets[job.name].nodes)
        # Until its patches are answered, events of these StatefulSets predate them.
        applying.enter_context(rt.placements.applying(j.key for j in schedulable))
    decided_in = time.perf_counter() - started
    with applying:
        await note_waiting(rt, schedulable, targets, snapshot, decision,
                           resolved.fallback if failure else resolved.allocation.name)
        if failure:
            resolved.model_loaded.status, resolved.model_loaded.reason = False, "InferenceFailed"
            resolved.model_loaded.message = failure
            resolved.active_models.clear()

        # Pools' labels before the templates that require them.
        await pool_steps.sync_node_labels(rt, idx, ref, snapshot, decision, setup)
        by_job: dict[JobKey, list[Action]] = {}
        for job in schedulable:
            by_job[job.key] = plan_job(rt, job, targets[job.name], idx,
                                       pools.pod_pool(decision.pools, job.name, setup))
        actions = ordered(a for plan in by_job.values() for a in plan)
        # Counts before the changes, for the Events: the indexes move as soon as the watch reports.
        before = {j.key: {s.role: s.replicas for s in idx.statefulsets.get(j.key, ())}
                  for j in schedulable}
        applying_from = time.perf_counter()
        results = await execute_all(rt.api, actions)
        applied_in = time.perf_counter() - applying_from
    failed = {id(a): r for a, r in zip(actions, results) if isinstance(r, BaseException)}
    done = [a for a in actions if id(a) not in failed]
    for kind, count in summarize(done).items():
        if count:
            rt.metrics.decisions.labels(ref.namespace, ref.name, kind).inc(count)
    if failed:
        rt.metrics.api_errors.labels("apply").inc(len(failed))
    rt.recorder.in_background(asyncio.gather(*(reporting.job_events(
        rt, job, targets[job.name], [a for a in by_job[job.key] if id(a) not in failed],
        before[job.key], [(a, failed[id(a)]) for a in by_job[job.key] if id(a) in failed])
        for job in schedulable)))

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
    rt.intervals[key] = opening

    # The dataset (dataset.py): the intervals closed, complete; the one opened, with the
    # decisions just made (a fallback's decision has none: the learned phase did not decide).
    facts = Opening(body["metadata"].get("uid", ""), algorithms(resolved),
                    len(snapshot.node_names))
    limit = spec.retraining.dataset_limit
    by_name = {j.name: j for j in jobs}
    for interval, closing in zip(to_close, closings):
        rt.dataset.closed(key, interval, closing, by_name, facts, now, limit)
    if decision.kept:  # in the allocation's decision log, and the operator's
        serving.keep(decision.kept)
        log.info("SchedulingPolicy %s/%s: cycle guard kept %d job(s) at their counts "
                 "(kept <- decided): %s", *key, len(decision.kept),
                 ", ".join(f"{n} {k} <- {d}" for n, (k, d) in sorted(decision.kept.items())[:10]))
    rt.dataset.opened(key, number, opening.start, facts, [] if failure else serving.decisions(),
                      limit, continued=continuing is not None)

    group_fields, group_changes = pool_steps.settle_groups(rt, jobs, targets, now)
    await pool_steps.group_events(rt, group_changes, set(decision.pools.moved))
    # Queued, not awaited: the records are written in the background (rt.records).
    job_patches = reporting.record_job_status(
        rt, ref.namespace, jobs, schedulable, targets, closings,
        {j.name: (rewards.open_status(number, opening.start, opening.grants[j.name])
                  if j.name in opening.grants else None) for j in jobs},
        spec.history_limit, group_fields)
    duration = time.perf_counter() - started
    extra = await reporting.policy_versions_and_exploration(
        rt, body, ref, version_adoption.report(spec, versions, resolved.served_refs,
                                               resolved.active_models),
        spec.exploration.epsilon, applied_epsilon(spec.exploration.epsilon,
                                                  rt.config.max_exploration))
    extra.update(await pool_steps.policy_groups(rt, body, ref, snapshot, decision, setup, spec,
                                                targets, now))
    extra.update(job_counts(rt, key, jobs, status))
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
    rt.metrics.round_duration.labels(ref.namespace, ref.name).observe(duration)
    if closed:
        rt.metrics.reward.labels(ref.namespace, ref.name).set(closed.reward["reward"])
    kinds = summarize(actions)
    log.info("policy %s/%s round %d: %d jobs, %d changes, allocation %s, %.0f ms (decided in "
             "%.0f ms, planned in %.0f ms, %.0f ms to apply %d scale, %d place, %d evict)",
             ref.namespace, ref.name, number, len(schedulable), len(actions),
             resolved.allocation.name, duration * 1000, decided_in * 1000,
             (applying_from - started) * 1000 - decided_in * 1000, applied_in * 1000,
             kinds["scale"], kinds["place"], kinds["evict"])
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
        rt.guards.pop(key, None)
        for gauge in (rt.metrics.guard_tripped, rt.metrics.guard_estimate):
            gauge.remove_by_labels({"namespace": ref.namespace, "policy": ref.name})
        return None
    try:
        book = guard.book_for(rt.guards, key, guard.GuardSpec.of(spec.guard.fallback_when_worse_by,
                                                                 spec.guard.window))
        edited = guard.on_edit(book, body["metadata"].get("generation"), now)
        by_name = {j.name: j for j in jobs}
        records = [IntervalRecord(namespace=ref.namespace, policy=ref.name, policy_uid="",
                                  interval=interval.number, start=rfc3339(interval.start),
                                  end=rfc3339(now),
                                  length_s=interval.length_s(now, rt.config.interval_scale),
                                  algorithms={}, nodes=0,
                                  reward=float(closing.reward.get("reward") or 0.0),
                                  jobs=job_intervals(interval, closing, by_name))
                   for interval, closing in zip(to_close, closings)]
        cycles = rt.cycle_guards.get(key)
        change = await asyncio.to_thread(guard.add_and_judge, book, records,
                                         (resolved.allocation, resolved.placement),
                                         guard.fallback_of(resolved), now,
                                         cycles.remembered() if cycles is not None else None)
    except Exception:  # noqa: BLE001 - the guard must never stop a round
        log.exception("regret guard of %s/%s failed; the model keeps serving", *key)
        return rt.guards.get(key)
    event = guard.event(change, edited, book)
    if event is not None:
        rt.recorder.in_background(rt.recorder.emit(ref, *event))
    rt.metrics.guard_tripped.labels(ref.namespace, ref.name).set(1.0 if book.state.tripped else 0.0)
    last = book.state.last
    if last is not None:
        for name, value in (("learned", last.learned), ("fallback", last.fallback),
                            ("recorded", last.recorded)):
            rt.metrics.guard_estimate.labels(ref.namespace, ref.name, name).set(value)
    if book.state.tripped:
        guard.serve_fallback(resolved, book)
        rt.metrics.fallback.labels(ref.namespace, ref.name).set(1.0)
    return book


async def run_policy_admission(rt: Runtime, live_body: Mapping[str, Any], idx: Indexes,
                               now: float | None = None) -> RoundReport | None:
    """Give waiting jobs tasks from free capacity now; None when there was nothing to admit."""
    started = time.perf_counter()
    now = time.time() if now is None else now
    body, ref = one_version(live_body)
    key = (ref.namespace, ref.name)
    try:
        spec = SchedulingPolicy.from_k8s(body).spec
    except InvalidObject:
        return None  # the next round reports it
    jobs = idx.jobs_of_policy(ref.namespace, ref.name)
    # A job is held where the last decision put it; a job the last decision gave nothing is
    # waiting once all its StatefulSets exist (admitting it earlier would reserve capacity for
    # replicas that nothing can scale yet).
    decided = {j.key: rt.placements.of(j.key) for j in jobs}
    schedulable = [j for j in jobs if j.schedulable and not rt.preflight.holds(j)
                   and ((decided[j.key] or {}).get("worker") or children_ready(rt, j, idx))]
    # Jobs whose spec was edited so that their decision no longer fits it are re-decided now
    # with the waiting ones, their tasks not held.
    node_records = {n.name: n for n in flatten(idx.nodes)}
    redecided = {j.key: why for j in schedulable if (decided[j.key] or {}).get("worker")
                 and (why := outgrown(j, decided[j.key], node_records,
                                      rt.reservations.usage_of(j.key)))}
    for job_key in redecided:
        decided[job_key] = None
    # Running jobs some of whose tasks lost their node (drained, deleted, tainted): those
    # tasks are placed again now (displacement.py).
    displaced = displaced_jobs(rt, idx, schedulable, decided, node_records, now)
    waiting = [j for j in schedulable if not (decided[j.key] or {}).get("worker")]
    if not waiting and not displaced:
        queue_counts(rt, ref, body, jobs)  # e.g. a job finished or was deleted
        return None
    resolved = await rt.models.resolve(key, spec, rt.adopted.get(key))
    book = rt.guards.get(key)
    if spec.guard is not None and book is not None and book.state.tripped \
            and guard.learned_serves(resolved):
        guard.serve_fallback(resolved, book)  # admission steps follow the guard's round
    setup = pools.configure(resolved, spec, ref.namespace, ref.name, rt.config.label_nodes,
                            rt.config.interval_scale)
    interval_s = rt.config.round_seconds(spec.interval)
    open_interval = rt.intervals.get(key)
    number = open_interval.number if open_interval else 0
    serving = serving_for(rt, ref, spec, resolved, number, "admission", now,
                          rt.served_versions.get(key, {}))
    failed_policy = False
    applying = contextlib.ExitStack()
    async with rt.round_lock:
        with collection_paused():  # as a round (loop_health.py)
            snapshot = held_as_decided(policy_snapshot(rt, idx, jobs, schedulable, now,
                                                       interval_s, setup, key),
                                       {j.name: decided[j.key] for j in schedulable},
                                       released={name for _, name in redecided})
            snapshot, grouping = pool_steps.grouped(rt, idx, snapshot, setup, schedulable,
                                                    body.get("status") or {},
                                                    serving.phases["grouping"])
            index = {name: i for i, name in enumerate(snapshot.node_names)}
            slots = {j.name: displacement.slots(decided[j.key], displaced[j.key], index)
                     for j in schedulable if j.key in displaced}
            avoid = {j.name: displacement.avoided(j, decided[j.key], rt.refusals, now, index)
                     for j in schedulable if j.key in displaced}
            try:
                phases = serving.phases
                decision = await asyncio.to_thread(run_admission, snapshot, phases["allocation"],
                                                   phases["placement"], grouping, slots, avoid)
            except Exception:  # noqa: BLE001 - a policy bug must not stop admission
                failed_policy = True
                log.exception("admission with %s failed; admitting with %s",
                              resolved.allocation.name, resolved.fallback)
                decision = await asyncio.to_thread(
                    run_admission, snapshot, registry.make_allocation(resolved.fallback),
                    resolved.fallback_placement or resolved.placement, grouping, slots, avoid)
            targets = pool_steps.with_pools(job_targets(decision, snapshot), decision, setup)
        # Admitted: given tasks now; a re-decided or displaced job is changed even when it is
        # given none (it could not get its starting gang back: it waits).
        admitted = [j for j in waiting if targets[j.name].count("worker") or j.key in redecided]
        admitted += [j for j in schedulable if j.key in displaced]
        rt.reservations.add(key, {j.key: reservation(j, targets[j.name]) for j in admitted})
        for job in admitted:  # before the lock goes: others' quota budgets read it
            rt.placements.set(job.key, targets[job.name].nodes)
        # Until its patches are answered, events of these StatefulSets predate them.
        applying.enter_context(rt.placements.applying(j.key for j in admitted))
    with applying:
        await note_waiting(rt, waiting, targets, snapshot, decision,
                           resolved.fallback if failed_policy else resolved.allocation.name)
        if open_interval is not None and not failed_policy:
            rt.dataset.admitted(key, number, open_interval.start,
                                Opening(body["metadata"].get("uid", ""), algorithms(resolved),
                                        len(snapshot.node_names)),
                                serving.decisions(), spec.retraining.dataset_limit)
        if not admitted:
            queue_counts(rt, ref, body, jobs)  # e.g. a job arrived and waits
            return None
        await asyncio.gather(*(rt.recorder.emit(
            ObjectRef("MLJob", j.namespace, j.name, j.uid), "Normal", "Redecided",
            f"spec edited: {redecided[j.key]}; decided again now, not at the next round")
            for j in admitted if j.key in redecided))
        for tasks in displaced.values():
            for d in tasks.values():
                rt.metrics.displaced_tasks.labels(ref.namespace, ref.name,
                                                  "scheduler" if d.by_scheduler else "node").inc()
        await asyncio.gather(*(rt.recorder.emit(
            ObjectRef("MLJob", j.namespace, j.name, j.uid), "Normal", "Displaced",
            f"{displacement.describe(j.name, displaced[j.key])}: placed again now, not at the "
            f"next round") for j in admitted if j.key in displaced))
        await pool_steps.sync_node_labels(rt, idx, ref, snapshot, decision, setup)
        before = {j.key: {s.role: s.replicas for s in idx.statefulsets.get(j.key, ())}
                  for j in admitted}
        by_job = {j.key: plan_job(rt, j, targets[j.name], idx,
                                  pools.pod_pool(decision.pools, j.name, setup)) for j in admitted}
        actions = ordered(a for plan in by_job.values() for a in plan)
        results = await execute_all(rt.api, actions)
    failed = {id(a): r for a, r in zip(actions, results) if isinstance(r, BaseException)}
    for kind, count in summarize([a for a in actions if id(a) not in failed]).items():
        if count:
            rt.metrics.decisions.labels(ref.namespace, ref.name, kind).inc(count)
    rt.recorder.in_background(asyncio.gather(*(reporting.job_events(
        rt, job, targets[job.name], [a for a in by_job[job.key] if id(a) not in failed],
        before[job.key], [(a, failed[id(a)]) for a in by_job[job.key] if id(a) in failed])
        for job in admitted)))
    opened = {}
    if open_interval is not None:  # the admitted jobs' rewards count from now, in this interval
        for j in admitted:
            if j.key in displaced and j.name in open_interval.grants:
                continue  # a repair, not a decision: the interval keeps the round's grant
            grant = open_interval.grants[j.name] = rewards.Grant(
                targets[j.name].count("ps"), targets[j.name].count("worker"),
                targets[j.name].placement(), rt.epochs_done(j), j.epochs, since=now)
            opened[j.name] = rewards.open_status(open_interval.number, open_interval.start, grant)
    group_fields, group_changes = pool_steps.settle_groups(rt, admitted, targets, now)
    await pool_steps.group_events(rt, group_changes, set())
    job_patches = reporting.record_job_status(rt, ref.namespace, admitted, admitted, targets, [],
                                              opened, spec.history_limit, group_fields)
    groups_patch = await pool_steps.policy_groups(rt, body, ref, snapshot, decision, setup,
                                                  spec, targets, now, round_=False)
    groups_patch.update(job_counts(rt, key, jobs, body.get("status") or {}))
    if groups_patch:
        rt.records.enqueue("SchedulingPolicy", ref.namespace, ref.name,
                           uid=body["metadata"].get("uid"), fields=groups_patch)
    duration = time.perf_counter() - started
    log.info("policy %s/%s admission: %d of %d waiting jobs admitted, %d changes, %.0f ms",
             ref.namespace, ref.name, len(admitted), len(waiting), len(actions), duration * 1000)
    return RoundReport(open_interval.number if open_interval else 0, interval_s,
                       {j.name: targets[j.name] for j in admitted}, actions, None, duration,
                       resolved.allocation.name, job_patches)


async def published_versions(rt: Runtime, ref: ObjectRef, spec) -> list:
    """The policy's published model versions; on a listing error, none this round (logged;
    what serves is then what the spec and the shipped models say)."""
    if not version_adoption.learned_phases(spec):
        return []
    try:
        return await version_adoption.list_versions(rt.api, ref.namespace, ref.name)
    except Exception as err:  # noqa: BLE001 - an API fault must not stop the round
        rt.metrics.api_errors.labels("versions").inc()
        log.warning("SchedulingPolicy %s/%s: cannot list published model versions: %s",
                    ref.namespace, ref.name, err)
        return []


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
                 epsilon=applied_epsilon(spec.exploration.epsilon, rt.config.max_exploration),
                 record=spec.retraining.dataset_limit > 0, versions=versions)


def children_exist(job: JobRecord, idx: Indexes) -> bool:
    return {s.role for s in idx.statefulsets.get(job.key, ())} >= set(roles_of(job))


def children_ready(rt: Runtime, job: JobRecord, idx: Indexes) -> bool:
    """Its StatefulSets exist to be scaled, and its Service was not refused (services.py)."""
    return children_exist(job, idx) and not rt.services.refused(job)


def held_as_decided(snapshot, decided: Mapping[str, Mapping[str, tuple[str, ...]] | None],
                    released: frozenset[str] | set[str] = frozenset()):
    """Job views whose counts and nodes are what the last decision gave them (the pods may not
    all exist or be placed yet): what an admission step holds them at, and where a round's
    stickiness sends them back. Each role's nodes are cut at the first node no longer in the
    snapshot (lost, cordoned), as the pod-derived prefix is: ordinal k keeps its node only if
    every ordinal before it does. `released` jobs hold nothing (an admission step re-decides
    them), whatever their pods show."""
    index = {name: i for i, name in enumerate(snapshot.node_names)}

    def prefix(names) -> tuple[int, ...]:
        out = []
        for name in names:
            if name not in index:
                break
            out.append(index[name])
        return tuple(out)

    views = []
    for view in snapshot.jobs:
        nodes = decided.get(view.name) or {}
        if view.name in released:
            view = dataclasses.replace(view, ps=0, workers=0, ps_nodes=(), worker_nodes=())
        elif nodes.get("worker"):
            ps, workers = prefix(nodes.get("ps", ())), prefix(nodes["worker"])
            view = dataclasses.replace(view, ps=len(ps), workers=len(workers),
                                       ps_nodes=ps, worker_nodes=workers)
        views.append(view)
    return dataclasses.replace(snapshot, jobs=views)


async def _report_failure(rt: Runtime, body: Mapping[str, Any], key: tuple[str, str],
                          err: BaseException) -> None:
    rt.metrics.step_failures.labels(*key, "round").inc()
    body, ref = one_version(body)
    try:
        await reporting.report_round_failure(rt, body, ref, err,
                                             rt.config.round_seconds(INVALID_RETRY_SECONDS))
    except Exception as report_err:  # noqa: BLE001 - the API server may be why the round failed
        log.warning("SchedulingPolicy %s/%s: cannot report the failed round: %s", *key,
                    report_err)


#: A burst of arrivals is admitted in one step: the step waits until no arrival has come for
#: ADMISSION_QUIET_S and every arrived job has its StatefulSets (a trailing debounce), but
#: never longer than ADMISSION_MAX_WAIT_S after the first, so a steady stream of arrivals is
#: still admitted every few seconds.
ADMISSION_QUIET_S = 0.25
ADMISSION_MAX_WAIT_S = 5.0


async def run_policy_forever(rt: Runtime, body: Mapping[str, Any], idx: Indexes,
                             sleep: Callable[[float], Awaitable[Any]],
                             stopped: Callable[[], bool]) -> None:
    """The daemon body: `body` is kopf's live view, so each round sees the latest spec.

    Between rounds the loop waits for its interval or a wake-up (runtime.Wakeups): `policy`
    (the spec was edited) runs a full round at once; `admission` runs an admission step after
    a short debounce, so a burst of arrivals is admitted together."""
    key = (body["metadata"].get("namespace"), body["metadata"]["name"])
    try:
        while not stopped():
            began = time.monotonic()
            try:
                report = await run_policy_round(rt, body, idx)
            except Exception as err:  # noqa: BLE001 - the loop must outlive any one round
                log.exception("SchedulingPolicy %s/%s: round failed", *key)
                report = None
                await _report_failure(rt, body, key, err)
            wait = report.interval_s if report else rt.config.round_seconds(INVALID_RETRY_SECONDS)
            while not stopped():
                left = wait - (time.monotonic() - began)
                if left <= 0:
                    break
                reasons = await _wake_or_sleep(rt, key, left, sleep)
                if not reasons or "policy" in reasons:
                    break
                await _quiet(rt, key, sleep,
                             pending=lambda: children_pending(rt, idx, key[0], key[1]))
                if "policy" in rt.wakeups.peek(key):
                    break
                rt.wakeups.drop(key, "admission")
                try:
                    await run_policy_admission(rt, body, idx)
                except Exception:  # noqa: BLE001
                    log.exception("SchedulingPolicy %s/%s: admission failed", *key)
                    rt.metrics.step_failures.labels(*key, "admission").inc()
    finally:
        rt.reservations.drop_policy(key)
        rt.intervals.pop(key, None)
        rt.adopted.pop(key, None)
        rt.served_versions.pop(key, None)
        rt.cycle_guards.pop(key, None)
        rt.dataset.forget(key)
        rt.wakeups.forget(key)
        rt.policy_counts.pop(key, None)
        rt.work_conservation.pop(key, None)
        rt.model_domain.pop(key, None)
        rt.guards.pop(key, None)
        rt.fair_shares.pop(key, None)
        rt.models.forget(key)  # its models stay loaded only if another policy uses them
        rt.policy_groups.pop(key, None)
        rt.policy_nodes.pop(key, None)
        rt.metrics.forget_policy(key[0], key[1])


async def _quiet(rt: Runtime, key, sleep, clock: Callable[[], float] = time.monotonic,
                 pending: Callable[[], bool] = lambda: False) -> None:
    """Wait until the wake-ups stop and nothing is `pending` (a burst has ended and its jobs'
    children exist), at most ADMISSION_MAX_WAIT_S."""
    first = clock()
    seen = rt.wakeups.signals(key)
    while True:
        await sleep(ADMISSION_QUIET_S)
        now = rt.wakeups.signals(key)
        if (now == seen and not pending()) or clock() - first >= ADMISSION_MAX_WAIT_S:
            return
        seen = now


def children_pending(rt: Runtime, idx: Indexes, namespace: str, policy: str) -> bool:
    """A job of the policy has arrived whose StatefulSets are still being created, or whose
    pods are being checked with a dry run (preflight.py)."""
    return any(j.schedulable and (not children_exist(j, idx) or j.key in rt.preflight.in_flight)
               for j in idx.jobs_of_policy(namespace, policy))


async def _wake_or_sleep(rt: Runtime, key, seconds: float, sleep) -> set[str]:
    """Wait for a wake-up or `seconds`, whichever comes first; `sleep` also returns early when
    the daemon is stopped. The reasons of the wake-up, or an empty set."""
    wake = asyncio.ensure_future(rt.wakeups.wait(key, seconds))
    nap = asyncio.ensure_future(sleep(seconds))
    done, pending = await asyncio.wait({wake, nap}, return_when=asyncio.FIRST_COMPLETED)
    for task in pending:
        task.cancel()
    await asyncio.gather(*pending, return_exceptions=True)
    return wake.result() if wake in done and not wake.cancelled() else set()
