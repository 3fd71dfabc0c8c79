"""What the MLJob and pod handlers do, apart from kopf: children, lifecycle, late pod pinning.

Each function takes the Runtime, the object's body and the indexes, so tests call them with a
fake API and plain dicts; handlers.py only wires them to kopf's decorators.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections import Counter
from collections.abc import Iterable, Mapping, MutableMapping
from datetime import UTC, datetime
from typing import Any

from mlsched.api import InvalidObject
from mlsched.controller.scheduling import displacement, pools
from mlsched.controller.objects import lifecycle, preflight
from mlsched.controller.admission import quotas
from mlsched.controller.objects.apply import (
    ChildOverQuota, WaitingForOldChildren, ensure_service, ensure_statefulsets, execute,
    execute_all, refresh_plan, refresh_templates, scale_to_zero_plan,
)
from mlsched.controller.kube.constants import JOB_LABEL, LEGACY_ANNOTATIONS, LEGACY_FINALIZER
from mlsched.controller.objects.desired import DeletePod, PinPod, plan_statefulset, roles_of
from mlsched.controller.kube.events import ObjectRef
from mlsched.controller.kube.kube import STATUS_FIRST, STATUS_ROUTINE, STATUS_SOON, KubeError
from mlsched.controller.constraints.node_constraints import EVERY_NODE
from mlsched.controller.objects.records import (
    DEFAULT_SCHEDULER, PodRecord, StsRecord, controller_uid, pod_record, sts_record,
)
from mlsched.controller.objects.job_records import JobRecord, job_record, parsed_job
from mlsched.controller.scheduling.runtime import Runtime
from mlsched.controller.scheduling.indexes import Indexes, JobKey, flatten, values
from mlsched.controller.process.supervision import key_of, plain

log = logging.getLogger("mlsched.controller.app.jobs")


def _ref(body: Mapping[str, Any]) -> ObjectRef:
    return ObjectRef.of({**body, "kind": "MLJob"})


async def on_job_event(rt: Runtime, event_type: str | None, body: Mapping[str, Any],
                       idx: Indexes) -> None:
    """Every watch event of an MLJob: keep its latest body for the sweep, and create or refresh
    its children when this generation has not been reconciled yet."""
    key = key_of(body)
    if event_type == "DELETED":
        # Children go with the owner references; only the in-memory books need forgetting. The
        # capacity it held frees as its pods go (each pod's deletion wakes the admission of
        # the policy it had: rt.departed).
        rt.forget_job(key)
        rt.note_departed(key, (body.get("spec") or {}).get("schedulingPolicy") or "default")
        return
    # A body from before the operator's last status patch of the job shows that patch too
    # (written_status.py): its lifecycle must not decide the same change twice.
    body = rt.written_status.over(key, plain(body))
    rt.job_bodies[key] = body
    if not rt.leadership.leading:
        return  # a standby writes nothing; when it leads, the sweep reconciles every job
    await release_legacy_finalizer(rt, "MLJob", body)
    meta = body["metadata"]
    if not meta.get("deletionTimestamp") \
            and rt.reconciled.get(key) != (meta.get("uid"), int(meta.get("generation") or 0)):
        try:  # one at a time with the job's evaluations: a due one used to create the same
            # children again while this one's creates waited in a burst (a 409 and a read each)
            await sync_job(rt, body, idx, prompt=True)
        except Exception as err:  # noqa: BLE001 - reported on the job; the sweep retries
            log.warning("MLJob %s/%s: %s", *key, err)


#: A job whose children the namespace's ResourceQuota has no room for is tried again when a
#: quota of its namespace changes (handlers.quota_event), an edit of the job, or after this.
OVER_QUOTA_RETRY_S = 30.0


async def reconcile_if_needed(rt: Runtime, body: dict[str, Any], idx: Indexes) -> None:
    job = job_record(body)
    if rt.reconciled.get(job.key) == (job.uid, job.generation):
        return
    blocked = rt.over_quota.get(job.key)
    if blocked and blocked[:2] == (job.uid, job.generation) \
            and time.monotonic() - blocked[2] < OVER_QUOTA_RETRY_S:
        return  # not a create call per job per sweep while the quota stays full
    patch: dict[str, Any] = {}
    try:
        await reconcile_children(rt, body, idx, patch)
    except ChildOverQuota as err:
        # Waiting, not failing: the status says why (WaitingForQuota), an Event once.
        await write_status(rt, body, patch)
        rt.over_quota[job.key] = (job.uid, job.generation, time.monotonic())
        if rt.retrying.get(job.key) != str(err):
            rt.retrying[job.key] = str(err)
            await rt.recorder.emit(_ref(body), "Normal", "WaitingForQuota", str(err))
        return
    except Exception as err:
        # Transient (the API server unavailable, an earlier job's children still there): say
        # so once, retry each sweep. The phase the lifecycle found is shown meanwhile.
        await write_status(rt, body, patch)
        if isinstance(err, WaitingForOldChildren):
            type_, reason, message = "Normal", "WaitingForOldChildren", str(err)
        else:
            type_, reason = "Warning", "ChildrenNotCreated"
            message = f"could not create the job's children, retrying every " \
                      f"{rt.config.job_sync_seconds:g} s: {err}"
        if rt.retrying.get(job.key) != message:
            rt.retrying[job.key] = message
            await rt.recorder.emit(_ref(body), type_, reason, message)
        raise
    rt.retrying.pop(job.key, None)
    rt.over_quota.pop(job.key, None)
    rt.reconciled[job.key] = (job.uid, job.generation)
    await write_status(rt, body, patch)


#: The phases a job's user waits for: it started, or it ended.
AWAITED_PHASES = frozenset({"Running", "Succeeded", "Failed"})


def status_priority(before: Mapping[str, Any], after: Mapping[str, Any]) -> int:
    """Where the lifecycle's status patch waits among the others (kube.py): a job turning
    Running or ending first, then any other change of phase or reason, then counts alone."""
    phase = after.get("phase")
    if phase in AWAITED_PHASES and phase != before.get("phase"):
        return STATUS_FIRST
    return STATUS_ROUTINE if lifecycle.only_counts(before, after) else STATUS_SOON


async def write_status(rt: Runtime, body: dict[str, Any], patch: Mapping[str, Any]) -> None:
    """Patch what the lifecycle changed into the job's status, and into the kept body, so the
    next sweep compares against what was written, not against the body before the write."""
    status = patch.get("status")
    if not status:
        return
    meta = body["metadata"]
    priority = status_priority(body.get("status") or {}, status)
    if await rt.api.patch("MLJob", meta["namespace"], meta["name"], {"status": status},
                          status=True, priority=priority):
        key = (meta["namespace"], meta["name"])
        rt.written_status.wrote(key, status)
        kept = rt.job_bodies.get(key)
        if kept is not None and kept is not body:
            # A watch event replaced the kept body while the patch was out: that body is
            # older than the patch (the next evaluation would decide the same change again).
            rt.job_bodies[key] = rt.written_status.over(key, kept)
    body.setdefault("status", {}).update(status)


SWEEP_BATCH = 50  # jobs whose lifecycle one step of the sweep checks (see sweep)


#: How long a change of pod counts alone (lifecycle.only_counts) may wait to be written when a
#: pod event brought it: the job's next pods turning Ready within it share one status patch.
COUNTS_DELAY_S = 1.0


async def sync_job(rt: Runtime, body: dict[str, Any], idx: Indexes,
                   prompt: bool = False) -> bool:
    """One job's lifecycle (or the children still to create after a transient error). False
    when it is being evaluated already (the sweep and a prompt evaluation met): one at a time,
    or both would post the same Events; a prompt one is then made after it. `prompt`: brought
    by a pod event (sync_due_forever), whose change of counts alone waits up to COUNTS_DELAY_S
    to be written (a phase or reason change, or an Event, never waits)."""
    if body["metadata"].get("deletionTimestamp"):
        return True
    job = job_record(body)
    if job.key in rt.syncing:
        if prompt:  # looked at again once the evaluation under way ends
            rt.syncing[job.key] = True
            # Which may be waiting to write a change of counts, queued after every other
            # status patch: up to 10 s in a burst, while this job's pods had all turned Ready.
            rt.api.hurry_status("MLJob", *job.key)
        return False
    rt.syncing[job.key] = False
    try:
        if rt.reconciled.get(job.key) != (job.uid, job.generation):
            await reconcile_if_needed(rt, body, idx)
            return True
        patch: dict[str, Any] = {}
        outcome = await sync_lifecycle(rt, body, idx, patch)
        if (prompt and patch.get("status") and not outcome.events
                and lifecycle.only_counts(body.get("status") or {}, patch["status"])
                and counts_wait(rt, job.key)):
            return True
        rt.counts_due.pop(job.key, None)
        await write_status(rt, body, patch)
        return True
    finally:
        # Marked due while this evaluation was under way (a child's create or a status patch
        # can wait seconds in a burst): its pods may have changed since it read them. It used
        # to be marked again at once, and again, every 0.3 s until this one ended (13,789
        # evaluations that did nothing in bench_e2e's 300-job burst).
        if rt.syncing.pop(job.key, False):
            rt.lifecycle_due.mark(job.key)


def counts_wait(rt: Runtime, key: JobKey) -> bool:
    """Whether the job's change of counts alone may wait: the first such change waits
    COUNTS_DELAY_S (the job is marked due again then), later ones until that time."""
    loop = asyncio.get_running_loop()
    deadline = rt.counts_due.get(key)
    if deadline is None:
        rt.counts_due[key] = loop.time() + COUNTS_DELAY_S
        loop.call_later(COUNTS_DELAY_S, rt.lifecycle_due.mark, key)
        return True
    return loop.time() < deadline


async def sync_batches(rt: Runtime, bodies: list[dict[str, Any]], idx: Indexes) -> list[Any]:
    """`sync_job` for each, SWEEP_BATCH at a time with the event loop free in between:
    gathered all at once, thousands of jobs' lifecycle checks (about 0.6 ms each) ran back to
    back before the loop polled its sockets again, so watch events, admissions and /healthz
    waited for the whole sweep. Failures are logged, one job's not holding up the others."""
    results: list[Any] = []
    for start in range(0, len(bodies), SWEEP_BATCH):
        batch = bodies[start:start + SWEEP_BATCH]
        results += await asyncio.gather(*(sync_job(rt, b, idx) for b in batch),
                                        return_exceptions=True)
        await asyncio.sleep(0)
    for body, result in zip(bodies, results):
        if isinstance(result, Exception):
            log.warning("MLJob %s/%s: %s", body["metadata"].get("namespace"),
                        body["metadata"].get("name"), result)
    return results


