"""Status building blocks shared by both kinds: metav1-style conditions and bounded histories.

Conditions follow `metav1.Condition` (the Kueue / Trainer v2 convention) field for field, with
the same validation patterns, so `kubectl wait --for=condition=Ready` and generic tooling
(Argo CD health, kstatus) read them without special cases.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any, TypeVar

from pydantic import Field

from mlsched.api.base import StatusModel

# metav1.Condition's own validation patterns (type: qualified name; reason: CamelCase token).
CONDITION_TYPE_PATTERN = (
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])$"
)
CONDITION_REASON_PATTERN = r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$"

#: Hard cap of every per-interval list in status. The CRD enforces it (maxItems); the
#: SchedulingPolicy's `historyLimit` trims below it. 1000 entries of ~200 bytes stay far under
#: etcd's 1.5 MiB object limit.
MAX_HISTORY = 1000


class ConditionStatus(StrEnum):
    TRUE = "True"
    FALSE = "False"
    UNKNOWN = "Unknown"


class Condition(StatusModel):
    """One aspect of the object's state (metav1.Condition)."""

    type: str = Field(pattern=CONDITION_TYPE_PATTERN, max_length=316,
                      description="CamelCase condition type, e.g. Running or Ready.")
    status: ConditionStatus
    reason: str = Field(pattern=CONDITION_REASON_PATTERN, min_length=1, max_length=1024,
                        description="CamelCase machine-readable reason of the last transition.")
    message: str = Field("", max_length=32768, description="Human-readable details.")
    last_transition_time: datetime = Field(
        description="When status last changed (not when the condition was last written).")
    observed_generation: int | None = Field(
        None, ge=0, description="metadata.generation the condition was computed from.")


def utcnow() -> datetime:
    """Now, in UTC, truncated to seconds like metav1.Time, so round trips compare equal."""
    return datetime.now(UTC).replace(microsecond=0)


def _as_conditions(conditions: Iterable[Condition | Mapping[str, Any]] | None) -> list[Condition]:
    return [c if isinstance(c, Condition) else Condition.model_validate(dict(c))
            for c in conditions or ()]


def get_condition(conditions: Iterable[Condition | Mapping[str, Any]] | None,
                  type_: str) -> Condition | None:
    return next((c for c in _as_conditions(conditions) if c.type == type_), None)


def is_condition_true(conditions: Iterable[Condition | Mapping[str, Any]] | None,
                      type_: str) -> bool:
    cond = get_condition(conditions, type_)
    return cond is not None and cond.status == ConditionStatus.TRUE


def set_condition(
    conditions: Iterable[Condition | Mapping[str, Any]] | None,
    type_: str,
    status: ConditionStatus | str | bool,
    reason: str,
    message: str = "",
    *,
    observed_generation: int | None = None,
    now: datetime | None = None,
) -> list[Condition]:
    """A new list with the condition of `type_` added or replaced; the input is not modified.

    lastTransitionTime moves only when `status` changes: readers use it to tell how long a
    condition has held, so rewriting reason or message must not reset it.
    Accepts models or raw dicts (as found in a kopf body); `status` may be a bool.
    """
    if isinstance(status, bool):
        status = ConditionStatus.TRUE if status else ConditionStatus.FALSE
    status = ConditionStatus(status)
    current = _as_conditions(conditions)
    old = next((c for c in current if c.type == type_), None)
    changed_at = old.last_transition_time if old and old.status == status else (now or utcnow())
    new = Condition(type=type_, status=status, reason=reason, message=message,
                    last_transition_time=changed_at, observed_generation=observed_generation)
    if old is None:
        return [*current, new]
    return [new if c.type == type_ else c for c in current]


T = TypeVar("T")


def append_bounded(entries: Iterable[T] | None, entry: T, limit: int) -> list[T]:
    """Append; keep the newest `limit` entries (at most MAX_HISTORY, which the CRD enforces)."""
    limit = max(1, min(limit, MAX_HISTORY))
    return [*(entries or ()), entry][-limit:]
