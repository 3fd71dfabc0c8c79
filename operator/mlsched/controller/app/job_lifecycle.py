"""An MLJob's lifecycle as the operator keeps it: its phase and conditions evaluated from
what its pods, StatefulSets and policy show (objects/lifecycle.py decides; this gathers
what it observes and writes the verdict, the Events in order), and whether the API server
would refuse its pods (preflight)."""

from __future__ import annotations

import dataclasses
import time
from collections import Counter
from collections.abc import Mapping, MutableMapping
from datetime import UTC, datetime
from typing import Any

from mlsched.api import InvalidObject
from mlsched.controller.scheduling import displacement
from mlsched.controller.objects import lifecycle, preflight
from mlsched.controller.admission import quotas
from mlsched.controller.objects.apply import (
    ChildOverQuota, WaitingForOldChildren, ensure_statefulsets, execute_all, scale_to_zero_plan,
)
from mlsched.controller.kube.events import ObjectRef
from mlsched.controller.kube.kube import KubeError
from mlsched.controller.objects.job_records import JobRecord, job_record, parsed_job
from mlsched.controller.scheduling.runtime import Runtime
from mlsched.controller.scheduling.indexes import Indexes, values
from mlsched.controller.app.pod_events import restore_service
from mlsched.controller.app.pod_problems import (
    claims_unmade, pods_refused, stuck_creating, unscheduled,
)



def job_ref(body: Mapping[str, Any]) -> ObjectRef:
    return ObjectRef.of({**body, "kind": "MLJob"})


async def _pods_verdict(rt: Runtime, job: JobRecord, seen: lifecycle.Observed) -> str | None:
    """Whether the API server would refuse the job's pods, asked again when a refusal is old
    (what refused it is not watched) or when the pods of a job given capacity are all refused;
    such a job gives its capacity back (its policy's next round would have taken it, a day
    later under a daily interval)."""
    if job.error is not None or job.suspend or job.final:
        return None
    book = rt.jobs.preflight
    none_created = not any(s.created for s in seen.statefulsets)
    ask = book.due(job) or (seen.pods_refused is not None and none_created
                            and not book.recent(job))
    if ask and book.start(job):
        await preflight.check(rt, job)
    refusal = book.refusal(job)
    held = {s.role: s.replicas for s in seen.statefulsets if s.replicas}
    if refusal is not None and held and none_created:
        # The decision goes first: the StatefulSets' watch events during the scaling must not
        # find it and restore the replicas (restore_replicas).
        rt.scheduling.reservations.release(job.key)
        rt.scheduling.placements.forget(job.key)
        await execute_all(rt.api, scale_to_zero_plan(seen.statefulsets, job.namespace))
        rt.scheduling.wakeups.signal((job.namespace, job.policy), "admission")
        await rt.writers.events.emit(ObjectRef("MLJob", job.namespace, job.name, job.uid), "Normal",
                                     "Released", "gave back " + ", ".join(f"{n} {r}" for r, n in held.items())
                                     + ": the API server refuses to create its pods")
        seen.statefulsets = [dataclasses.replace(s, replicas=0) for s in seen.statefulsets]
    return refusal



async def sync_lifecycle(rt: Runtime, body: Mapping[str, Any], idx: Indexes,
                         patch: MutableMapping[str, Any], now: datetime | None = None,
                         rejected: str | None = None,
                         over_quota: str | None = None,
                         created: bool = False) -> lifecycle.Outcome:
    """Phase, conditions and run-policy actions (suspend, cleanPodPolicy, TTL) for one job.
    `rejected`: the API server's message when it just refused one of the job's children;
    `over_quota`: why one of them cannot be created yet (apply.ChildOverQuota); `created`:
    its children were just made, so none is to be made again (the index may not show them
    yet: each was created a second time, a 409 and a read, when the creates were answered
    before their watch events, bench_e2e)."""
    job = idx.as_planned(job_record(body))
    statefulsets = list(idx.statefulsets.get(job.key, ()))
    seen = lifecycle.Observed(statefulsets=statefulsets, children_over_quota=over_quota)
    if now is not None:
        seen.now = now
    else:
        seen.precise_now = datetime.now(UTC)
    outcome = await _evaluate(rt, body, job, idx, seen, rejected, created)

    if outcome.changed:
        patch.setdefault("status", {}).update(outcome.status)
    if outcome.events:
        # Posted without the status patch waiting for them: Events go out through the create
        # slots, after a burst's StatefulSets and Services (kube.py), and in bench_e2e's burst
        # a job's `Running` phase was written up to 10 s after its `Running` Event was logged.
        rt.writers.events.in_background(_emit_in_order(rt, job_ref(body), outcome.events))
    if outcome.scale_to_zero:
        await execute_all(rt.api, scale_to_zero_plan(statefulsets, job.namespace))
        rt.scheduling.reservations.release(job.key)
        rt.scheduling.placements.forget(job.key)
    if outcome.delete_job:
        await rt.writers.events.emit(job_ref(body), "Normal", "TTLExpired",
                                     "ttlSecondsAfterFinished has passed; deleting the MLJob")
        await rt.api.delete("MLJob", job.namespace, job.name, uid=job.uid)
    return outcome