#: Jobs whose lifecycle is evaluated at once between sweeps (see sync_due_forever). An
#: evaluation holds its slot until its status patch is answered, and a change of counts alone
#: waits in the status slots behind every phase change (kube.py): with 32, a burst's count
#: patches held every slot while jobs whose pods had all turned Ready waited up to 24 s for
#: one (bench_e2e, 300 jobs). The API calls are bounded by kube.py's slots; this bounds how
#: many evaluations start in one turn of the event loop (about 1 ms each).
DUE_CONCURRENCY = 256


async def sync_due_forever(rt: Runtime) -> None:
    """Until cancelled, evaluate the jobs marked due (a pod of theirs changed) as they are
    marked: a job's phase follows its pods within a fraction of a second, a burst's too
    (issue 55: the 10 s sweep alone left 300 new jobs Pending for minutes after their pods
    were Ready). Up to DUE_CONCURRENCY at a time, each on its own: one slow status patch
    holds up no other job (in batches, each waited for the slowest of its batch)."""
    slots = asyncio.Semaphore(DUE_CONCURRENCY)
    queued: set[JobKey] = set()  # waiting for a slot: marked again, they need no second task

    async def one(key: JobKey) -> None:
        async with slots:
            # From here a new mark is a change this evaluation may not see: it gets a task.
            queued.discard(key)
            body = rt.job_bodies.get(key)
            if body is None:
                return
            try:  # if another evaluation of the job is under way, it marks it due after
                await sync_job(rt, body, rt.indexes, prompt=True)
            except Exception as err:  # noqa: BLE001 - the sweep tries again
                log.warning("MLJob %s/%s: %s", *key, err)

    running: set[asyncio.Task] = set()
    while True:
        for key in await rt.lifecycle_due.take():
            if key in queued:
                # Its evaluation has not begun: it will read the latest body and pods. A
                # burst's pod events used to queue five or more evaluations of one job,
                # each waiting its turn, the phase change behind them all (bench_e2e).
                continue
            queued.add(key)
            task = asyncio.create_task(one(key))
            running.add(task)
            task.add_done_callback(running.discard)


