"""An MLJob's phase, conditions and run-policy actions, computed from what the indexes show. Pure.

The lifecycle sweep (jobs.sweep) calls `evaluate` for every job every few seconds and writes the
result only when it differs from the current status. Phases:

    Pending ──(≥ min of every role allocated and Ready)──▶ Running ──(epochs, or every worker exited 0)──▶ Succeeded
    Pending / Running ──(runPolicy.suspend)──▶ Suspended ──(resume)──▶ Pending
    any non-final phase ──(activeDeadlineSeconds, backoffLimit)──▶ Failed

Succeeded means the reported epochs reached spec.epochs, or every worker exited 0 (a restart
after exit 0 is not a failure: StatefulSet pods restart whatever the exit code). Succeeded and
Failed are final (except a Failed for an invalid spec, which a fixed spec clears).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from mlsched.api import (
    CleanPodPolicy, Condition, JobConditionType as C, JobPhase, MLJobSpec, get_condition,
    set_condition,
)
from mlsched.controller.objects.preflight import RECHECK_S
from mlsched.controller.objects.records import StsRecord
from mlsched.controller.objects.job_records import INVALID_SPEC, is_final
from mlsched.controller.objects.quantities import parse_time

FINAL = (JobPhase.SUCCEEDED.value, JobPhase.FAILED.value)
#: Running-condition reasons of a job stuck until someone acts (fixes the template, the
#: policy, the cluster): each gets a Warning Event when it starts, and the MLSchedJobsNeedAction
#: alert (manifests/monitoring) watches the jobs that show one.
NEEDS_ACTION = ("Unschedulable", "CannotFit", "PolicyNotFound", "PodsRefused", "PodsCannotStart")
#: Seconds a new job waits for its SchedulingPolicy before it says PolicyNotFound (a Warning
#: Event, the NEEDS_ACTION alert, Argo CD's Degraded). `kubectl apply -k manifests/samples`
#: creates the jobs a moment before their policies (kustomize orders custom kinds by name), and
#: the Warning it used to post then stayed in `kubectl describe` for an hour after the policy
#: had arrived. Meanwhile the job says WaitingForPolicy.
POLICY_GRACE_S = 10.0


@dataclass
class Observed:
    """Everything besides the MLJob itself that the lifecycle depends on."""

    statefulsets: Iterable[StsRecord] = ()
    failures: int = 0  # pod failures seen (container restarts, failed pods)
    last_failure: str | None = None  # the latest: "pod p: container c exited with code 3 (Error)"
    epochs_done: float = 0.0
    policy_exists: bool = True
    created_s: float | None = None  # the job's creationTimestamp (POLICY_GRACE_S), epoch seconds
    # (pod, kube-scheduler's message) for the job's pods the scheduler cannot place
    unschedulable: list[tuple[str, str]] = field(default_factory=list)
    # (pod, node, the pod of ours leaving that node or "" when one just left) for the job's
    # pods refused where such a pod still holds the room (displacement.Vacating): starting
    waiting_for_room: list[tuple[str, str, str]] = field(default_factory=list)
    cannot_fit: str | None = None  # why the job's minimum can never fit the cluster, if so
    # why its minimum does not fit what its namespace's ResourceQuotas have left now, if so
    over_quota: str | None = None
    # why its policy's latest step gave it nothing (waiting.py), if it did
    waiting_for: str | None = None
    # why one of its children (Service, StatefulSet) cannot be created now: the namespace's
    # ResourceQuota has no room for another (apply.ChildOverQuota)
    children_over_quota: str | None = None
    # the API server's latest refusal to create one of its pods (a StatefulSet's FailedCreate)
    pods_refused: str | None = None
    # the API server's refusal of a dry-run create of one of its pods (preflight.py): it is
    # given no capacity until that passes
    would_be_refused: str | None = None
    # (pod, "ImagePullBackOff: Back-off pulling image ...") for the job's pods whose
    # containers the kubelet cannot start (records.STUCK_REASONS)
    cannot_start: list[tuple[str, str]] = field(default_factory=list)
    workers_completed: int = 0  # worker pods whose every container has exited 0
    # Ready pods of each role within its StatefulSet's replicas, from the pods themselves;
    # None: the StatefulSets' readyReplicas. The StatefulSet controller counts them late in a
    # burst (it writes at 20 requests/s by default): 300 new jobs were `Running` a minute
    # after their pods were Ready (issue 55).
    pods_ready: Mapping[str, int] | None = None
    now: datetime = field(default_factory=lambda: datetime.now(UTC).replace(microsecond=0))
    # The sweep's time to the millisecond, for what takes seconds (a rescale on kwok: 0.4 s);
    # None: `now`.
    precise_now: datetime | None = None


@dataclass
class Outcome:
    status: dict[str, Any]  # the status fields the lifecycle owns, wire form
    changed: bool  # differs from the current status: patch it
    scale_to_zero: bool = False  # suspended, or finished with cleanPodPolicy All/Running
    delete_job: bool = False  # ttlSecondsAfterFinished has passed
    events: list[tuple[str, str, str]] = field(default_factory=list)  # (type, reason, message)


#: Status fields a "counts only" change may touch (see only_counts).
COUNT_FIELDS = frozenset({"replicaStatuses", "conditions"})


def only_counts(before: Mapping[str, Any], after: Mapping[str, Any]) -> bool:
    """Whether `after` (the lifecycle's status) differs from `before` only in what counts pods:
    `replicaStatuses` and condition messages ("2/3 worker ready"), with the phase, every
    condition's status and reason, and everything else as they were. Such a change can wait a
    moment to be written together with the next one (jobs.sync_job): in a burst each pod
    turning Ready was a status patch of its own, six per job, and they held the phase changes
    users wait for behind them."""
    for key, value in after.items():
        if before.get(key) == value:
            continue
        if key not in COUNT_FIELDS:
            return False
        if key == "conditions":
            old = {c.get("type"): (c.get("status"), c.get("reason")) for c in before.get(key) or ()}
            new = {c.get("type"): (c.get("status"), c.get("reason")) for c in value or ()}
            if old != new:
                return False
    return True


def _wire(conditions: list[Condition]) -> list[dict]:
    return [c.model_dump(mode="json", by_alias=True, exclude_none=True) for c in conditions]


def _time(dt: datetime) -> str:
    return dt.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _owned(status: Mapping[str, Any]) -> dict[str, Any]:
    keys = ("phase", "conditions", "replicaStatuses", "startTime", "completionTime",
            "observedGeneration")
    return {k: status[k] for k in keys if status.get(k) is not None}


def _final_phase(status: Mapping[str, Any]) -> str | None:
    return status.get("phase") if is_final(status) else None


def invalid(status: Mapping[str, Any], message: str, generation: int, now: datetime) -> Outcome:
    """A spec the operator cannot use: Failed/InvalidSpec until the spec is fixed."""
    conds = set_condition(status.get("conditions"), C.FAILED, True, INVALID_SPEC, message,
                          observed_generation=generation, now=now)
    # The Running condition's reason is the REASON column of `kubectl get mljobs`: without it
    # a job refused at creation showed Failed with an empty REASON, and one refused after an
    # edit kept the reason of the run before (AllRolesReady beside Failed).
    conds = set_condition(conds, C.RUNNING, False, INVALID_SPEC, message,
                          observed_generation=generation, now=now)
    new = {**_owned(status), "phase": JobPhase.FAILED.value, "conditions": _wire(conds),
           "observedGeneration": generation}
    changed = new != _owned(status)
    events = [("Warning", INVALID_SPEC, message)] if changed else []
    return Outcome(new, changed, events=events)


def evaluate(spec: MLJobSpec, generation: int, status: Mapping[str, Any],
             seen: Observed) -> Outcome:
    gen = generation
    run = spec.run_policy
    now = seen.now
    roles = ("ps", "worker") if spec.replica_specs.ps is not None else ("worker",)
    sts = {s.role: s for s in seen.statefulsets}
    desired = {r: sts[r].replicas if r in sts else 0 for r in roles}
    ready = {r: (seen.pods_ready.get(r, 0) if seen.pods_ready is not None
                 else sts[r].ready if r in sts else 0) for r in roles}
    minimum = {r: getattr(spec.replica_specs, r).min for r in roles}
    admitted = all(desired[r] >= minimum[r] > 0 for r in roles)
    start = parse_time(status.get("startTime"))

    old_phase = status.get("phase")
    final = _final_phase(status)
    rescale = track_rescale(status, roles, desired, sts, seen.precise_now or now,
                            ended=bool(final) or run.suspend)
    rescaling = _rescaling_text(rescale.last, roles, ready, desired) if rescale.in_progress else ""
    reason, message = "", ""
    if final:
        phase = final
    elif seen.epochs_done >= spec.epochs:
        phase, reason, message = JobPhase.SUCCEEDED, "EpochsReached", \
            f"trained {seen.epochs_done:g} of {spec.epochs:g} epochs"
    elif desired["worker"] >= minimum["worker"] and seen.workers_completed >= desired["worker"]:
        # Training code that does not report progress ends by exiting 0 on every worker.
        phase, reason, message = JobPhase.SUCCEEDED, "WorkersCompleted", \
            f"all {desired['worker']} workers exited 0"
    elif (run.active_deadline_seconds and start
          and now.timestamp() - start > run.active_deadline_seconds):
        phase, reason, message = JobPhase.FAILED, "DeadlineExceeded", \
            f"running longer than activeDeadlineSeconds={run.active_deadline_seconds}"
    elif run.backoff_limit is not None and seen.failures > run.backoff_limit:
        phase, reason, message = JobPhase.FAILED, "BackoffLimitExceeded", \
            f"{seen.failures} pod failures, backoffLimit={run.backoff_limit}" + (
                f"; the last: {seen.last_failure}" if seen.last_failure else "")
    elif run.suspend:
        phase, reason, message = JobPhase.SUSPENDED, "Suspended", "spec.runPolicy.suspend is true"
    elif admitted and all(ready[r] >= minimum[r] for r in roles):
        phase, reason, message = JobPhase.RUNNING, "AllRolesReady", \
            ", ".join(f"{ready[r]} {r} ready" for r in roles)
        if seen.pods_refused:
            # Running on its minimum while the rest of what was decided cannot be created
            # (a webhook, a quota the operator does not plan with): it used to say
            # AllRolesReady, and an all-reduce job waits for peers that never come.
            reason = "PodsRefused"
            message = (", ".join(f"{ready[r]}/{desired[r]} {r} ready" for r in roles)
                       + f"; the API server refuses to create the rest: {seen.pods_refused}")
        elif seen.cannot_start:
            reason = "PodsCannotStart"
            message = (", ".join(f"{ready[r]}/{desired[r]} {r} ready" for r in roles)
                       + f"; {_cannot_start(seen.cannot_start)}")
        elif rescaling:
            reason, message = C.RESCALING.value, rescaling
    else:
        phase = JobPhase.PENDING
        if not seen.policy_exists and seen.created_s is not None and (
                now.timestamp() - seen.created_s < POLICY_GRACE_S):
            reason, message = "WaitingForPolicy", \
                f"SchedulingPolicy {spec.scheduling_policy!r} does not exist in this namespace " \
                f"yet (a new job waits {POLICY_GRACE_S:g} s for it before it says PolicyNotFound)"
        elif not seen.policy_exists:
            reason, message = "PolicyNotFound", \
                f"SchedulingPolicy {spec.scheduling_policy!r} does not exist in this namespace"
        elif admitted and seen.pods_refused:
            reason, message = "PodsRefused", \
                f"the API server refuses to create its pods: {seen.pods_refused}"
        elif admitted and seen.cannot_start:
            # An image that cannot be pulled, a missing Secret or ConfigMap: the pods hold
            # their nodes and never start. It used to say PodsStarting, its GPUs held.
            reason, message = "PodsCannotStart", _cannot_start(seen.cannot_start)
        elif admitted and seen.unschedulable:
            pod, why = seen.unschedulable[0]
            more = len(seen.unschedulable) - 1
            reason, message = "Unschedulable", f"pod {pod} cannot be scheduled: {why}" + (
                f" (and {more} more pod{'s' * (more > 1)})" if more else "")
        elif admitted:
            reason, message = "PodsStarting", ", ".join(f"{ready[r]}/{desired[r]} {r} ready"
                                                        for r in roles)
            if rescaling:  # its pods restart with new counts: say so, not "starting"
                reason, message = C.RESCALING.value, rescaling
            if seen.waiting_for_room:
                message += "; " + _waiting_for_room(seen.waiting_for_room)
        elif seen.cannot_fit:
            reason, message = "CannotFit", seen.cannot_fit
        elif seen.children_over_quota:
            # It used to show no phase and no condition at all, its create retried every second.
            reason, message = "WaitingForQuota", seen.children_over_quota
        elif seen.would_be_refused:
            # Asked with a dry run before it was given anything: it used to be admitted, every
            # pod refused, its capacity held until its policy's next round.
            reason, message = "PodsRefused", \
                f"the API server would refuse to create its pods: {seen.would_be_refused} " \
                f"(a dry-run create; it is given nothing until its pods would be created, " \
                f"asked again every {RECHECK_S:g} s)"
        elif seen.over_quota:
            reason, message = "WaitingForQuota", seen.over_quota
        elif seen.waiting_for:
            reason, message = "WaitingForAllocation", \
                f"SchedulingPolicy {spec.scheduling_policy!r}: {seen.waiting_for}"
        else:
            reason, message = "WaitingForAllocation", \
                "the scheduling policy has not allocated the minimum of every role yet"
    phase = JobPhase(phase)

    new = dict(_owned(status))
    new.update(phase=phase.value, observedGeneration=gen,
               replicaStatuses={r: {"desired": desired[r], "ready": ready[r]} for r in roles})
    if not final:  # a final job's conditions stay as they were when it finished
        conds: Any = status.get("conditions")

        def put(type_: str, value: bool, why: str, text: str = "") -> None:
            nonlocal conds
            conds = set_condition(conds, type_, value, why, text, observed_generation=gen, now=now)

        counts = ", ".join(f"{desired[r]} {r}" for r in roles)
        if admitted and not seen.policy_exists:
            # Its policy was deleted (or the job edited to name a missing one): it keeps what
            # it holds, but nothing re-decides it. Say so where `kubectl describe` shows it.
            put(C.ADMITTED, True, "PolicyNotFound",
                f"{counts}, kept: SchedulingPolicy {spec.scheduling_policy!r} does not exist in "
                f"this namespace, so nothing re-decides the job until one of that name does")
        else:
            # Not admitted: why not (the policy missing, the job cannot fit), not "0 ps, 0 worker".
            put(C.ADMITTED, admitted, "Allocated" if admitted else reason or "WaitingForAllocation",
                counts if admitted or not message else message)
        put(C.RUNNING, phase == JobPhase.RUNNING, reason or phase.value, message)
        if phase == JobPhase.SUSPENDED or get_condition(conds, C.SUSPENDED):
            put(C.SUSPENDED, phase == JobPhase.SUSPENDED,
                "Suspended" if phase == JobPhase.SUSPENDED else "Resumed", message)
        if rescale.status is not None and rescale.last is not None:
            put(C.RESCALING, rescale.in_progress,
                "CountsChanged" if rescale.in_progress else "Rescaled",
                rescaling or _rescaled_text(rescale.last))
        if phase in (JobPhase.SUCCEEDED, JobPhase.FAILED):
            put(C.SUCCEEDED if phase == JobPhase.SUCCEEDED else C.FAILED, True, reason, message)
        elif get_condition(conds, C.FAILED):  # an InvalidSpec failure whose spec got fixed
            put(C.FAILED, False, "SpecValid", "the spec is valid again")
        new["conditions"] = _wire(conds)
    if rescale.finished:
        # Written only when this sweep ends a rescale: the round that starts one writes it
        # (reporting.py), and a sweep that read the status before that write must not put the
        # older record back.
        new["rescales"] = rescale.status
    if phase == JobPhase.RUNNING and not start:
        new["startTime"] = _time(now)
    if phase.value in FINAL and not status.get("completionTime"):
        new["completionTime"] = _time(now)

    out = Outcome(new, new != _owned(status))
    old_admitted = get_condition(status.get("conditions"), C.ADMITTED)
    # (A Pending job's Running condition says PolicyNotFound too; its Warning comes below.)
    if admitted and not seen.policy_exists and not final and reason != "PolicyNotFound" and (
            old_admitted is None or old_admitted.reason != "PolicyNotFound"):
        out.events.append(("Warning", "PolicyNotFound",
                           f"SchedulingPolicy {spec.scheduling_policy!r} does not exist in this "
                           f"namespace: the job keeps its tasks and is not re-decided"))
    # Stuck for a reason the user must act on: say so once, when it starts.
    old_running = get_condition(status.get("conditions"), C.RUNNING)
    if reason in NEEDS_ACTION and (old_running is None or old_running.reason != reason):
        out.events.append(("Warning", reason, message))
    # The policy a Warning said was missing exists now: say so beside that Warning, which
    # `kubectl describe` keeps showing for an hour (an Event cannot be taken back).
    if seen.policy_exists and not final and any(
            c is not None and c.reason == "PolicyNotFound" for c in (old_running, old_admitted)):
        out.events.append(("Normal", "PolicyFound",
                           f"SchedulingPolicy {spec.scheduling_policy!r} exists now: "
                           f"{message or phase.value}"))
    if phase.value != old_phase and not (old_phase is None and phase == JobPhase.PENDING):
        failed = phase == JobPhase.FAILED
        text = f"{old_phase or 'New'} → {phase.value}" + (f": {message}" if message else "")
        out.events.append(("Warning" if failed else "Normal",
                           reason if failed else phase.value, text))

    out.events += rescale.events
    finished = phase.value in FINAL
    out.scale_to_zero = any(desired.values()) and (
        phase == JobPhase.SUSPENDED or (finished and run.clean_pod_policy != CleanPodPolicy.NONE))
    done_at = parse_time(new.get("completionTime"))
    out.delete_job = bool(finished and run.ttl_seconds_after_finished is not None and done_at
                          and now.timestamp() - done_at >= run.ttl_seconds_after_finished)
    return out


def _waiting_for_room(pods: list[tuple[str, str, str]]) -> str:
    pod, node, leaving = pods[0]
    more = len(pods) - 1
    held = f"which {leaving} is leaving" if leaving else "which a pod of ours has just left"
    return f"pod {pod} waits for room on {node}, {held}" + (
        f" (and {more} more pod{'s' * (more > 1)})" if more else "")


def _cannot_start(pods: list[tuple[str, str]]) -> str:
    pod, why = pods[0]
    more = len(pods) - 1
    return f"pod {pod} cannot start: {why}" + (
        f" (and {more} more pod{'s' * (more > 1)})" if more else "")


# ------------------------------------------------------------------------------ rescales


@dataclass
class RescaleState:
    status: dict[str, Any] | None  # status.rescales (wire form); None: never rescaled
    in_progress: bool = False
    finished: bool = False  # this sweep ended the last one: status.rescales to write
    events: list[tuple[str, str, str]] = field(default_factory=list)

    @property
    def last(self) -> dict[str, Any] | None:
        return (self.status or {}).get("last")


def _ms_time(dt: datetime) -> str:
    """RFC 3339 to the millisecond (metav1.MicroTime's form, shortened): a rescale on a fast
    cluster takes less than the second status times are usually given in."""
    return dt.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _counts(replicas: Mapping[str, int]) -> dict[str, int]:
    return {"ps": int(replicas.get("ps") or 0), "workers": int(replicas.get("worker") or 0)}


def _show(counts: Mapping[str, int], roles: tuple[str, ...]) -> str:
    return ", ".join(f"{counts['ps'] if r == 'ps' else counts['workers']} {r}" for r in roles)


def _rolled_out(sts: Mapping[str, StsRecord], roles: tuple[str, ...],
                desired: Mapping[str, int]) -> bool:
    """Every pod of the new counts exists from the latest template and is Ready, and no pod of
    the old ones is left (readyReplicas alone counts old pods still running)."""
    return all(r in sts and sts[r].observed and sts[r].created == desired[r]
               and sts[r].updated >= desired[r] and sts[r].ready >= desired[r] for r in roles)


def start_rescale(rescales: Mapping[str, Any] | None, before: Mapping[str, int],
                  after: Mapping[str, int], now: datetime) -> dict[str, Any]:
    """status.rescales once a step changed a running job's counts from `before` to `after`
    (role -> count; the round records it with the counts it decided, reporting.py). One that
    had not finished yet ends now: the new counts restart the pods again."""
    out = dict(rescales or {"count": 0, "seconds": 0.0})
    last = out.get("last")
    if last and not last.get("completionTime"):
        out["seconds"] = round(float(out.get("seconds") or 0.0) + _elapsed(last, now), 3)
    out["count"] = int(out.get("count") or 0) + 1
    # None: a status patch is a merge patch, which would keep the finished one's keys.
    out["last"] = {"from": _counts(before), "to": _counts(after), "startTime": _ms_time(now),
                   "completionTime": None, "seconds": None}
    return out


def track_rescale(status: Mapping[str, Any], roles: tuple[str, ...], desired: Mapping[str, int],
                  sts: Mapping[str, StsRecord], now: datetime, ended: bool) -> RescaleState:
    """status.rescales after this sweep: the rescale a step started (start_rescale) ends when
    the StatefulSets have the new counts and every pod of them is Ready (or the job finishes
    or is suspended meanwhile). Events for both ends, also when one sweep sees both."""
    old = status.get("rescales")
    state = RescaleState(dict(old) if isinstance(old, Mapping) else None)
    last = dict(state.last) if state.last else None
    if last is None or last.get("completionTime"):
        return state
    old_cond = get_condition(status.get("conditions"), C.RESCALING)
    announced = old_cond is not None and old_cond.status == "True" and \
        old_cond.message.startswith(f"rescaling {_span(last, roles)}:")
    if not announced:
        state.events.append(("Normal", C.RESCALING.value,
                             f"{_span(last, roles)}: the pods restart with the new counts"))
    if ended or (_counts(desired) == last["to"] and _rolled_out(sts, roles, desired)):
        seconds = _elapsed(last, now)
        last.update(completionTime=_ms_time(now), seconds=round(seconds, 3))
        assert state.status is not None
        state.status["seconds"] = round(float(state.status.get("seconds") or 0.0) + seconds, 3)
        state.status["last"] = last
        state.finished = True
        state.events.append(("Normal", "Rescaled", _rescaled_text(last)))
    else:
        state.in_progress = True
    return state


def _elapsed(last: Mapping[str, Any], now: datetime) -> float:
    begun = parse_time(last.get("startTime")) or now.timestamp()
    return max(0.0, now.timestamp() - begun)


def _span(last: Mapping[str, Any], roles: tuple[str, ...]) -> str:
    """`1 ps, 1 worker → 2 ps, 3 worker`: what every text about a rescale names."""
    return f"{_show(last['from'], roles)} → {_show(last['to'], roles)}"


def _rescaling_text(last: Mapping[str, Any] | None, roles: tuple[str, ...],
                    ready: Mapping[str, int], desired: Mapping[str, int]) -> str:
    if not last:
        return ""
    return (f"rescaling {_span(last, roles)}: "
            + ", ".join(f"{ready.get(r, 0)}/{desired.get(r, 0)} {r} ready" for r in roles))


def _rescaled_text(last: Mapping[str, Any]) -> str:
    roles = ("ps", "worker") if last["from"].get("ps") or last["to"].get("ps") else ("worker",)
    return f"rescaled {_span(last, roles)} in {float(last.get('seconds') or 0):g} s"
