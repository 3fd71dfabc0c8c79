"""What a scheduling round tells the world: Events and status writes.

Status writes are merge patches of only the fields that changed, queued in the runtime's
StatusWriter (status_writer.py), which writes them in the background and retries them until
they are written; Events are posted when something changed (a scale, a move, a condition), so
a quiet cluster stays quiet.
"""

from __future__ import annotations

import time

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from mlsched.api import PolicyConditionType as P, get_condition, set_condition
from mlsched.controller.scheduling import conservation, domain
from mlsched.controller.objects import lifecycle
from mlsched.controller.dataset import rewards
from mlsched.controller.objects.desired import (
    Action, DeletePod, JobTarget, PatchStatefulSet, PinPod, roles_of,
)
from mlsched.controller.kube.events import ObjectRef
from mlsched.controller.serving.models import Verdict
from mlsched.controller.objects.job_records import JobRecord
from mlsched.controller.scheduling.runtime import Runtime
from mlsched.policies.work_conservation import IdleCapacity


def wire(conditions) -> list[dict]:
    return [c.model_dump(mode="json", by_alias=True, exclude_none=True) for c in conditions]


def condition_changed(old: Any, new: Any, type_: str) -> bool:
    a, b = get_condition(old, type_), get_condition(new, type_)
    return a is None or (a.status, a.reason, a.message) != (b.status, b.reason, b.message)


async def report_invalid_policy(rt: Runtime, body: Mapping, ref: ObjectRef, message: str) -> None:
    await _policy_not_ready(rt, body, ref, "InvalidSpec", message)


async def report_round_failure(rt: Runtime, body: Mapping, ref: ObjectRef, err: BaseException,
                               retry_s: float) -> None:
    """A round that raised: `Ready=False/RoundFailed` with the error and a Warning Event, once
    per distinct error (the next round that completes sets Ready again). Without this the
    policy said Ready while nothing was scheduled, and only the operator's log knew why."""
    message = f"{type(err).__name__}: {err}"[:900] + f"; retrying every {retry_s:.0f} s"
    await _policy_not_ready(rt, body, ref, "RoundFailed", message)


async def _policy_not_ready(rt: Runtime, body: Mapping, ref: ObjectRef, reason: str,
                            message: str) -> None:
    """`Ready=False/<reason>` and a Warning Event, written only when that changes it."""
    status = body.get("status") or {}
    conds = set_condition(status.get("conditions"), P.READY, False, reason, message,
                          observed_generation=body["metadata"].get("generation"))
    if condition_changed(status.get("conditions"), conds, P.READY):
        await rt.api.patch("SchedulingPolicy", ref.namespace, ref.name,
                           {"status": {"conditions": wire(conds)}}, status=True)
        await rt.writers.events.emit(ref, "Warning", reason, message)


async def job_events(rt: Runtime, job: JobRecord, target: JobTarget, actions: list[Action],
                     before: dict[str, int],
                     failures: list[tuple[Action, BaseException]] = ()) -> None:
    """Scaled / Unallocated / Placed for what was applied; ApplyFailed for what was not."""
    ref = ObjectRef("MLJob", job.namespace, job.name, job.uid)
    if failures:
        text = "; ".join(f"{type(a).__name__} {a.name}: {err}" for a, err in failures[:5])
        await rt.writers.events.emit(ref, "Warning", "ApplyFailed", text)
    if any(isinstance(a, PatchStatefulSet) for a in actions):
        roles = roles_of(job)
        change = ", ".join(f"{r} {before.get(r, 0)}→{target.count(r)}" for r in roles)
        if sum(target.count(r) for r in roles) == 0:
            await rt.writers.events.emit(ref, "Normal", "Unallocated", f"no tasks this interval ({change})")
        elif any(before.get(r, 0) != target.count(r) for r in roles):
            where = "; ".join(f"{r} on {' '.join(target.nodes.get(r, ()))}" for r in roles
                              if target.count(r))
            await rt.writers.events.emit(ref, "Normal", "Scaled", f"{change} ({where})")
    moves = [a for a in actions if isinstance(a, PinPod | DeletePod)]
    if moves:
        text = ", ".join(f"{a.role}-{a.ordinal}→{a.node}"
                         + (f" (was {a.was})" if isinstance(a, DeletePod) else "")
                         for a in moves[:20])
        more = f" and {len(moves) - 20} more" if len(moves) > 20 else ""
        await rt.writers.events.emit(ref, "Normal", "Placed", text + more)