async def sweep(rt: Runtime, idx: Indexes) -> None:
    """Every job's lifecycle, and the children still to create after a transient error."""
    await sync_batches(rt, list(rt.job_bodies.values()), idx)
    try:
        await release_orphaned_pools(rt, idx)
    except Exception as err:  # noqa: BLE001 - retried at the next sweep
        log.warning("releasing the pools of deleted SchedulingPolicies: %s", err)


#: A policy must have been missing from the index this long before its pools are released:
#: right after a start (or a watch restart) the index may not show it yet.
ORPHAN_GRACE_S = 30.0


async def release_orphaned_pools(rt: Runtime, idx: Indexes, grace_s: float = ORPHAN_GRACE_S,
                                 clock=time.monotonic) -> None:
    """A deleted SchedulingPolicy's pools (controller/scheduling/pools.py): its nodes' labels go (those
    the operator added, --label-nodes), and its jobs' templates lose the pool's affinity and
    CPU share, their status.group is cleared, once the policy has been missing for `grace_s`.
    A policy edited back to grouping none is handled by its own next round instead."""
    policies = set(idx.policies.keys())
    now = clock()
    named = {(j.namespace, j.policy) for j in flatten(idx.mljobs)}
    named |= {tuple(n.pool_owner.split("/", 1)) for n in flatten(idx.nodes)
              if n.pool_owner and "/" in n.pool_owner}
    for key in list(rt.orphans):
        if key in policies or key not in named:
            del rt.orphans[key]
    gone = set()
    for key in named - policies:
        first = rt.orphans.setdefault(key, now)
        if now - first >= grace_s:
            gone.add(key)
    if rt.config.label_nodes:
        for change in pools.orphaned_labels(flatten(idx.nodes), policies, rt.config.namespaces):
            if tuple(change.owner.split("/", 1)) in gone:
                await rt.api.patch("Node", "", change.node, change.patch())
    for job in flatten(idx.mljobs):
        if (job.namespace, job.policy) not in gone:
            continue
        statefulsets = list(idx.statefulsets.get(job.key, ()))
        counts = {s.role: s.replicas for s in statefulsets}
        for sts in statefulsets:
            if sts.pool is not None:
                plan = plan_statefulset(job, sts.role, sts, counts, rt.pod_settings, None)
                if plan is not None:
                    await execute(rt.api, plan)
        if job.group is not None:
            rt.records.enqueue("MLJob", job.namespace, job.name, uid=job.uid,
                               fields={"group": None, "groupSince": None})
        rt.groups.pop(job.key, None)


