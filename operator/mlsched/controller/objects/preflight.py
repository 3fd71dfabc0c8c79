"""Would the API server create the job's pods? Asked with one dry-run create per role before
the job is given capacity, and again whenever its pods are refused.

Some refusals come only when a pod is created, never when its StatefulSet is: Pod Security
admission (a namespace labelled `pod-security.kubernetes.io/enforce: restricted` and a template
that runs as root), a `serviceAccountName` that does not exist, a ValidatingAdmissionPolicy,
an admission webhook. Such a job used to be admitted, its StatefulSets scaled, and every pod
refused (`FailedCreate`): it said `PodsRefused`, but held what it was given until its policy's
next round. Tried on a sandbox: a typo in `serviceAccountName` held 8 GPUs under a policy with
a daily interval while a job that needed them waited. A pod created with `dryRun=All` goes
through every admission plugin and every webhook that declares it has no side effects, and is
not stored; the refusal is the one the real pod would get, word for word.

Verdicts, per job generation:
- refused: the job is given no capacity and is told why (`PodsRefused`, a Warning Event).
  A refused job is asked again at once when its namespace's labels change (Pod Security's
  level, a label an admission policy selects on), and every RECHECK_S otherwise, since the
  rest of what may refuse it (a ServiceAccount, a webhook's configuration) is not watched;
  when it passes, its policy's admission runs at once.
- passed, or no answer worth acting on: the job is scheduled as before this check. That
  covers refusals the operator plans with itself (ResourceQuota: the API server refuses a pod
  over quota, which the ledger books in advance, and a transient race must not block a job;
  LimitRange and RuntimeClass, which block the job by their own rules until they change), and
  checks that cannot be made: the operator not allowed to create pods (an older RBAC), a
  webhook that does not support dry run, the API server failing (5xx, 429). The real creation
  still says so if the pods are then refused (pod_problems.pods_refused), which asks again.

A job that was admitted and whose pods are then all refused (the namespace relabelled after the
check, a webhook installed) is asked again; refused, it gives its capacity back (jobs.py).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import dataclass
from typing import Any

from mlsched.controller.objects.desired import pod_template, roles_of, sts_name
from mlsched.controller.kube.kube import KubeError
from mlsched.controller.objects.job_records import JobRecord

log = logging.getLogger("mlsched.controller.objects.preflight")

JobKey = tuple[str, str]

#: How often a refused job is asked again (what refused it is not watched).
RECHECK_S = 30.0
#: After the operator was refused the right to create pods: how long before it tries again.
UNAVAILABLE_S = 600.0
#: Templates that passed lately, remembered this long (at most PASSES_KEPT of them): a burst
#: of jobs made from one manifest (a hyperparameter sweep) costs one check per role, not one
#: per job. Measured with 200 such jobs at once (bench_e2e.py --admission-only), a check per
#: job added 400 requests to the arrival path and about 1 s to its p99.
PASS_TTL_S = RECHECK_S
PASSES_KEPT = 1024

# Refusals the operator plans with itself, and ones not about the pod: ResourceQuota (the
# rounds book quotas; a dry run over quota only means the quota is in use now), LimitRange
# and RuntimeClass (limitranges.py and runtimeclasses.py block such a job in the same words
# and unblock it the moment the object changes, which a held refusal would delay to the next
# recheck), and a namespace being deleted, which takes its jobs. The phrases are kube-apiserver
# 1.34's ("[maximum memory usage per Container is 16Gi, but limit is 32Gi, cpu max limit to
# request ratio per Container is 2, ...]", "pod rejected: RuntimeClass \"kata\" not found").
_PLANNED_OR_NOT_ABOUT_THE_POD = (
    "exceeded quota", "failed quota", " usage per Container is ", " usage per Pod is ",
    " limit to request ratio per ", "pod rejected: RuntimeClass ", "is being terminated")


@dataclass(frozen=True)
class Verdict:
    uid: str
    generation: int
    refusal: str | None  # the API server's refusal of one pod of the job, or None
    at: float  # time.monotonic() of the check


class Preflight:
    """Each job's latest verdict, and the jobs whose check is in flight."""

    def __init__(self, clock=time.monotonic) -> None:
        self.clock = clock
        self.verdicts: dict[JobKey, Verdict] = {}
        self.in_flight: set[JobKey] = set()
        # Jobs a policy step left out while their check was in flight: they wake it when done.
        self.passed_over: set[JobKey] = set()
        self.unavailable_until = 0.0  # the operator may not create pods: no checks until then
        self.passes: dict[tuple, float] = {}  # template_key -> when a pod of it last passed
        self.asking: dict[tuple, asyncio.Future] = {}  # template_key -> the dry run in flight

    def _current(self, job: JobRecord) -> Verdict | None:
        v = self.verdicts.get(job.key)
        return v if v is not None and (v.uid, v.generation) == (job.uid, job.generation) else None

    def refusal(self, job: JobRecord) -> str | None:
        v = self._current(job)
        return v.refusal if v is not None else None

    def holds(self, job: JobRecord) -> bool:
        """Not to be given capacity: its check is in flight (noted, so that its end wakes the
        policy again), or the API server refuses its pods."""
        if job.key in self.in_flight:
            self.passed_over.add(job.key)
            return True
        return self.refusal(job) is not None

    def checked(self, job: JobRecord) -> bool:
        return self._current(job) is not None

    def due(self, job: JobRecord) -> bool:
        """A refusal old enough to ask again."""
        v = self._current(job)
        return v is not None and v.refusal is not None and self.clock() - v.at >= RECHECK_S

    def recent(self, job: JobRecord) -> bool:
        """Checked this generation less than RECHECK_S ago."""
        v = self._current(job)
        return v is not None and self.clock() - v.at < RECHECK_S

    def start(self, job: JobRecord) -> bool:
        """Mark the job's check in flight (synchronously, before anything awaits, so no
        admission step can slip in between); False if one is already, or checks are off."""
        if job.key in self.in_flight or self.clock() < self.unavailable_until:
            return False
        self.in_flight.add(job.key)
        return True

    def forget(self, key: JobKey) -> None:
        self.verdicts.pop(key, None)
        self.passed_over.discard(key)

    def passed_lately(self, keys: list[tuple]) -> bool:
        now = self.clock()
        return all(k in self.passes and now - self.passes[k] < PASS_TTL_S for k in keys)

    def note_pass(self, key: tuple) -> None:
        if len(self.passes) >= PASSES_KEPT:
            now = self.clock()
            self.passes = {k: t for k, t in self.passes.items() if now - t < PASS_TTL_S}
            if len(self.passes) >= PASSES_KEPT:
                self.passes.clear()
        self.passes[key] = self.clock()