def record_job_status(rt: Runtime, namespace: str, jobs: list[JobRecord],
                      schedulable: list[JobRecord], targets: dict[str, JobTarget],
                      closings: list[rewards.ClosedInterval], opened: Mapping[str, Any],
                      history_limit: int,
                      groups: Mapping[str, Mapping[str, Any]] | None = None) -> dict[str, dict]:
    """Queue each job's status record (rt.writers.status writes it in the background): the history
    entries of the intervals closed, `status.openInterval` for the jobs in `opened` (None
    clears it), placement and desired counts where they changed, and `groups`' fields (the
    pool, loop.settle_groups). One patch per job."""
    patches: dict[str, dict] = {}
    decided = {j.name for j in schedulable}
    for job in jobs:
        fields: dict[str, Any] = {}
        if job.name in decided:
            target = targets[job.name]
            placement = target.placement()
            if placement != job.placement:
                fields["placement"] = placement
                old_types = (job.placement or {}).get("gpuTypes")
                if old_types:  # a merge patch keeps what it does not name: null removes
                    placement["gpuTypes"] = merge_patch(old_types, placement.get("gpuTypes"))
            desired = {r: target.count(r) for r in roles_of(job)}
            before = {r: job.desired.get(r, 0) for r in roles_of(job)}
            if desired != before:
                fields["replicaStatuses"] = {r: {"desired": n} for r, n in desired.items()}
                if job.started and not job.final and all(before.values()) and all(desired.values()):
                    # A running job resized: every pod restarts with the new counts (the
                    # lifecycle sweep says when they all run again).
                    fields["rescales"] = lifecycle.start_rescale(job.rescales, before, desired,
                                                                 datetime.now(UTC))
                    rt.jobs.counts_since[job.key] = time.time()
        fields.update((groups or {}).get(job.name) or {})  # status.group, groupSince
        if job.name in opened and opened[job.name] != job.open_interval:
            fields["openInterval"] = opened[job.name]
        entries = [c.history[job.name] for c in closings if job.name in c.history]
        if not fields and not entries:
            continue
        rt.writers.status.enqueue("MLJob", namespace, job.name, uid=job.uid, fields=fields,
                                  append={"history": entries} if entries else None,
                                  base={"history": job.history}, limit=history_limit)
        patches[job.name] = {**fields, **({"history": entries} if entries else {})}
    return patches


async def policy_versions_and_exploration(rt: Runtime, body: Mapping, ref: ObjectRef, report,
                                          requested: float, applied: float) -> dict[str, Any]:
    """Status fields for model versions and exploration, where they changed, and their Events:
    `VersionAdopted` when a published version starts serving, `VersionAvailable` when a new
    candidate appears (updatePolicy Manual), `ExplorationClamped` when the operator serves less
    exploration than the spec asks."""
    status = body.get("status") or {}
    out: dict[str, Any] = {}
    old = status.get("modelVersions") or {}
    if report.status != old:
        out["modelVersions"] = merge_patch(old, report.status)
    if report.summary != status.get("modelVersion"):
        out["modelVersion"] = report.summary
    for key, entry in report.status.items():
        active, candidate = entry.get("active") or {}, entry.get("candidate")
        before = old.get(key) or {}
        was = before.get("active") or {}
        # A new version serving, even with the bytes that served before (a version published
        # from the shipped model's weights): the event is about which version serves.
        if active.get("source") == "published" and \
                (was.get("sha256"), was.get("version")) != (active["sha256"], active.get("version")):
            await rt.writers.events.emit(ref, "Normal", "VersionAdopted",
                                         f"{key}: serving published version {active.get('version')} "
                                         f"(ConfigMap {active.get('configMap')}, sha256 "
                                         f"{active['sha256']})")
        if candidate and (before.get("candidate") or {}).get("sha256") != candidate["sha256"]:
            await rt.writers.events.emit(ref, "Normal", "VersionAvailable",
                                         f"{key}: published version {candidate['version']} (ConfigMap "
                                         f"{candidate['configMap']}) is not serving; updatePolicy "
                                         f"Auto, or a models entry naming it, adopts it")
    wanted = {"requested": requested, "applied": applied} if requested > 0 else None
    if wanted != status.get("exploration"):
        out["exploration"] = wanted
        if wanted and applied < requested:
            await rt.writers.events.emit(ref, "Warning", "ExplorationClamped",
                                         f"spec.exploration.epsilon {requested} is above the operator's "
                                         f"bound; serving with {applied} (--max-exploration)")
    return out


async def work_conservation(rt: Runtime, ref: ObjectRef, status: Mapping[str, Any],
                            idle: IdleCapacity, verdict: Verdict) -> tuple[dict[str, Any], Verdict]:
    """A round's work-conservation check told (conservation.py): the metrics, the Event when
    the Ready reason turns NotWorkConserving or back, and (status fields where they changed,
    the Ready verdict to write)."""
    key = (ref.namespace, ref.name)
    last = rt.scheduling.per_policy.work_conservation.get(key) or status.get("workConservation")
    before = conservation.rounds_before(last)
    now = conservation.status_of(idle, before)
    rounds = now["consecutiveRounds"]
    rt.scheduling.per_policy.work_conservation[key] = now
    for resource, amount in (("gpus", idle.gpus), ("cpus", idle.cpus), ("tasks", idle.tasks)):
        rt.process.metrics.idle_capacity.labels(ref.namespace, ref.name, resource).set(amount)
    if not idle.conserving:
        rt.process.metrics.nonconserving_rounds.labels(ref.namespace, ref.name).inc()
    event = conservation.event(before, rounds, idle)
    if event is not None:
        await rt.writers.events.emit(ref, *event)
    return ({"workConservation": now} if now != last else {},
            conservation.ready(verdict, idle, rounds))