async def release_legacy_finalizer(rt: Runtime, kind: str, body: Mapping[str, Any]) -> None:
    """Objects made under an earlier operator carry kopf's finalizer (their deletion would hang
    whenever no operator runs) and its annotations (the whole spec, once): remove them."""
    meta = body["metadata"]
    ops: list[dict[str, Any]] = []
    finalizers = list(meta.get("finalizers") or ())
    if LEGACY_FINALIZER in finalizers:
        at = finalizers.index(LEGACY_FINALIZER)
        # `test` first: if the list changed meanwhile, the patch fails instead of removing
        # someone else's finalizer.
        ops += [{"op": "test", "path": f"/metadata/finalizers/{at}", "value": LEGACY_FINALIZER},
                {"op": "remove", "path": f"/metadata/finalizers/{at}"}]
    for name in LEGACY_ANNOTATIONS:
        if name in (meta.get("annotations") or {}):
            ops.append({"op": "remove", "path": "/metadata/annotations/" + name.replace("/", "~1")})
    if ops:
        await rt.api.patch(kind, meta.get("namespace", ""), meta["name"], ops, patch_type="json")


async def reconcile_children(rt: Runtime, body: Mapping[str, Any], idx: Indexes,
                             patch: MutableMapping[str, Any]) -> None:
    """On create, resume and spec changes: the Service and StatefulSets exist and their pod
    templates match the spec; then the lifecycle (a suspend shows at once, not at the next tick).

    A child the API server refuses (an invalid pod template, say) fails the job with the
    server's message until the spec is fixed; kopf retries only transient errors.
    """
    job = job_record(body)
    rejected, waiting, over_quota, created = None, None, None, False
    if job.error is None:
        existing = list(idx.statefulsets.get(job.key, ()))
        # A job about to be given capacity: is it sure its pods will be created? Asked beside
        # the creation of its children (no latency added), held from admission meanwhile.
        check = preflight.begin(rt, job) if (
            _waiting_for_capacity(job, existing) and not rt.preflight.checked(job)) else None
        try:
            await _create_children(rt, body, job, existing)
            created = True
        except KubeError as err:
            if not err.rejected:
                raise
            rejected = err.message
        except WaitingForOldChildren as err:
            waiting = err  # the lifecycle still shows the job (Pending); then retried
        except ChildOverQuota as err:
            over_quota = err  # the lifecycle shows why (WaitingForQuota); then retried
        finally:
            if check is not None:
                await check
    await sync_lifecycle(rt, body, idx, patch, rejected=rejected,
                         over_quota=str(over_quota) if over_quota else None, created=created)
    if waiting is not None or over_quota is not None:
        raise waiting or over_quota  # type: ignore[misc]


def _waiting_for_capacity(job: JobRecord, statefulsets: list[StsRecord]) -> bool:
    """Not running and not meant to (no replicas yet, or given back), and could be admitted."""
    return (job.error is None and not job.suspend and not job.final
            and not any(s.replicas for s in statefulsets))


async def _pods_verdict(rt: Runtime, job: JobRecord, seen: lifecycle.Observed) -> str | None:
    """Whether the API server would refuse the job's pods, asked again when a refusal is old
    (what refused it is not watched) or when the pods of a job given capacity are all refused;
    such a job gives its capacity back (its policy's next round would have taken it, a day
    later under a daily interval)."""
    if job.error is not None or job.suspend or job.final:
        return None
    book = rt.preflight
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
        rt.reservations.release(job.key)
        rt.placements.forget(job.key)
        await execute_all(rt.api, scale_to_zero_plan(seen.statefulsets, job.namespace))
        rt.wakeups.signal((job.namespace, job.policy), "admission")
        await rt.recorder.emit(ObjectRef("MLJob", job.namespace, job.name, job.uid), "Normal",
                               "Released", "gave back " + ", ".join(f"{n} {r}" for r, n in held.items())
                               + ": the API server refuses to create its pods")
        seen.statefulsets = [dataclasses.replace(s, replicas=0) for s in seen.statefulsets]
    return refusal


