"""kopf event handlers: decorators and wiring only; the work is in jobs.py, pod_events.py,
scheduling/loop.py and friends. The watched kinds and their indexes are in watched.py
(`WATCHED`: every watched kind's events are noted, and those of kinds that wake every policy's
admission step handled, by the handlers registered from it below), startup and cleanup in
startup.py (both registered with kopf when this module is imported).

Run with `python -m mlsched.controller` (see __main__.py) or
`kopf run --standalone -m mlsched.controller.app.handlers` (settings from MLSCHED_* variables).

- Indexes keep compact records of nodes, our pods, other pods' requests per node, our
  StatefulSets, MLJobs and SchedulingPolicies: a round reads memory, never re-lists.
- One task per SchedulingPolicy runs its scheduling loop (supervision.py: started and stopped
  from watch events, so no finalizer is needed); it wakes early for an admission step when a
  job's StatefulSets appear or one of our pods goes away (capacity freed), and for a full
  round when the policy's spec is edited (a new generation). A StatefulSet scaled or
  recreated by hand is scaled back to the decided replicas (with their template) at once;
  not while the decision's own patches are in flight (pod_events.restore_replicas).
- MLJobs: a watch-event handler creates the children of each new generation; one sweep over
  all jobs keeps the lifecycle (phase, conditions, suspend, deadline, backoff, cleanup, TTL)
  current. No kopf change handler, timer or daemon: those need finalizers and annotations.
- A pod event handler pins gated pods created between rounds.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import kopf

from mlsched.controller.scheduling import displacement
from mlsched.controller.constraints import dra
from mlsched.controller.app import jobs, pod_events
from mlsched.controller.objects import preflight
from mlsched.controller.kube.constants import JOB_LABEL
from mlsched.controller.objects.records import node_record
from mlsched.controller.objects.quantities import is_active_pod
from mlsched.controller.scheduling.runtime import Runtime

from mlsched.controller.app.watched import DRA, EVERY_ADMISSION, INDEXED, MLJOBS, POLICIES, WATCHED
from mlsched.controller.app.startup import runtime, wake_all_admissions


async def watch_noted(event: kopf.RawEvent, body: kopf.Body, resource: kopf.Resource,
                      memo: kopf.Memo, **kwargs: Any) -> None:
    """Every event of an indexed resource, noted to find what a listing again leaves out."""
    relists = memo.get("relists")
    if relists is not None and resource.plural in INDEXED:
        relists.note(resource.plural, event.get("type"), body,
                     [kwargs[name] for name in INDEXED[resource.plural][2]])


async def wake_every_admission(memo: kopf.Memo, **_: Any) -> None:
    """A kind whose change may let waiting jobs fit or be planned (watched.EVERY_ADMISSION):
    a LimitRange's defaults lowered or removed (raised: the larger requests are decided at
    the next step, which needs no wake-up of its own); the globalDefault PriorityClass set,
    moved or removed (the pods of templates naming no class count against other scoped
    quotas; whether a class was the default before an edit or deletion is not in the event,
    and classes change rarely); a RuntimeClass created or changed; devices published, a
    DeviceClass or claim template created or changed. Every policy's waiting jobs get an
    admission step now, not at their next round."""
    wake_all_admissions(runtime(memo).scheduling)


for _kind in WATCHED:  # in the table's order: each kind's events noted first
    kopf.on.event(*_kind.resource)(watch_noted)
    if _kind.wakes == EVERY_ADMISSION:
        kopf.on.event(*_kind.resource)(wake_every_admission)


@kopf.on.event(*POLICIES)
async def policy_event(event: kopf.RawEvent, body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    """Start a policy's loop when it is first seen, stop it when it is deleted; an edited
    algorithm, model or interval takes effect now, not after the old interval."""
    rt = runtime(memo)
    key = (body["metadata"].get("namespace", ""), body["metadata"]["name"])
    if event.get("type") == "DELETED":
        rt.scheduling.policy_loops.stop(key)
        return
    if rt.process.leadership.leading:
        await jobs.release_legacy_finalizer(rt, "SchedulingPolicy", body)
    if rt.scheduling.policy_loops.observe(body):
        rt.scheduling.wakeups.signal(key, "policy")


@kopf.on.event("nodes")
async def node_event(event: kopf.RawEvent, body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    """A node whose record (what planning reads: allocatable, Ready, cordon, taints, labels)
    changed, or that was deleted, wakes admission: new capacity admits waiting jobs, lost
    capacity displaces tasks; a kubelet's heartbeat changes none of it and wakes nothing."""
    rt = runtime(memo)
    name = body["metadata"]["name"]
    if event.get("type") == "DELETED":
        # Its jobs' tasks are placed again (displacement.py) once their pods are gone.
        rt.cluster.node_states.pop(name, None)
        wake_all_admissions(rt.scheduling)
        return
    record = node_record(body)
    if rt.cluster.node_states.get(name) != record:
        rt.cluster.node_states[name] = record
        wake_all_admissions(rt.scheduling)