async def model_domain(rt: Runtime, ref: ObjectRef, status: Mapping[str, Any],
                       verdict: domain.DomainVerdict | None) -> None:
    """A round's ModelInDomain verdict (controller/scheduling/domain.py): the metric, and the Event when
    the condition changes; record_policy_status writes the condition itself."""
    key = (ref.namespace, ref.name)
    old = get_condition(status.get("conditions"), P.MODEL_IN_DOMAIN)
    # The status last queued, not the one read: it may not be written yet.
    before = rt.scheduling.per_policy.model_domain.get(key, old.status if old else None)
    rt.scheduling.per_policy.model_domain[key] = verdict.status if verdict else None
    gauge = rt.process.metrics.model_in_domain
    if verdict is None or verdict.gauge is None:
        gauge.remove_by_labels({"namespace": ref.namespace, "policy": ref.name})
    else:
        gauge.labels(ref.namespace, ref.name).set(verdict.gauge)
    event = domain.event(before, verdict)
    if event is not None:  # in the background: the round's status need not wait for it
        rt.writers.events.in_background(rt.writers.events.emit(ref, *event))


def merge_patch(old: Any, new: Any) -> Any:
    """The RFC 7386 merge patch turning `old` into `new` (maps recursively, null removes)."""
    if not isinstance(old, Mapping) or not isinstance(new, Mapping):
        return new
    patch: dict[str, Any] = {k: None for k in old if k not in new}
    for k, v in new.items():
        if k not in old:
            patch[k] = v
        elif old[k] != v:
            patch[k] = merge_patch(old[k], v)
    return patch


async def record_policy_status(rt: Runtime, body: Mapping, ref: ObjectRef, resolved, decision,
                               closings: list[rewards.ClosedInterval], now: float,
                               duration: float, history_limit: int,
                               extra: Mapping[str, Any] | None = None,
                               ready: Verdict | None = None,
                               in_domain: domain.DomainVerdict | None = None,
                               guard_verdict=None) -> None:
    """Events for condition changes now; the status patch (round summary, conditions and
    models where they changed, the rewards of the intervals closed) queued in rt.writers.status.
    `ready`: the Ready verdict when the round has more to say than the resolved policy's
    (work_conservation). `in_domain`: the ModelInDomain condition (model_domain); None
    removes it (only heuristics serve). `guard_verdict`: the GuardTripped condition
    (controller/scheduling/guard.py); None removes it (no guard)."""
    status = body.get("status") or {}
    generation = body["metadata"].get("generation")
    old = status.get("conditions")
    ml, ready = resolved.model_loaded, ready or resolved.ready
    conds = set_condition(old, P.MODEL_LOADED, ml.status, ml.reason, ml.message,
                          observed_generation=generation)
    conds = set_condition(conds, P.READY, ready.status, ready.reason, ready.message,
                          observed_generation=generation)
    if in_domain is not None:
        conds = set_condition(conds, P.MODEL_IN_DOMAIN, in_domain.status, in_domain.reason,
                              in_domain.message, observed_generation=generation)
    else:
        conds = [c for c in conds if c.type != P.MODEL_IN_DOMAIN]
    if guard_verdict is not None:
        conds = set_condition(conds, P.GUARD_TRIPPED, guard_verdict.status, guard_verdict.reason,
                              guard_verdict.message, observed_generation=generation)
    else:
        conds = [c for c in conds if c.type != P.GUARD_TRIPPED]
    if condition_changed(old, conds, P.MODEL_LOADED):
        if not ml.status:
            await rt.writers.events.emit(ref, "Warning", ml.reason, ml.message)
        elif ml.reason == "ModelVerified":
            await rt.writers.events.emit(ref, "Normal", "ModelLoaded", ml.message)
    if condition_changed(old, conds, P.READY) and ready.reason == "FallbackActive":
        await rt.writers.events.emit(ref, "Warning", "FallbackActive", ready.message)

    old_models = status.get("activeModels") or {}
    models = {k: None for k in old_models}  # merge patch: null removes
    models.update(resolved.active_models)
    same_generation = status.get("observedGeneration") == generation
    decisions = (status.get("decisions") or 0) if same_generation else 0
    patch: dict[str, Any] = {
        "lastRoundTime": rewards.utc(now).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "lastRoundDurationSeconds": round(duration, 6),
        "decisions": decisions + decision.inferences,
        "observedGeneration": generation,
    }
    # Written once even when empty, so `kubectl get -o yaml` always shows what is serving.
    if "activeModels" not in status or dict(resolved.active_models) != dict(old_models):
        patch["activeModels"] = models
    if wire(conds) != list(old or ()):
        patch["conditions"] = wire(conds)
    patch.update(extra or {})
    # In the background, like the jobs' records (the policy's reward is the interval's too).
    rt.writers.status.enqueue("SchedulingPolicy", ref.namespace, ref.name,
                              uid=body["metadata"].get("uid"), fields=patch,
                              append={"rewards": [c.reward for c in closings]} if closings else None,
                              base={"rewards": status.get("rewards") or ()}, limit=history_limit)
