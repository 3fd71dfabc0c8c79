"""What a scheduling round tells the world: Events and status writes.

Status writes are merge patches of only the fields that changed; Events are posted when
something changed (a scale, a move, a condition), so a quiet cluster stays quiet.
A failed write is logged and the round goes on: the next round writes again.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any

from mlsched.api import PolicyConditionType as P, append_bounded, get_condition, set_condition
from mlsched.controller import rewards
from mlsched.controller.desired import (
    Action, DeletePod, JobTarget, PatchStatefulSet, PinPod, roles_of,
)
from mlsched.controller.events import ObjectRef
from mlsched.controller.records import JobRecord
from mlsched.controller.runtime import Runtime

log = logging.getLogger("mlsched.controller.reporting")


def wire(conditions) -> list[dict]:
    return [c.model_dump(mode="json", by_alias=True, exclude_none=True) for c in conditions]


def condition_changed(old: Any, new: Any, type_: str) -> bool:
    a, b = get_condition(old, type_), get_condition(new, type_)
    return a is None or (a.status, a.reason, a.message) != (b.status, b.reason, b.message)


async def report_invalid_policy(rt: Runtime, body: Mapping, ref: ObjectRef, message: str) -> None:
    status = body.get("status") or {}
    conds = set_condition(status.get("conditions"), P.READY, False, "InvalidSpec", message,
                          observed_generation=body["metadata"].get("generation"))
    if condition_changed(status.get("conditions"), conds, P.READY):
        await rt.api.patch("SchedulingPolicy", ref.namespace, ref.name,
                           {"status": {"conditions": wire(conds)}}, status=True)
        await rt.recorder.emit(ref, "Warning", "InvalidSpec", message)


async def job_events(rt: Runtime, job: JobRecord, target: JobTarget, actions: list[Action],
                     before: dict[str, int],
                     failures: list[tuple[Action, BaseException]] = ()) -> None:
    """Scaled / Unallocated / Placed for what was applied; ApplyFailed for what was not."""
    ref = ObjectRef("MLJob", job.namespace, job.name, job.uid)
    if failures:
        text = "; ".join(f"{type(a).__name__} {a.name}: {err}" for a, err in failures[:5])
        await rt.recorder.emit(ref, "Warning", "ApplyFailed", text)
    if any(isinstance(a, PatchStatefulSet) for a in actions):
        roles = roles_of(job)
        change = ", ".join(f"{r} {before.get(r, 0)}→{target.count(r)}" for r in roles)
        if sum(target.count(r) for r in roles) == 0:
            await rt.recorder.emit(ref, "Normal", "Unallocated", f"no tasks this interval ({change})")
        elif any(before.get(r, 0) != target.count(r) for r in roles):
            where = "; ".join(f"{r} on {' '.join(target.nodes.get(r, ()))}" for r in roles
                              if target.count(r))
            await rt.recorder.emit(ref, "Normal", "Scaled", f"{change} ({where})")
    moves = [a for a in actions if isinstance(a, PinPod | DeletePod)]
    if moves:
        text = ", ".join(f"{a.role}-{a.ordinal}→{a.node}"
                         + (f" (was {a.was})" if isinstance(a, DeletePod) else "")
                         for a in moves[:20])
        more = f" and {len(moves) - 20} more" if len(moves) > 20 else ""
        await rt.recorder.emit(ref, "Normal", "Placed", text + more)


async def write_job_status(rt: Runtime, namespace: str, jobs: list[JobRecord],
                            schedulable: list[JobRecord],
                            targets: dict[str, JobTarget], closed: rewards.ClosedInterval | None,
                            history_limit: int) -> dict[str, dict]:
    patches: dict[str, dict] = {}
    decided = {j.name for j in schedulable}
    for job in jobs:
        patch: dict[str, Any] = {}
        if job.name in decided:
            target = targets[job.name]
            placement = target.placement()
            if placement != job.placement:
                patch["placement"] = placement
            desired = {r: target.count(r) for r in roles_of(job)}
            if desired != {r: job.desired.get(r, 0) for r in roles_of(job)}:
                patch["replicaStatuses"] = {r: {"desired": n} for r, n in desired.items()}
        if closed and job.name in closed.history:
            patch["history"] = append_bounded(list(job.history), closed.history[job.name],
                                              history_limit)
        if patch:
            patches[job.name] = patch
    results = await asyncio.gather(*(rt.api.patch("MLJob", namespace, name, {"status": patch},
                                                  status=True)
                                     for name, patch in patches.items()), return_exceptions=True)
    for name, result in zip(patches, results):
        if isinstance(result, BaseException):
            log.warning("MLJob %s/%s: status not written: %s", namespace, name, result)
    return patches


async def write_policy_status(rt: Runtime, body: Mapping, ref: ObjectRef, resolved, decision,
                               closed, now: float, duration: float, history_limit: int) -> None:
    status = body.get("status") or {}
    generation = body["metadata"].get("generation")
    old = status.get("conditions")
    ml, ready = resolved.model_loaded, resolved.ready
    conds = set_condition(old, P.MODEL_LOADED, ml.status, ml.reason, ml.message,
                          observed_generation=generation)
    conds = set_condition(conds, P.READY, ready.status, ready.reason, ready.message,
                          observed_generation=generation)
    if condition_changed(old, conds, P.MODEL_LOADED):
        if not ml.status:
            await rt.recorder.emit(ref, "Warning", ml.reason, ml.message)
        elif ml.reason == "ModelVerified":
            await rt.recorder.emit(ref, "Normal", "ModelLoaded", ml.message)
    if condition_changed(old, conds, P.READY) and ready.reason == "FallbackActive":
        await rt.recorder.emit(ref, "Warning", "FallbackActive", ready.message)

    models = {k: None for k in status.get("activeModels") or {}}  # merge patch: null removes
    models.update(resolved.active_models)
    same_generation = status.get("observedGeneration") == generation
    decisions = (status.get("decisions") or 0) if same_generation else 0
    patch: dict[str, Any] = {
        "activeModels": models,
        "conditions": wire(conds),
        "lastRoundTime": rewards.utc(now).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "lastRoundDurationSeconds": round(duration, 6),
        "decisions": decisions + decision.inferences,
        "observedGeneration": generation,
    }
    if closed:
        patch["rewards"] = append_bounded(status.get("rewards"), closed.reward, history_limit)
    try:
        await rt.api.patch("SchedulingPolicy", ref.namespace, ref.name, {"status": patch},
                           status=True)
    except Exception as err:  # noqa: BLE001
        log.warning("SchedulingPolicy %s/%s: status not written: %s", ref.namespace, ref.name, err)
