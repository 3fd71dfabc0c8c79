"""What the MLJob handlers do, apart from kopf: a job's children (Service, StatefulSets) made
and kept, its status written, the lifecycle sweep and due jobs; its lifecycle evaluated in
job_lifecycle.py, pod, StatefulSet and Service events in pod_events.py.

Each function takes the Runtime, the object's body and the indexes, so tests call them with a
fake API and plain dicts; handlers.py only wires them to kopf's decorators.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping, MutableMapping
from typing import Any

from mlsched.controller.scheduling import pools
from mlsched.controller.objects import lifecycle, preflight
from mlsched.controller.objects.apply import (
    ChildOverQuota, WaitingForOldChildren, ensure_service, ensure_statefulsets, execute,
    refresh_plan, refresh_templates,
)
from mlsched.controller.kube.constants import LEGACY_ANNOTATIONS, LEGACY_FINALIZER
from mlsched.controller.objects.desired import plan_statefulset, roles_of
from mlsched.controller.kube.kube import STATUS_FIRST, STATUS_ROUTINE, STATUS_SOON, KubeError
from mlsched.controller.objects.records import StsRecord
from mlsched.controller.objects.job_records import JobRecord, job_record
from mlsched.controller.scheduling.runtime import Runtime
from mlsched.controller.scheduling.state import JobState
from mlsched.controller.scheduling.indexes import Indexes, JobKey, flatten
from mlsched.controller.process.supervision import key_of, plain

from mlsched.controller.app.job_lifecycle import job_ref, sync_lifecycle

log = logging.getLogger("mlsched.controller.app.jobs")



async def on_job_event(rt: Runtime, event_type: str | None, body: Mapping[str, Any],
                       idx: Indexes) -> None:
    """Every watch event of an MLJob: keep its latest body for the sweep, and create or refresh
    its children when this generation has not been reconciled yet."""
    key = key_of(body)
    if event_type == "DELETED":
        # Children go with the owner references; only the in-memory books need forgetting. The
        # capacity it held frees as its pods go (each pod's deletion wakes the admission of
        # the policy it had: rt.jobs.departed).
        rt.forget_job(key)
        rt.jobs.note_departed(key, (body.get("spec") or {}).get("schedulingPolicy") or "default")
        return
    # A body from before the operator's last status patch of the job shows that patch too
    # (written_status.py): its lifecycle must not decide the same change twice.
    body = rt.jobs.written_status.over(key, plain(body))
    rt.jobs.books.job_bodies[key] = body
    if not rt.process.leadership.leading:
        return  # a standby writes nothing; when it leads, the sweep reconciles every job
    await release_legacy_finalizer(rt, "MLJob", body)
    meta = body["metadata"]
    if not meta.get("deletionTimestamp") \
            and rt.jobs.books.reconciled.get(key) != (meta.get("uid"), int(meta.get("generation") or 0)):
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
    if rt.jobs.books.reconciled.get(job.key) == (job.uid, job.generation):
        return
    blocked = rt.jobs.books.over_quota.get(job.key)
    if blocked and blocked[:2] == (job.uid, job.generation) \
            and time.monotonic() - blocked[2] < OVER_QUOTA_RETRY_S:
        return  # not a create call per job per sweep while the quota stays full
    patch: dict[str, Any] = {}
    try:
        await reconcile_children(rt, body, idx, patch)
    except ChildOverQuota as err:
        # Waiting, not failing: the status says why (WaitingForQuota), an Event once.
        await write_status(rt, body, patch)
        rt.jobs.books.over_quota[job.key] = (job.uid, job.generation, time.monotonic())
        if rt.jobs.books.retrying.get(job.key) != str(err):
            rt.jobs.books.retrying[job.key] = str(err)
            await rt.writers.events.emit(job_ref(body), "Normal", "WaitingForQuota", str(err))
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
                      f"{rt.process.config.job_sync_seconds:g} s: {err}"
        if rt.jobs.books.retrying.get(job.key) != message:
            rt.jobs.books.retrying[job.key] = message
            await rt.writers.events.emit(job_ref(body), type_, reason, message)
        raise
    rt.jobs.books.retrying.pop(job.key, None)
    rt.jobs.books.over_quota.pop(job.key, None)
    rt.jobs.books.reconciled[job.key] = (job.uid, job.generation)
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
        rt.jobs.written_status.wrote(key, status)
        kept = rt.jobs.books.job_bodies.get(key)
        if kept is not None and kept is not body:
            # A watch event replaced the kept body while the patch was out: that body is
            # older than the patch (the next evaluation would decide the same change again).
            rt.jobs.books.job_bodies[key] = rt.jobs.written_status.over(key, kept)
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
    if job.key in rt.jobs.books.syncing:
        if prompt:  # looked at again once the evaluation under way ends
            rt.jobs.books.syncing[job.key] = True
            # Which may be waiting to write a change of counts, queued after every other
            # status patch: up to 10 s in a burst, while this job's pods had all turned Ready.
            rt.api.hurry_status("MLJob", *job.key)
        return False
    rt.jobs.books.syncing[job.key] = False
    try:
        if rt.jobs.books.reconciled.get(job.key) != (job.uid, job.generation):
            await reconcile_if_needed(rt, body, idx)
            return True
        patch: dict[str, Any] = {}
        outcome = await sync_lifecycle(rt, body, idx, patch)
        if (prompt and patch.get("status") and not outcome.events
                and lifecycle.only_counts(body.get("status") or {}, patch["status"])
                and counts_wait(rt.jobs, job.key)):
            return True
        rt.jobs.books.counts_due.pop(job.key, None)
        await write_status(rt, body, patch)
        return True
    finally:
        # Marked due while this evaluation was under way (a child's create or a status patch
        # can wait seconds in a burst): its pods may have changed since it read them. It used
        # to be marked again at once, and again, every 0.3 s until this one ended (13,789
        # evaluations that did nothing in bench_e2e's 300-job burst).
        if rt.jobs.books.syncing.pop(job.key, False):
            rt.jobs.due.mark(job.key)


def counts_wait(jobs: JobState, key: JobKey) -> bool:
    """Whether the job's change of counts alone may wait: the first such change waits
    COUNTS_DELAY_S (the job is marked due again then), later ones until that time."""
    loop = asyncio.get_running_loop()
    deadline = jobs.books.counts_due.get(key)
    if deadline is None:
        jobs.books.counts_due[key] = loop.time() + COUNTS_DELAY_S
        loop.call_later(COUNTS_DELAY_S, jobs.due.mark, key)
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
            body = rt.jobs.books.job_bodies.get(key)
            if body is None:
                return
            try:  # if another evaluation of the job is under way, it marks it due after
                await sync_job(rt, body, rt.cluster.indexes, prompt=True)
            except Exception as err:  # noqa: BLE001 - the sweep tries again
                log.warning("MLJob %s/%s: %s", *key, err)

    running: set[asyncio.Task] = set()
    while True:
        for key in await rt.jobs.due.take():
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
    await sync_batches(rt, list(rt.jobs.books.job_bodies.values()), idx)
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
    for key in list(rt.scheduling.orphans):
        if key in policies or key not in named:
            del rt.scheduling.orphans[key]
    gone = set()
    for key in named - policies:
        first = rt.scheduling.orphans.setdefault(key, now)
        if now - first >= grace_s:
            gone.add(key)
    if rt.process.config.label_nodes:
        for change in pools.orphaned_labels(flatten(idx.nodes), policies, rt.process.config.namespaces):
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
            rt.writers.status.enqueue("MLJob", job.namespace, job.name, uid=job.uid,
                                      fields={"group": None, "groupSince": None})
        rt.scheduling.groups.pop(job.key, None)


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
            _waiting_for_capacity(job, existing) and not rt.jobs.preflight.checked(job)) else None
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


async def _create_children(rt: Runtime, body: Mapping[str, Any], job: JobRecord,
                           existing: list[StsRecord]) -> None:
    # The StatefulSets first (both at once), then the Service (services.py says why, and
    # how a job whose StatefulSets all exist is known to have it with no call per job).
    complete = {s.role for s in existing} >= set(roles_of(job))
    created = [f"StatefulSet {name}"
               for name in await ensure_statefulsets(rt.api, job, existing, rt.pod_settings)]
    if not complete or not await rt.scheduling.services.exists(rt.api, job):
        refused = rt.scheduling.services.refused(job)
        try:
            if await ensure_service(rt.api, job):
                created.insert(0, f"Service {job.name}")
        except Exception:
            rt.scheduling.services.failed(job)
            raise
        rt.scheduling.services.note(job)
        if refused:  # held from admission until now; its StatefulSets were there already
            rt.scheduling.wakeups.signal((job.namespace, job.policy), "admission")
    if created:
        await rt.writers.events.emit(job_ref(body), "Normal", "Created",
                                     f"{', '.join(created)}; waiting for SchedulingPolicy "
                                     f"{job.policy!r} to allocate")
    # The template was edited (a generation of this job reconciled before in this process):
    # one this operator has decided for may have been scaled past what the index shows, so
    # its StatefulSets are read. Otherwise (created, resumed) the index says whether anything
    # is to do, with no call when nothing is. Not while a step applies a decision for the job
    # (one planned before the edit would put the old template back after this refresh).
    edited = rt.jobs.books.reconciled.get(job.key, ("",))[0] == job.uid
    read_first = edited and rt.scheduling.placements.of(job.key) is not None
    if existing and (read_first or refresh_plan(job, existing, rt.pod_settings)):
        await rt.scheduling.placements.settled(job.key)
        await refresh_templates(rt.api, job, existing, rt.pod_settings, read_first=read_first)
