"""What the pod, StatefulSet and Service handlers do for a job, apart from kopf: a pod of
ours pinned to its decided node when the scheduler may place it (`on_pod_event`), a
StatefulSet scaled by hand scaled back (`restore_replicas`), a deleted headless Service
created again (`on_service_deleted`, `restore_service`)."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from mlsched.controller.scheduling import displacement
from mlsched.controller.objects.apply import ensure_service, execute
from mlsched.controller.kube.constants import JOB_LABEL
from mlsched.controller.objects.desired import DeletePod, PinPod, plan_statefulset
from mlsched.controller.kube.events import ObjectRef
from mlsched.controller.constraints.node_constraints import EVERY_NODE
from mlsched.controller.objects.records import controller_uid, pod_record, sts_record
from mlsched.controller.objects.job_records import JobRecord
from mlsched.controller.scheduling.runtime import Runtime
from mlsched.controller.scheduling.indexes import Indexes, values

log = logging.getLogger("mlsched.controller.app.pod_events")


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
    rt.scheduling.failures.observe(key, pod.uid, pod.restarts, pod.last_exit_zero, pod.name,
                        pod.last_failure)
    if not rt.process.leadership.leading:
        return  # the leader's first round pins what is gated
    if rt.pods.states.changed(pod, gone=event_type == "DELETED"):
        rt.jobs.due.mark(key)  # its phase and conditions follow the pod now
    job = idx.job(namespace, job_name)
    if (event_type != "DELETED" and job is not None
            and displacement.refused_there(pod, pod.pinned or "")):
        # kube-scheduler refuses it where it was pinned: the admission step woken here places
        # it again (displacement.py).
        rt.scheduling.wakeups.signal((namespace, job.policy), "admission")
    if event_type == "DELETED" or pod.deleting or not pod.gated:
        rt.pods.pinned.pop(pod.uid, None)
        return
    node = rt.scheduling.placements.node_for(key, pod.role, pod.ordinal)
    if node is None:
        # After an operator restart, before the policy's first round: the last decision
        # recorded in the job's status.
        decided = ((job.placement or {}).get(pod.role) or ()) if job and job.schedulable else ()
        node = decided[pod.ordinal] if pod.ordinal < len(decided) else None
    if node is None or rt.pods.pinned.get(pod.uid) == node:
        return  # not decided yet (it stays gated until a round gives its ordinal a node)
    if job is not None and refused_by(rt, idx, job, pod.role, node):
        # Drained, deleted, tainted since: pinned there it would stay Pending. It stays gated;
        # the admission step woken here places it again (displacement.py).
        rt.scheduling.wakeups.signal((namespace, job.policy), "admission")
        return
    if pod.pinned not in (None, node):
        action: PinPod | DeletePod = DeletePod(namespace, pod.name, pod.uid, pod.role,
                                               pod.ordinal, node, pod.pinned)
    else:
        action = PinPod(namespace, pod.name, pod.uid, pod.role, pod.ordinal, node)
        rt.pods.pinned[pod.uid] = node
    try:
        await execute(rt.api, action)
    except Exception:
        rt.pods.pinned.pop(pod.uid, None)
        raise
    log.info("MLJob %s/%s: %s %s on %s", namespace, job_name,
             "pinned" if isinstance(action, PinPod) else "recreating", pod.name, node)


def refused_by(rt: Runtime, idx: Indexes, job: JobRecord, role: str, node: str) -> str | None:
    """Why `node` would refuse a new pod of the job's role now (displacement.refusal)."""
    found = values(idx.nodes, node)
    return displacement.refusal(found[0] if found else None,
                                job.node_constraints.get(role, EVERY_NODE),
                                rt.process.config.node_selector, rt.process.config.tolerated_taints)


async def restore_replicas(rt: Runtime, event_type: str | None, body: Mapping[str, Any],
                           idx: Indexes) -> bool:
    """A StatefulSet of ours whose replicas differ from the last decision (scaled by hand, or
    recreated after a deletion) is scaled back at once, not at the next round. True if so."""
    if event_type not in ("ADDED", "MODIFIED"):
        return False
    record = sts_record(body)
    meta = body.get("metadata", {})
    job = idx.job(meta.get("namespace", ""), (meta.get("labels") or {}).get(JOB_LABEL, ""))
    decided = rt.scheduling.placements.of(job.key) if job is not None else None
    if job is None or decided is None or not job.schedulable or meta.get("deletionTimestamp") \
            or rt.jobs.preflight.refusal(job) is not None:
        return False  # not decided by this operator yet, or suspended/finished/refused: the lifecycle owns it
    if rt.scheduling.placements.being_applied(job.key):
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
    await rt.writers.events.emit(ObjectRef("MLJob", job.namespace, job.name, job.uid), "Normal", "Restored",
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
    rt.scheduling.services.forget(job.key)
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
    if job.finished or rt.jobs.books.reconciled.get(job.key) != (job.uid, job.generation) \
            or await rt.scheduling.services.exists(rt.api, job):
        return False
    created = await ensure_service(rt.api, job)
    rt.scheduling.services.note(job)
    if created:
        await rt.writers.events.emit(ObjectRef("MLJob", job.namespace, job.name, job.uid), "Normal",
                                     "Restored", f"Service {job.name} was deleted; created again, so "
                                     f"that the job's pods find their peers by its DNS names")
    return created
