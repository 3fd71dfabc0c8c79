"""Idempotent writes: create what is missing, execute planned actions. Every function here
makes no API call when there is nothing to change (the plans come from desired.py)."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from mlsched.controller.objects.desired import (
    Action, DeletePod, PatchStatefulSet, PinPod, PodSettings, plan_statefulset, roles_of,
    service_manifest, starting_counts, statefulset_manifest,
)
from mlsched.controller.kube.kube import KubeApi, KubeError
from mlsched.controller.objects.records import StsRecord, controller_uid, pod_record, sts_record
from mlsched.controller.objects.job_records import JobRecord

log = logging.getLogger("mlsched.controller.objects.apply")


class WaitingForOldChildren(Exception):
    """A child's name is taken by an object another MLJob owns: an earlier job of the same
    name, deleted, whose children the garbage collector has not removed yet. Never adopted."""

    def __init__(self, kind: str, name: str, owner_uid: str | None):
        super().__init__(f"{kind} {name} still belongs to an earlier MLJob of this name "
                         f"(uid {owner_uid}); waiting for the garbage collector to delete it")


class ChildOverQuota(Exception):
    """The namespace's ResourceQuota has no room for one of the job's children (an object
    count: `services`, `count/statefulsets.apps`). Created once the quota has room."""

    def __init__(self, kind: str, name: str, message: str):
        super().__init__(f"its {kind} {name} cannot be created until the namespace's "
                         f"ResourceQuota has room ({message}); it is created as soon as the "
                         f"quota has")


async def _create_owned(api: KubeApi, job: JobRecord, body: dict[str, Any]) -> bool:
    """Create a child; True if created now, False if this job already has it. A 409 is only
    "already there" when the object found is this job's (checked by owner uid). A quota that
    is full refuses the create (403) before the API server looks for the name, so a child that
    exists is looked for then too: it used to be reported as not created."""
    kind, name = body["kind"], body["metadata"]["name"]
    over_quota = None
    try:
        if await api.create(body):
            return True
    except KubeError as err:
        if not err.over_quota:
            raise
        over_quota = err.message
    found = await api.get(kind, job.namespace, name)
    if found is None and over_quota is not None:
        raise ChildOverQuota(kind, name, over_quota)
    owner = controller_uid(found["metadata"]) if found else None
    if found is not None and owner != job.uid:
        raise WaitingForOldChildren(kind, name, owner)
    return False


async def ensure_service(api: KubeApi, job: JobRecord) -> bool:
    """Create the headless Service; True if it was created now."""
    return await _create_owned(api, job, service_manifest(job))


async def ensure_statefulsets(api: KubeApi, job: JobRecord, existing: Iterable[StsRecord],
                              settings: PodSettings) -> list[str]:
    """Create the StatefulSets the index does not show, with zero replicas: how many pods a
    job gets is the scheduling round's decision, never the create handler's. Their templates
    are rendered for the job's starting counts (desired.starting_counts)."""
    have = {s.role for s in existing}
    manifests = [statefulset_manifest(job, role, 0, starting_counts(job), settings)
                 for role in roles_of(job) if role not in have]
    made = await asyncio.gather(*(_create_owned(api, job, m) for m in manifests),
                                return_exceptions=True)
    for result in made:
        if isinstance(result, BaseException):
            raise result
    return [m["metadata"]["name"] for m, now in zip(manifests, made) if now]


def refresh_plan(job: JobRecord, existing: Iterable[StsRecord],
                 settings: PodSettings) -> list[PatchStatefulSet]:
    """After a spec edit: the templates re-rendered for the replicas the StatefulSets have.
    Template-only patches, each valid only over the template it was planned from: a round
    scaling the job meanwhile owns the replicas (an earlier version patched them back to what
    the index showed, undoing a scaling that had just gone out)."""
    current = {s.role: s for s in existing}
    counts = {role: s.replicas for role, s in current.items()}
    if not any(counts.values()):  # waiting: rendered as created (admitting changes replicas only)
        counts = starting_counts(job)
    plans = []
    for role in roles_of(job):
        if role not in current:
            continue
        # The pool its template requires now stays (a round changes it, not a spec edit).
        plan = plan_statefulset(job, role, current[role], counts, settings, current[role].pool)
        if plan is not None and plan.template is not None:
            plans.append(dataclasses.replace(plan, keep_replicas=True,
                                             replaces_hash=current[role].template_hash))
    return plans


# A spec edit racing a scaling: each failed compare-and-swap reads the StatefulSets again.
REFRESH_ATTEMPTS = 4


