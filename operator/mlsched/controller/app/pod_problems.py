"""Why a job's pods are not running, told on the job (Events, its Ready condition): pods
pinned and ungated that the scheduler has not placed (`unscheduled`), pods stuck being
created (volumes, images: `stuck_creating`), DRA claims not made (`claims_unmade`), pods the
API server refuses (`pods_refused`). Read by the lifecycle evaluation (job_lifecycle.py)."""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Iterable

from mlsched.controller.kube.kube import KubeError
from mlsched.controller.objects.records import DEFAULT_SCHEDULER, PodRecord
from mlsched.controller.objects.job_records import JobRecord
from mlsched.controller.scheduling.runtime import Runtime
from mlsched.controller.scheduling.indexes import JobKey

log = logging.getLogger("mlsched.controller.app.pod_problems")


def unscheduled(rt: Runtime, key: JobKey, pods: list[PodRecord]) -> list[tuple[str, str]]:
    """(pod, why) for the job's pods that were pinned and ungated at least
    `scheduler_grace_seconds` ago and that no scheduler has acted on since: not bound, no
    Unschedulable verdict. A template naming a scheduler that does not run here (a Volcano
    template brought along) left its pods `SchedulingGated` in `kubectl get` and the job
    PodsStarting forever, its GPUs held."""
    now, grace = time.monotonic(), rt.process.config.scheduler_grace_seconds
    out = []
    clocks = rt.pods.clocks.unseen_since.get(key, {})
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
        rt.pods.clocks.unseen_since[key] = kept
    else:
        rt.pods.clocks.unseen_since.pop(key, None)
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
    return await _warned(rt, key, namespace, waiting, rt.pods.clocks.creating_since, rt.pods.clocks.creating_checks,
                         rt.process.config.creating_grace_seconds, CREATING_FAILURES)


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
    return await _warned(rt, key, namespace, waiting, rt.pods.clocks.claims_since, rt.pods.clocks.claims_checks,
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
            rt.pods.clocks.short_since.pop(key, None)
            continue
        since, before = rt.pods.clocks.short_since.get(key, (now, created))
        if created > before:  # progress since: not refused (not all of it, anyway)
            since = now
        rt.pods.clocks.short_since[key] = (since, created)
        if found is None and now - since >= REFUSAL_GRACE_S:
            try:
                events = await rt.api.failed_creates(job.namespace, sts.name)
            except KubeError as err:
                log.warning("MLJob %s/%s: cannot read the Events of %s: %s", *job.key, sts.name, err)
                continue
            if events:
                found = f"{sts.name}: {events[-1].get('message', 'FailedCreate')}"
    return found
