"""A policy's work conservation over its rounds: status.workConservation, the Ready reason
and the Events, from each round's check (policies/work_conservation.py).            pure

One round that leaves a waiting job's minimum unstarted is not worth a warning: the jobs
may have arrived as the round decided, or a heuristic's settling may be one round behind.
So the Ready condition says `NotWorkConserving` only once it has held for PERSIST_ROUNDS
rounds in a row, and goes back as soon as a round is work conserving; every round's amounts
are in status and the metrics all the same.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mlsched.controller.serving.models import Verdict
from mlsched.policies.work_conservation import IdleCapacity

PERSIST_ROUNDS = 3
REASON = "NotWorkConserving"


def rounds_before(last: Mapping[str, Any] | None) -> int:
    """Consecutive rounds not work conserving before this one, from the status last written
    (or queued): a restarted operator goes on counting."""
    return int((last or {}).get("consecutiveRounds") or 0)


def status_of(idle: IdleCapacity, before: int) -> dict[str, Any]:
    """status.workConservation after a round with this check, `before` rounds in a row not
    work conserving before it."""
    return {"conserving": idle.conserving, "idleGpus": idle.gpus, "idleCpus": idle.cpus,
            "idleTasks": idle.tasks, "fittingJobs": len(idle.jobs),
            "consecutiveRounds": 0 if idle.conserving else before + 1}


def ready(verdict: Verdict, idle: IdleCapacity, rounds: int) -> Verdict:
    """The Ready condition with work conservation taken in: `NotWorkConserving` with the
    amounts once it has held PERSIST_ROUNDS rounds, where Ready had nothing else to say
    (a FallbackActive or a failure says more, and keeps its reason; status still shows the
    amounts)."""
    if rounds < PERSIST_ROUNDS or not (verdict.status and verdict.reason == "Scheduling"):
        return verdict
    return Verdict(True, REASON, message(idle, rounds))


def message(idle: IdleCapacity, rounds: int) -> str:
    return f"for {rounds} rounds in a row; the latest left {idle.describe()}"


def event(before: int, rounds: int, idle: IdleCapacity) -> tuple[str, str, str] | None:
    """(type, reason, message) of the Event to post after a round: a Warning when the
    condition starts to say NotWorkConserving, a Normal `WorkConserving` when a round clears
    it; None otherwise (one Event per change, not one per round)."""
    if rounds == PERSIST_ROUNDS:
        return "Warning", REASON, message(idle, rounds)
    if rounds == 0 and before >= PERSIST_ROUNDS:
        return "Normal", "WorkConserving", (f"work conserving again after {before} rounds that "
                                            "left waiting jobs' minimums unstarted")
    return None