def template_key(job: JobRecord, role: str, settings) -> tuple:
    """What admission judges a role's pods by, apart from the job's name: the namespace and
    the template as written (our additions are the same for every job)."""
    return (job.namespace, role, settings.service_account,
            json.dumps(job.templates.get(role) or {}, sort_keys=True))


def begin(rt: Any, job: JobRecord) -> asyncio.Future | None:
    """The check of a job that is about to wait for capacity: None when its templates passed
    lately (recorded as passed at once) or a check is already running; else the check, started
    (in flight from now on, so that no admission step gives the job anything before it ends)."""
    book: Preflight = rt.jobs.preflight
    if book.passed_lately([template_key(job, role, rt.pod_settings) for role in roles_of(job)]):
        book.verdicts[job.key] = Verdict(job.uid, job.generation, None, book.clock())
        rt.process.metrics.preflights.labels("passed").inc()
        return None
    if not book.start(job):
        return None
    return asyncio.ensure_future(check(rt, job))


def dry_run_pod(job: JobRecord, role: str, settings) -> dict[str, Any]:
    """The role's first pod as its StatefulSet would create it: the rendered template, the
    StatefulSet's name for pod 0, its hostname and subdomain, the labels the StatefulSet
    controller adds. (Node placement and pool affinity do not change what admission decides.)"""
    counts = {r: job.bounds(r)[0] for r in roles_of(job)}
    template = pod_template(job, role, counts, settings)
    name = f"{sts_name(job.name, role)}-0"
    meta = template.get("metadata") or {}
    metadata: dict[str, Any] = {
        "name": name, "namespace": job.namespace,
        "labels": {**(meta.get("labels") or {}), "statefulset.kubernetes.io/pod-name": name,
                   "apps.kubernetes.io/pod-index": "0"}}
    if meta.get("annotations"):
        metadata["annotations"] = meta["annotations"]
    spec = {**template["spec"], "hostname": name, "subdomain": job.name}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}


