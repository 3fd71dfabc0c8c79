"""The per-interval record: what each job was given and what it earned. Pure.

A round opens an interval for every job it decided on, remembering the job's epochs at that
moment; the next round closes it with the epochs reported since. The reward of one job is
(epochs trained in the interval) / (its total epochs), and the policy's reward for the interval
is the sum over its jobs: DL²'s reward, and the one the simulator pays.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from mlsched.api import HistoryEntry, Placement, RewardEntry


@dataclass(frozen=True)
class Grant:
    """What one round gave one job, and where the job stood when the interval began."""

    ps: int
    workers: int
    placement: Mapping[str, Any]  # Placement in wire form
    epochs_at_start: float
    total_epochs: float


@dataclass
class OpenInterval:
    number: int
    start: datetime
    grants: dict[str, Grant] = field(default_factory=dict)  # job name → grant


@dataclass
class ClosedInterval:
    history: dict[str, dict[str, Any]]  # job name → HistoryEntry in wire form
    reward: dict[str, Any]  # RewardEntry in wire form


def job_reward(epochs_trained: float, total_epochs: float) -> float:
    return epochs_trained / total_epochs if total_epochs > 0 else 0.0


def close(interval: OpenInterval, epochs_now: Mapping[str, float]) -> ClosedInterval:
    """Close `interval` with each job's epochs now. Jobs deleted meanwhile (absent from
    `epochs_now`) have no object to record on and are left out of the sum as well."""
    history, total, scheduled = {}, 0.0, 0
    for name, grant in interval.grants.items():
        if name not in epochs_now:
            continue
        trained = max(0.0, epochs_now[name] - grant.epochs_at_start)
        reward = job_reward(trained, grant.total_epochs)
        total += reward
        scheduled += grant.workers > 0
        entry = HistoryEntry(interval=interval.number, start=interval.start, ps=grant.ps,
                             workers=grant.workers, placement=Placement(**grant.placement),
                             epochs=trained, reward=reward)
        history[name] = entry.to_k8s()
    summary = RewardEntry(interval=interval.number, start=interval.start, reward=total,
                          jobs=scheduled)
    return ClosedInterval(history=history, reward=summary.to_k8s())


def next_interval_number(rewards: list[Mapping[str, Any]] | None,
                         histories: Iterable[Sequence[Mapping[str, Any]]] = ()) -> int:
    """Continue the numbering a previous operator run left in the policy's and its jobs'
    status. The jobs' histories count too: a run killed while recording an interval may
    have written it into some jobs' history but not yet into the policy's rewards, and
    reusing its number would record that interval twice on those jobs."""
    last = int(rewards[-1].get("interval", -1)) if rewards else -1
    for history in histories:
        if history:  # entries are appended in interval order: the newest is last
            last = max(last, int(history[-1].get("interval", -1)))
    return last + 1


def utc(ts: float) -> datetime:
    return datetime.fromtimestamp(ts, UTC).replace(microsecond=0)