async def _emit_in_order(rt: Runtime, ref: ObjectRef,
                         events: list[tuple[str, str, str]]) -> None:
    for type_, reason, message in events:
        await rt.writers.events.emit(ref, type_, reason, message)


async def _evaluate(rt: Runtime, body: Mapping[str, Any], job: JobRecord, idx: Indexes,
                    seen: lifecycle.Observed, rejected: str | None,
                    created: bool = False) -> lifecycle.Outcome:
    status = body.get("status") or {}
    try:
        spec = parsed_job(body).spec
    except InvalidObject as err:
        return lifecycle.invalid(status, str(err), job.generation, seen.now)
    if rejected is None and job.refused and status.get("observedGeneration") == job.generation:
        # Refused and not edited since: nothing to retry (an edit runs reconcile_children).
        return lifecycle.Outcome(status=dict(status), changed=False)
    if rejected is None and not created and not job.finished and not seen.children_over_quota:
        try:  # self-healing: a StatefulSet deleted by hand comes back (with zero replicas)
            await ensure_statefulsets(rt.api, job, seen.statefulsets, rt.pod_settings)
            await restore_service(rt, job)  # a restore that failed after its deletion event
        except KubeError as err:
            if not err.rejected:
                raise
            rejected = err.message
        except WaitingForOldChildren:
            pass  # reported by reconcile_if_needed, which the sweep retries
        except ChildOverQuota as err:
            seen.children_over_quota = str(err)  # created when the quota has room
    if rejected is not None:
        return lifecycle.invalid(status, f"the API server refused the job's StatefulSet: "
                                 f"{rejected}", job.generation, seen.now)
    pods = list(idx.pods.get(job.key, ()))
    for pod in pods:
        rt.scheduling.failures.observe(job.key, pod.uid, pod.restarts, pod.last_exit_zero, pod.name,
                            pod.last_failure)
    seen.cannot_start = sorted([(p.name, p.stuck) for p in pods if p.stuck and not p.deleting]
                               + await stuck_creating(rt, job.key, job.namespace, pods)
                               + await claims_unmade(rt, job.key, job.namespace, pods))
    refused = [p for p in pods if p.unschedulable and not p.deleting]
    if refused:  # refused where a pod of ours is leaving: the plan at work (displacement.py)
        at = time.time()
        vacating = rt.pods.vacating.nodes(idx.pods, rt.scheduling.placements.of, rt.pods.refusals.settling(at), at,
                                     asked={p.pinned for p in refused if p.pinned})
        seen.waiting_for_room = sorted(
            (p.name, p.pinned, vacating[p.pinned]) for p in refused
            if p.pinned in vacating and displacement.refused_there(p, p.pinned))
        waiting = {name for name, _, _ in seen.waiting_for_room}
        refused = [p for p in refused if p.name not in waiting]
    seen.unschedulable = sorted([(p.name, p.unschedulable) for p in refused]
                                + unscheduled(rt, job.key, pods))
    seen.pods_refused = await pods_refused(rt, job, seen.statefulsets, pods)
    seen.would_be_refused = await _pods_verdict(rt, job, seen)
    if not any(s.replicas for s in seen.statefulsets):  # only a job not admitted can be told
        found = values(idx.quotas, job.namespace)
        never, waiting = quotas.reasons(job, found, idx.default_priority_class())
        seen.cannot_fit = job.blocked or rt.cluster_fit(idx).why_not(job) or never
        seen.over_quota = waiting
        seen.waiting_for = rt.jobs.waiting.get(job.key)
    seen.failures = rt.scheduling.failures.total(job.key)
    seen.last_failure = rt.scheduling.failures.last(job.key)
    seen.workers_completed = sum(1 for p in pods if p.role == "worker" and p.completed
                                 and not p.deleting)
    replicas = {s.role: s.replicas for s in seen.statefulsets}
    seen.pods_ready = Counter(p.role for p in pods if p.ready and not p.deleting
                              and p.ordinal < replicas.get(p.role, 0))
    seen.epochs_done = rt.jobs.epochs_done(job)
    seen.policy_exists = bool(list(idx.policies.get((job.namespace, job.policy), ())))
    seen.created_s = job.created_s or None
    return lifecycle.evaluate(spec, job.generation, status, seen)