async def refresh_templates(api: KubeApi, job: JobRecord, existing: Sequence[StsRecord],
                            settings: PodSettings, *, read_first: bool = False) -> int:
    """Bring the pod templates of these StatefulSets in line with an edited spec; how many
    were patched. Planned from the index's records, or with `read_first` from the
    StatefulSets as the API server has them now (the index may not show a scaling that was
    just answered, and a template holds both roles' counts). A patch whose template changed
    since it was planned fails (422) and they are read again; a 422 on an unchanged
    StatefulSet is the API server refusing the template, raised for the job's status."""
    current = list(existing)
    for attempt in range(REFRESH_ATTEMPTS):
        if read_first or attempt:
            found = await asyncio.gather(*(api.get("StatefulSet", job.namespace, s.name)
                                           for s in existing))
            current = [sts_record(f) for f in found
                       if f is not None and not f["metadata"].get("deletionTimestamp")]
        plans = refresh_plan(job, current, settings)
        try:
            for plan in plans:
                await execute(api, plan)
            return len(plans)
        except KubeError as err:
            if err.status != 422 or attempt == REFRESH_ATTEMPTS - 1:
                raise
            again = await api.get("StatefulSet", job.namespace, plan.name)
            if again is not None and again["metadata"].get("uid") == plan.uid \
                    and sts_record(again).template_hash == plan.replaces_hash:
                raise  # as it was planned over: the API server refuses the template itself
            log.info("StatefulSet %s/%s changed while its template was refreshed; reading it "
                     "again", job.namespace, plan.name)
    return 0


def scale_to_zero_plan(existing: Iterable[StsRecord], namespace: str) -> list[PatchStatefulSet]:
    return [PatchStatefulSet(namespace, s.name, 0, uid=s.uid or None)
            for s in existing if s.replicas > 0]


async def execute(api: KubeApi, action: Action) -> bool:
    """Run one action; False when its object is gone (nothing left to do)."""
    if isinstance(action, PatchStatefulSet):
        return await api.patch("StatefulSet", action.namespace, action.name, action.patch(),
                               patch_type="json")
    if isinstance(action, PinPod):
        try:
            return await api.patch("Pod", action.namespace, action.name, action.patch(),
                                   patch_type="strategic")
        except KubeError as err:
            if err.status != 422:
                raise
            return await _pinned_meanwhile(api, action, err)
    if isinstance(action, DeletePod):
        return await api.delete("Pod", action.namespace, action.name, uid=action.uid)
    raise TypeError(f"unknown action {action!r}")


async def _pinned_meanwhile(api: KubeApi, action: PinPod, err: KubeError) -> bool:
    """A pin the API server refused because the pod is no longer gated: between the round's
    reading of the pod and its pin, the pod handler pinned it to the decision the round was
    replacing (a pod created while the round decided), and an ungated pod's nodeSelector may
    not change. Pinned where this pin would put it: done. Elsewhere: moved, as plan_pods moves
    a pod pinned elsewhere (its StatefulSet recreates it gated, and the pod handler pins it to
    the decision in force). It used to be a Warning `ApplyFailed` on the job ("pod updates may
    not change fields ...") and the pod left on the old node until the next step moved it."""
    body = await api.get("Pod", action.namespace, action.name)
    pod = pod_record(body) if body is not None else None
    if pod is None or pod.uid != action.uid:
        return False  # gone, or another pod by now: the pod handler pins that one
    if pod.gated:
        raise err  # still gated: the API server refuses the pin for another reason
    if action.node in (pod.pinned, pod.node):
        return True
    log.info("pod %s/%s was pinned to %s while a step decided %s; recreating it", action.namespace,
             action.name, pod.pinned, action.node)
    return await api.delete("Pod", action.namespace, action.name, uid=action.uid)


async def execute_all(api: KubeApi, actions: Sequence[Action]) -> list[bool | BaseException]:
    """Run actions concurrently (the KubeApi bounds how many are in flight); one failing
    action is logged and returned, never raised, so it cannot hold up the others."""
    results = await asyncio.gather(*(execute(api, a) for a in actions), return_exceptions=True)
    for action, result in zip(actions, results):
        if isinstance(result, BaseException):
            log.warning("%s %s/%s failed: %s", type(action).__name__, action.namespace,
                        action.name, result)
    return list(results)


def ordered(actions: Iterable[Action]) -> list[Action]:
    """StatefulSet changes first: a scale-down removes surplus pods that would otherwise be
    pinned or deleted for nothing."""
    actions = list(actions)
    first = [a for a in actions if isinstance(a, PatchStatefulSet)]
    return first + [a for a in actions if not isinstance(a, PatchStatefulSet)]


def summarize(actions: Iterable[Action]) -> Mapping[str, int]:
    out = {"scale": 0, "place": 0, "evict": 0}
    for a in actions:
        out["scale" if isinstance(a, PatchStatefulSet) else
            "place" if isinstance(a, PinPod) else "evict"] += 1
    return out