async def _create_children(rt: Runtime, body: Mapping[str, Any], job: JobRecord,
                           existing: list[StsRecord]) -> None:
    # The StatefulSets first (both at once), then the Service (services.py says why, and
    # how a job whose StatefulSets all exist is known to have it with no call per job).
    complete = {s.role for s in existing} >= set(roles_of(job))
    created = [f"StatefulSet {name}"
               for name in await ensure_statefulsets(rt.api, job, existing, rt.pod_settings)]
    if not complete or not await rt.services.exists(rt.api, job):
        refused = rt.services.refused(job)
        try:
            if await ensure_service(rt.api, job):
                created.insert(0, f"Service {job.name}")
        except Exception:
            rt.services.failed(job)
            raise
        rt.services.note(job)
        if refused:  # held from admission until now; its StatefulSets were there already
            rt.wakeups.signal((job.namespace, job.policy), "admission")
    if created:
        await rt.recorder.emit(_ref(body), "Normal", "Created",
                               f"{', '.join(created)}; waiting for SchedulingPolicy "
                               f"{job.policy!r} to allocate")
    # The template was edited (a generation of this job reconciled before in this process):
    # one this operator has decided for may have been scaled past what the index shows, so
    # its StatefulSets are read. Otherwise (created, resumed) the index says whether anything
    # is to do, with no call when nothing is. Not while a step applies a decision for the job
    # (one planned before the edit would put the old template back after this refresh).
    edited = rt.reconciled.get(job.key, ("",))[0] == job.uid
    read_first = edited and rt.placements.of(job.key) is not None
    if existing and (read_first or refresh_plan(job, existing, rt.pod_settings)):
        await rt.placements.settled(job.key)
        await refresh_templates(rt.api, job, existing, rt.pod_settings, read_first=read_first)


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
        rt.recorder.in_background(_emit_in_order(rt, _ref(body), outcome.events))
    if outcome.scale_to_zero:
        await execute_all(rt.api, scale_to_zero_plan(statefulsets, job.namespace))
        rt.reservations.release(job.key)
        rt.placements.forget(job.key)
    if outcome.delete_job:
        await rt.recorder.emit(_ref(body), "Normal", "TTLExpired",
                               "ttlSecondsAfterFinished has passed; deleting the MLJob")
        await rt.api.delete("MLJob", job.namespace, job.name, uid=job.uid)
    return outcome