def classify(err: KubeError) -> tuple[str, str]:
    """("refused" | "passed" | "unavailable" | "unknown", why) for the API server's answer to a
    dry-run pod create that failed."""
    text = err.message
    if err.status == 409:  # admission passed; a pod of that name exists already
        return "passed", text
    if err.status == 403 and "cannot create resource" in text:  # RBAC: the operator's own rights
        return "unavailable", text
    if err.status in (400, 403, 422):
        if "does not support dry run" in text:  # a webhook with side effects: cannot be asked
            return "unknown", text
        if any(s in text for s in _PLANNED_OR_NOT_ABOUT_THE_POD):
            return "passed", text
        return "refused", text
    return "unknown", text  # 5xx, 429, a timeout: the real creation will tell


async def check(rt: Any, job: JobRecord) -> str | None:
    """Ask the API server about one pod of each role; store and return the verdict's refusal.
    (`rt`: the Runtime, which holds the book as `rt.jobs.preflight`; the caller has called
    `rt.jobs.preflight.start(job)`.) A job that passes after its policy left it out (refused
    before, or checked while a step ran) wakes the policy's admission."""
    book = rt.jobs.preflight
    was_refused = book.refusal(job) is not None
    try:
        answers = await asyncio.gather(*(_ask_role(rt, job, role) for role in roles_of(job)))
    finally:
        book.in_flight.discard(job.key)
    refusal = next((why for kind, why in answers if kind == "refused"), None)
    book.verdicts[job.key] = Verdict(job.uid, job.generation, refusal, book.clock())
    rt.process.metrics.preflights.labels("refused" if refusal else "passed").inc()
    passed_over = job.key in book.passed_over
    book.passed_over.discard(job.key)
    if refusal is None and (was_refused or passed_over):
        rt.scheduling.wakeups.signal((job.namespace, job.policy), "admission")
    return refusal


async def namespace_relabelled(rt: Any, namespace: str) -> None:
    """The namespace's labels changed (Pod Security's enforce level, a label an admission policy
    selects namespaces by): its templates' recent passes no longer hold, and its refused jobs
    are asked again now, not at their next recheck."""
    book: Preflight = rt.jobs.preflight
    book.passes = {k: t for k, t in book.passes.items() if k[0] != namespace}
    jobs = [rt.cluster.indexes.job(*key) for key, v in list(book.verdicts.items())
            if v.refusal is not None and key[0] == namespace] if rt.cluster.indexes else []
    await asyncio.gather(*(check(rt, job) for job in jobs
                           if job is not None and book.refusal(job) is not None and book.start(job)))


async def _ask_role(rt: Any, job: JobRecord, role: str) -> tuple[str, str]:
    """The answer for one role: a recent pass of the same template, or the dry run another job
    of that template has in flight if it passes (a burst from one manifest asks once), else
    the job's own dry run (so that a refusal names its own pod)."""
    book: Preflight = rt.jobs.preflight
    key = template_key(job, role, rt.pod_settings)
    if book.passed_lately([key]):
        return "passed", ""
    shared = book.asking.get(key)
    if shared is not None and (await asyncio.shield(shared))[0] == "passed":
        return "passed", ""
    asked = asyncio.ensure_future(_ask(rt, dry_run_pod(job, role, rt.pod_settings)))
    book.asking.setdefault(key, asked)
    try:
        kind, why = await asked
    finally:
        if book.asking.get(key) is asked:
            del book.asking[key]
    if kind == "passed":
        book.note_pass(key)
    return kind, why


async def _ask(rt: Any, pod: dict[str, Any]) -> tuple[str, str]:
    """classify's (kind, why) for one pod; ("passed", "") when it was accepted."""
    try:
        await rt.api.dry_run_create(pod)
        return "passed", ""
    except KubeError as err:
        kind, why = classify(err)
    except Exception as err:  # noqa: BLE001 - a check that cannot be made never blocks a job
        kind, why = "unknown", str(err)
    if kind == "unavailable":
        rt.jobs.preflight.unavailable_until = rt.jobs.preflight.clock() + UNAVAILABLE_S
        log.warning("cannot check pods with a dry-run create (%s): the operator's RBAC lacks "
                    "pods create (manifests/base/rbac.yaml); jobs are admitted unchecked for "
                    "%.0f s", why, UNAVAILABLE_S)
    elif kind == "unknown":
        log.info("dry-run create of pod %s/%s answered without a verdict: %s",
                 pod["metadata"]["namespace"], pod["metadata"]["name"], why)
    return kind, why