@kopf.on.event("pods", labels={JOB_LABEL: kopf.ABSENT})
async def foreign_pod_event(event: kopf.RawEvent, body: kopf.Body, memo: kopf.Memo,
                            **_: Any) -> None:
    """Another workload's pod on a node ended or went: its requests are free again."""
    if (body.get("spec") or {}).get("nodeName") and (
            event.get("type") == "DELETED" or not is_active_pod(body)):
        wake_all_admissions(runtime(memo).scheduling)


@kopf.on.event("resourcequotas")
async def quota_event(event: kopf.RawEvent, body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    """A quota raised, or its usage recounted after pods went: waiting jobs may fit it now,
    and jobs whose children it had no room for are tried again at the next sweep."""
    rt = runtime(memo)
    namespace = (body.get("metadata") or {}).get("namespace")
    for key in [k for k in rt.jobs.books.over_quota if k[0] == namespace]:
        del rt.jobs.books.over_quota[key]
    wake_all_admissions(rt.scheduling)


@kopf.on.event("namespaces")
async def namespace_event(event: kopf.RawEvent, body: kopf.Body, memo: kopf.Memo,
                          **_: Any) -> None:
    """A namespace relabelled (Pod Security's enforce level, a label a ValidatingAdmissionPolicy
    selects on): its jobs whose pods the API server refused are asked again now, not at their
    next recheck 30 s later (preflight.py)."""
    rt = runtime(memo)
    name = body["metadata"]["name"]
    if event.get("type") == "DELETED":
        rt.cluster.namespace_labels.pop(name, None)
        return
    labels = dict(body["metadata"].get("labels") or {})
    before = rt.cluster.namespace_labels.get(name)
    rt.cluster.namespace_labels[name] = labels
    if before is not None and before != labels and rt.process.leadership.leading:
        await preflight.namespace_relabelled(rt, name)


@kopf.on.event(*DRA, "resourceclaims")
async def resource_claim_event(event: kopf.RawEvent, body: kopf.Body, memo: kopf.Memo,
                               **_: Any) -> None:
    """A claim gone (its pod deleted before), or one made by hand deallocated once its pod
    completed (the claim stays): its devices are free for waiting jobs. (A claim being made
    is unallocated too until kube-scheduler allocates it: a wake that finds nothing more.)"""
    kind = event.get("type")
    if kind == "DELETED" or (kind == "MODIFIED" and dra.resource_claim_record(body) is None):
        wake_all_admissions(runtime(memo).scheduling)


def wake_admission(rt: Runtime, namespace: str, job_name: str) -> None:
    """Wake the admission of the job's policy; of the policy it had, for a job deleted since
    (its pods go after it, and their going is what frees its capacity: the waiting jobs of its
    policy used to wait for the next round)."""
    job = rt.cluster.indexes.job(namespace, job_name) if rt.cluster.indexes else None
    policy = job.policy if job is not None else rt.jobs.departed.get((namespace, job_name))
    if policy is not None:
        rt.scheduling.wakeups.signal((namespace, policy), "admission")


@kopf.on.event("apps", "v1", "statefulsets", labels={JOB_LABEL: kopf.PRESENT})
async def statefulset_event(event: kopf.RawEvent, body: kopf.Body, namespace: str,
                            labels: kopf.Labels, memo: kopf.Memo, **_: Any) -> None:
    rt = runtime(memo)
    if not rt.process.leadership.leading:
        return
    # Its pods rolled to a new revision (a rescale ends when they all have): the job's
    # conditions follow now, not at the next sweep.
    rt.jobs.due.mark((namespace, labels[JOB_LABEL]))
    # Scaled or recreated by hand: back to the decided replicas now, not at the next round.
    await pod_events.restore_replicas(rt, event.get("type"), body, rt.cluster.indexes)
    # A new job can be admitted once its StatefulSets exist (they are created on arrival).
    if event.get("type") == "ADDED":
        wake_admission(rt, namespace, labels[JOB_LABEL])


@kopf.on.event("services", labels={JOB_LABEL: kopf.PRESENT})
async def service_event(event: kopf.RawEvent, body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    """A job's Service deleted by hand comes back at once (pod_events.on_service_deleted)."""
    rt = runtime(memo)
    if event.get("type") == "DELETED" and rt.process.leadership.leading:
        await pod_events.on_service_deleted(rt, body, rt.cluster.indexes)


# ------------------------------------------------------------------------------ mljobs


@kopf.on.event(*MLJOBS)
async def mljob_event(event: kopf.RawEvent, body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    """Children for a new or edited job (a generation not reconciled yet); the lifecycle sweep
    (started at startup) keeps phase and conditions current and retries what failed here."""
    rt = runtime(memo)
    meta = body["metadata"]
    policy_key = (meta.get("namespace", ""),
                  (body.get("spec") or {}).get("schedulingPolicy") or "default")
    key = (policy_key[0], meta["name"])
    reconciled = rt.jobs.books.reconciled.get(key)
    # A spec edit of a job already decided: an admission step checks at once whether the
    # decision still fits the spec (loop.outgrown) and decides the job again if not.
    edited = (event.get("type") == "MODIFIED" and reconciled is not None
              and reconciled != (meta.get("uid"), int(meta.get("generation") or 0))
              and rt.scheduling.placements.of(key) is not None)
    if event.get("type") in ("ADDED", "DELETED") or edited:
        # Wake the policy now: its admission step then waits for the burst this job may be
        # part of, and for the children of every job in it (loop._quiet); a deleted job's
        # policy recounts its jobs (the capacity it held frees as its pods go, below).
        rt.scheduling.wakeups.signal(policy_key, "admission")
    previous = rt.jobs.books.job_bodies.get(key)
    before = ((previous.get("spec") or {}).get("schedulingPolicy") or "default") \
        if previous is not None else policy_key[1]
    if before != policy_key[1]:
        # Moved to another policy: the one it left recounts its jobs (and may admit others
        # into what the job held); it used to go on showing the job as its own.
        rt.scheduling.wakeups.signal((policy_key[0], before), "admission")
    await jobs.on_job_event(rt, event.get("type"), body, rt.cluster.indexes)


# -------------------------------------------------------------------------------- pods


@kopf.on.event("pods", labels={JOB_LABEL: kopf.PRESENT})
async def pod_event(event: kopf.RawEvent, body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    rt = runtime(memo)
    await pod_events.on_pod_event(rt, event.get("type"), body, rt.cluster.indexes)
    if event.get("type") == "DELETED":  # capacity freed (a job finished, was deleted, shrank)
        namespace = body["metadata"].get("namespace", "")
        job_name = body["metadata"].get("labels", {}).get(JOB_LABEL, "")
        wake_admission(rt, namespace, job_name)
        node = (body.get("spec") or {}).get("nodeName")
        if node:  # refusals there wait a while (displacement.py); then they are looked at again
            rt.pods.refusals.departed(node, time.time())
            asyncio.get_running_loop().call_later(
                displacement.DEPARTURE_SETTLE_S + 0.5, wake_admission, rt, namespace, job_name)