async def _emit_in_order(rt: Runtime, ref: ObjectRef,
                         events: list[tuple[str, str, str]]) -> None:
    for type_, reason, message in events:
        await rt.recorder.emit(ref, type_, reason, message)


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
        rt.failures.observe(job.key, pod.uid, pod.restarts, pod.last_exit_zero, pod.name,
                            pod.last_failure)
    seen.cannot_start = sorted([(p.name, p.stuck) for p in pods if p.stuck and not p.deleting]
                               + await stuck_creating(rt, job.key, job.namespace, pods)
                               + await claims_unmade(rt, job.key, job.namespace, pods))
    refused = [p for p in pods if p.unschedulable and not p.deleting]
    if refused:  # refused where a pod of ours is leaving: the plan at work (displacement.py)
        at = time.time()
        vacating = rt.vacating.nodes(idx.pods, rt.placements.of, rt.refusals.settling(at), at,
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
        seen.waiting_for = rt.waiting.get(job.key)
    seen.failures = rt.failures.total(job.key)
    seen.last_failure = rt.failures.last(job.key)
    seen.workers_completed = sum(1 for p in pods if p.role == "worker" and p.completed
                                 and not p.deleting)
    replicas = {s.role: s.replicas for s in seen.statefulsets}
    seen.pods_ready = Counter(p.role for p in pods if p.ready and not p.deleting
                              and p.ordinal < replicas.get(p.role, 0))
    seen.epochs_done = rt.epochs_done(job)
    seen.policy_exists = bool(list(idx.policies.get((job.namespace, job.policy), ())))
    seen.created_s = job.created_s or None
    return lifecycle.evaluate(spec, job.generation, status, seen)


async def on_pod_event(rt: Runtime, event_type: str | None, body: Mapping[str, Any],
                       idx: Indexes) -> None:
    """Count failures, and pin a new gated pod to the node its ordinal was given (pods are
    created by the StatefulSet controller after the round that scaled them up has finished)."""
    pod = pod_record(body)
    if pod is None:
        return
    meta = body.get("metadata", {})
    namespace, job_name = meta.get("namespace", ""), meta["labels"][JOB_LABEL]
    key = (namespace, job_name)
    rt.failures.observe(key, pod.uid, pod.restarts, pod.last_exit_zero, pod.name,
                        pod.last_failure)
    if not rt.leadership.leading:
        return  # the leader's first round pins what is gated
    if rt.pod_states.changed(pod, gone=event_type == "DELETED"):
        rt.lifecycle_due.mark(key)  # its phase and conditions follow the pod now
    job = idx.job(namespace, job_name)
    if (event_type != "DELETED" and job is not None
            and displacement.refused_there(pod, pod.pinned or "")):
        # kube-scheduler refuses it where it was pinned: the admission step woken here places
        # it again (displacement.py).
        rt.wakeups.signal((namespace, job.policy), "admission")
    if event_type == "DELETED" or pod.deleting or not pod.gated:
        rt.pinned.pop(pod.uid, None)
        return
    node = rt.placements.node_for(key, pod.role, pod.ordinal)
    if node is None:
        # After an operator restart, before the policy's first round: the last decision
        # recorded in the job's status.
        decided = ((job.placement or {}).get(pod.role) or ()) if job and job.schedulable else ()
        node = decided[pod.ordinal] if pod.ordinal < len(decided) else None
    if node is None or rt.pinned.get(pod.uid) == node:
        return  # not decided yet (it stays gated until a round gives its ordinal a node)
    if job is not None and refused_by(rt, idx, job, pod.role, node):
        # Drained, deleted, tainted since: pinned there it would stay Pending. It stays gated;
        # the admission step woken here places it again (displacement.py).
        rt.wakeups.signal((namespace, job.policy), "admission")
        return
    if pod.pinned not in (None, node):
        action: PinPod | DeletePod = DeletePod(namespace, pod.name, pod.uid, pod.role,
                                               pod.ordinal, node, pod.pinned)
    else:
        action = PinPod(namespace, pod.name, pod.uid, pod.role, pod.ordinal, node)
        rt.pinned[pod.uid] = node
    try:
        await execute(rt.api, action)
    except Exception:
        rt.pinned.pop(pod.uid, None)
        raise
    log.info("MLJob %s/%s: %s %s on %s", namespace, job_name,
             "pinned" if isinstance(action, PinPod) else "recreating", pod.name, node)


def refused_by(rt: Runtime, idx: Indexes, job: JobRecord, role: str, node: str) -> str | None:
    """Why `node` would refuse a new pod of the job's role now (displacement.refusal)."""
    found = values(idx.nodes, node)
    return displacement.refusal(found[0] if found else None,
                                job.node_constraints.get(role, EVERY_NODE),
                                rt.config.node_selector, rt.config.tolerated_taints)


async def restore_replicas(rt: Runtime, event_type: str | None, body: Mapping[str, Any],
                           idx: Indexes) -> bool:
    """A StatefulSet of ours whose replicas differ from the last decision (scaled by hand, or
    recreated after a deletion) is scaled back at once, not at the next round. True if so."""
    if event_type not in ("ADDED", "MODIFIED"):
        return False
    record = sts_record(body)
    meta = body.get("metadata", {})
    job = idx.job(meta.get("namespace", ""), (meta.get("labels") or {}).get(JOB_LABEL, ""))
    decided = rt.placements.of(job.key) if job is not None else None
    if job is None or decided is None or not job.schedulable or meta.get("deletionTimestamp") \
            or rt.preflight.refusal(job) is not None:
        return False  # not decided by this operator yet, or suspended/finished/refused: the lifecycle owns it
    if rt.placements.being_applied(job.key):
        return False  # the event predates the decision's own patches, still in flight
    want = len(decided.get(record.role, ()))
    if record.replicas == want:
        return False
    # The event may still predate the decision's patches, answered since: what is there now?
    found = await rt.api.get("StatefulSet", job.namespace, record.name)
    if found is None or found.get("metadata", {}).get("deletionTimestamp"):
        return False
    current = sts_record(found)
    if current.replicas == want:
        return False
    # Scaled back with the template of the decided counts: one recreated after a deletion has
    # the template of none (no peers in its environment), and its pods would have run so.
    counts = {role: len(nodes) for role, nodes in decided.items()}
    pool = current.pool or next((s.pool for s in idx.statefulsets.get(job.key, ()) if s.pool), None)
    plan = plan_statefulset(job, record.role, current, counts, rt.pod_settings, pool)
    await execute(rt.api, plan)
    await rt.recorder.emit(ObjectRef("MLJob", job.namespace, job.name, job.uid), "Normal", "Restored",
                           f"StatefulSet {record.name} had {current.replicas} replicas; "
                           f"scaled back to the {want} its policy decided"
                           + (", its pod template rendered for them" if plan.template else ""))
    return True


async def on_service_deleted(rt: Runtime, body: Mapping[str, Any], idx: Indexes) -> bool:
    """A job's headless Service deleted by hand took its pods' DNS names with it (peers stop
    finding each other): it is created again now, not never. True if so. The Service of a
    deleted job goes with it (garbage collection), and is not."""
    meta = body.get("metadata") or {}
    job = idx.job(meta.get("namespace", ""), (meta.get("labels") or {}).get(JOB_LABEL, ""))
    if job is None or controller_uid(meta) != job.uid:
        return False  # its job is gone, or it was an earlier job's of the name
    rt.services.forget(job.key)
    live = await rt.api.get("MLJob", job.namespace, job.name)  # the index may lag a deletion
    if live is None or live["metadata"].get("uid") != job.uid \
            or live["metadata"].get("deletionTimestamp"):
        return False
    try:
        return await restore_service(rt, job)
    except Exception as err:  # noqa: BLE001 - the lifecycle sweep tries again
        log.warning("MLJob %s/%s: recreating its Service: %s", *job.key, err)
        return False


async def restore_service(rt: Runtime, job: JobRecord) -> bool:
    """Create the Service of a job whose children this process reconciled when it is known
    to be gone (`on_service_deleted`); True if created now. A job not reconciled yet gets it
    from `reconcile_children`; a finished one has no pods to name. A failure is not a refusal
    (services.py): the job keeps running, and the next sweep tries again."""
    if job.finished or rt.reconciled.get(job.key) != (job.uid, job.generation) \
            or await rt.services.exists(rt.api, job):
        return False
    created = await ensure_service(rt.api, job)
    rt.services.note(job)
    if created:
        await rt.recorder.emit(ObjectRef("MLJob", job.namespace, job.name, job.uid), "Normal",
                               "Restored", f"Service {job.name} was deleted; created again, so "
                               f"that the job's pods find their peers by its DNS names")
    return created


def unscheduled(rt: Runtime, key: JobKey, pods: list[PodRecord]) -> list[tuple[str, str]]:
    """(pod, why) for the job's pods that were pinned and ungated at least
    `scheduler_grace_seconds` ago and that no scheduler has acted on since: not bound, no
    Unschedulable verdict. A template naming a scheduler that does not run here (a Volcano
    template brought along) left its pods `SchedulingGated` in `kubectl get` and the job
    PodsStarting forever, its GPUs held."""
    now, grace = time.monotonic(), rt.config.scheduler_grace_seconds
    out = []
    clocks = rt.unseen_since.get(key, {})
    kept: dict[str, float] = {}  # only the pods waiting now: the others' clocks go
    for p in pods:
        if not (p.pinned and not p.gated and not p.bound and p.unseen and not p.deleting
                and p.unschedulable is None
                and not p.claims_unmade):  # kube-scheduler waits for its claims: claims_unmade
            continue
        since = kept[p.uid] = clocks.get(p.uid, now)
        if now - since < grace:
            continue
        if p.gates:  # a gate of the template's own (another controller's), still on it
            out.append((p.name, f"it still carries the scheduling gate "
                                f"{', '.join(p.gates)} {now - since:.0f} s after it was placed "
                                f"on {p.pinned}: no scheduler looks at it until whatever put "
                                f"that gate in the template removes it"))
            continue
        who = ("kube-scheduler (default-scheduler)" if p.scheduler == DEFAULT_SCHEDULER
               else f"its scheduler {p.scheduler!r} (spec.schedulerName)")
        hint = ("is it running?" if p.scheduler == DEFAULT_SCHEDULER else
                "is it running in this cluster? Without spec.schedulerName, kube-scheduler "
                "binds it")
        out.append((p.name, f"{who} has not acted on it in {now - since:.0f} s since it "
                            f"was placed on {p.pinned}: {hint}"))
    if kept:
        rt.unseen_since[key] = kept
    else:
        rt.unseen_since.pop(key, None)
    return out


#: How often a pod still waiting for its containers is asked again why (its Warning Events),
#: once `creating_grace_seconds` have passed.
CREATING_RECHECK_S = 30.0
#: The kubelet's Event reasons for a pod whose containers it cannot create.
CREATING_FAILURES = frozenset({"FailedMount", "FailedAttachVolume", "FailedMapVolume",
                               "FailedCreatePodSandBox"})


async def stuck_creating(rt: Runtime, key: JobKey, namespace: str,
                         pods: list[PodRecord]) -> list[tuple[str, str]]:
    """(pod, "FailedMount: MountVolume.SetUp failed for volume ...") for a pod of the job whose
    containers have been waiting to be created for `creating_grace_seconds` while the kubelet reports
    why it cannot create them. A ConfigMap or Secret volume that does not exist looks like
    this: the pod shows `ContainerCreating` for ever (only its FailedMount Events say why),
    the job said PodsStarting and held its GPUs."""
    waiting = [p for p in pods if p.creating and not p.deleting]
    return await _warned(rt, key, namespace, waiting, rt.creating_since, rt.creating_checks,
                         rt.config.creating_grace_seconds, CREATING_FAILURES)


#: How long a pod may wait for the ResourceClaims made from its templates before its Events are
#: read: kube-controller-manager makes them within a second of the pod.
CLAIMS_GRACE_S = 5.0
CLAIM_FAILURES = frozenset({"FailedResourceClaimCreation"})


async def claims_unmade(rt: Runtime, key: JobKey, namespace: str,
                        pods: list[PodRecord]) -> list[tuple[str, str]]:
    """(pod, "FailedResourceClaimCreation: ... exceeded quota ...") for a pod of the job whose
    ResourceClaims (from its templates' ResourceClaimTemplates) kube-controller-manager has
    failed to make for CLAIMS_GRACE_S: kube-scheduler does not look at the pod until they
    exist and says nothing, so only the pod's Events say why (a quota on claims, a webhook).
    Such pods sat Pending for good while the job said AllRolesReady on its minimum."""
    waiting = [p for p in pods if p.claims_unmade and not p.deleting]
    return await _warned(rt, key, namespace, waiting, rt.claims_since, rt.claims_checks,
                         CLAIMS_GRACE_S, CLAIM_FAILURES)


async def _warned(rt: Runtime, key: JobKey, namespace: str, waiting: list[PodRecord],
                  since: dict[JobKey, dict[str, float]],
                  checks: dict[JobKey, tuple[float, str, str | None]], grace: float,
                  reasons: frozenset[str]) -> list[tuple[str, str]]:
    """(pod, "<reason>: <message>") from the latest Warning Event with one of `reasons` of a
    `waiting` pod that has waited `grace` seconds (`since`: per job, when each was first seen
    waiting); the Events are read once per CREATING_RECHECK_S (`checks`: per job, the latest
    read: when, which pod, why or None), not every sweep."""
    now = time.monotonic()
    clocks = since.get(key, {})
    kept = {p.uid: clocks.get(p.uid, now) for p in waiting}
    if kept:  # only the pods still waiting: the others' clocks go
        since[key] = kept
    else:
        since.pop(key, None)
    overdue = [p for p in waiting if now - kept[p.uid] >= grace]
    if not overdue:
        checks.pop(key, None)
        return []
    checked = checks.get(key)
    if checked is None or now - checked[0] >= CREATING_RECHECK_S \
            or checked[1] not in {p.name for p in overdue}:
        pod, why = overdue[0], None
        try:
            events = await rt.api.pod_warnings(namespace, pod.name)
        except KubeError as err:
            log.warning("MLJob %s/%s: cannot read the Events of pod %s: %s", *key, pod.name, err)
            events = []
        failures = [e for e in events if e.get("reason") in reasons]
        if failures:
            why = f"{failures[-1]['reason']}: {failures[-1].get('message', '')}"
        checked = (now, pod.name, why)
        checks[key] = checked
    _, name, why = checked
    return [(name, why)] if why else []


#: How long a StatefulSet may have fewer pods than replicas before its FailedCreate Events are
#: read: the controller creates a new allocation's pods within a second or two.
REFUSAL_GRACE_S = 5.0


async def pods_refused(rt: Runtime, job: JobRecord, statefulsets,
                       pods: Iterable[PodRecord]) -> str | None:
    """Why the API server refuses to create the job's pods (a missing ServiceAccount, Pod
    Security, a LimitRange, an admission webhook: only the StatefulSet's `FailedCreate` Events
    say), once a StatefulSet has stayed short of its replicas, with no pod created, for
    REFUSAL_GRACE_S; None otherwise. Without it the job waited "PodsStarting" while its
    capacity stayed reserved. Not while the StatefulSet controller has yet to act on the
    latest scaling, and each pod it gains starts the grace period again: in a burst of new
    jobs its queue is long, and its Events were read 146 times for 200 jobs, none refused
    (bench_e2e). Its pods are counted from the pod watch too (`pods`): the controller's status
    counts only the pods it had seen when its sync began, so right after creating them it
    still shows none."""
    now = time.monotonic()
    found = None
    seen_pods: Counter[str] | None = None  # counted only for a StatefulSet short by its status
    for sts in statefulsets:
        key = (job.key, sts.name)
        if sts.created < sts.replicas and sts.observed and seen_pods is None:
            seen_pods = Counter(p.role for p in pods if not p.deleting)
        created = max(sts.created, seen_pods.get(sts.role, 0) if seen_pods else 0)
        if created >= sts.replicas or not sts.observed:
            rt.short_since.pop(key, None)
            continue
        since, before = rt.short_since.get(key, (now, created))
        if created > before:  # progress since: not refused (not all of it, anyway)
            since = now
        rt.short_since[key] = (since, created)
        if found is None and now - since >= REFUSAL_GRACE_S:
            try:
                events = await rt.api.failed_creates(job.namespace, sts.name)
            except KubeError as err:
                log.warning("MLJob %s/%s: cannot read the Events of %s: %s", *job.key, sts.name, err)
                continue
            if events:
                found = f"{sts.name}: {events[-1].get('message', 'FailedCreate')}"
    return found
