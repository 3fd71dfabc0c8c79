"""The per-interval record: what each job was given and what it earned. Pure.

A round opens an interval for every job it decided on, remembering the job's epochs at that
moment; the next round closes it with the epochs reported since. The open interval is also
written into each job's `status.openInterval` (`open_status`), so that the first round after
an operator restart closes it (`restore`) instead of losing its reward. The reward of one job is
(epochs trained in the interval) / (its total epochs), and the policy's reward for the interval
is the sum over its jobs: DL²'s reward, and the one the simulator pays.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from mlsched.api import HistoryEntry, InvalidObject, Placement, RewardEntry
from mlsched.api import OpenInterval as OpenIntervalStatus


@dataclass(frozen=True)
class Grant:
    """What one round gave one job, and where the job stood when the interval began."""

    ps: int
    workers: int
    placement: Mapping[str, Any]  # Placement in wire form
    epochs_at_start: float
    total_epochs: float
    # When these counts were given, if after the interval began (an admission step's grant):
    # a speed reported before it was measured at other counts.
    since: float | None = None


@dataclass
class OpenInterval:
    number: int
    start: datetime  # whole seconds, as status records it
    grants: dict[str, Grant] = field(default_factory=dict)  # job name → grant
    # The exact time the round opened it (None when restored from status): `start` is cut to
    # the second, which under --interval-scale 0.005 is up to 200 s of the policy's 1200.
    started_s: float | None = None

    def length_s(self, end: float, interval_scale: float = 1.0) -> float:
        """The interval's length in the policy's time when it closes at `end` (wall time):
        under --interval-scale, wall seconds / the scale. The dataset's records and the
        regret guard's both use this."""
        began = self.started_s if self.started_s is not None else self.start.timestamp()
        return max(0.0, end - began) / (interval_scale or 1.0)


@dataclass
class ClosedInterval:
    history: dict[str, dict[str, Any]]  # job name → HistoryEntry in wire form
    reward: dict[str, Any]  # RewardEntry in wire form


def job_reward(epochs_trained: float, total_epochs: float) -> float:
    return epochs_trained / total_epochs if total_epochs > 0 else 0.0


#: (time of the report, epochs/s, samples/s) of a job's latest progress report.
Measured = tuple[float | None, float, float | None]


def close(interval: OpenInterval, epochs_now: Mapping[str, float],
          measured: Mapping[str, Measured] | None = None) -> ClosedInterval:
    """Close `interval` with each job's epochs now. Jobs deleted meanwhile (absent from
    `epochs_now`) have no object to record on and are left out of the sum as well. A job that
    reported its speed during the interval has it recorded: its speed at this interval's
    counts, as the job itself measured it."""
    history, total, scheduled = {}, 0.0, 0
    began = interval.start.timestamp()
    for name, grant in interval.grants.items():
        if name not in epochs_now:
            continue
        trained = max(0.0, epochs_now[name] - grant.epochs_at_start)
        reward = job_reward(trained, grant.total_epochs)
        total += reward
        scheduled += grant.workers > 0
        at, speed, samples = (measured or {}).get(name) or (None, 0.0, None)
        fresh = at is not None and at >= max(began, grant.since or began)
        entry = HistoryEntry(interval=interval.number, start=interval.start, ps=grant.ps,
                             workers=grant.workers, placement=Placement(**grant.placement),
                             epochs=trained, reward=reward,
                             speed=speed if fresh and speed > 0 else None,
                             samples_per_second=samples if fresh else None)
        history[name] = entry.to_k8s()
    summary = RewardEntry(interval=interval.number, start=interval.start, reward=total,
                          jobs=scheduled)
    return ClosedInterval(history=history, reward=summary.to_k8s())


def open_status(number: int, start: datetime, grant: Grant) -> dict[str, Any]:
    """`status.openInterval` of a job granted `grant` in interval `number` (wire form)."""
    return OpenIntervalStatus(interval=number, start=start, ps=grant.ps, workers=grant.workers,
                              placement=Placement(**grant.placement),
                              epochs_at_start=grant.epochs_at_start).to_k8s()


def restore(jobs: Iterable[Any]) -> list[OpenInterval]:
    """The intervals a previous operator run opened and never closed, from the jobs'
    `status.openInterval` (job_records.JobRecord), oldest first. One per interval number: a run
    killed while recording may have left some jobs one interval behind the others. An
    interval a job's history already holds is closed already and not restored."""
    restored: dict[int, OpenInterval] = {}
    for job in jobs:
        saved = job.open_interval
        if not saved:
            continue
        try:
            status = OpenIntervalStatus.model_validate(saved)
        except (ValueError, InvalidObject):  # unreadable: nothing to close it with
            continue
        if any(h.get("interval") == status.interval for h in job.history):
            continue
        interval = restored.setdefault(status.interval, OpenInterval(status.interval,
                                                                     status.start))
        placement = status.placement.to_k8s() if status.placement else {}
        interval.grants[job.name] = Grant(status.ps, status.workers, placement,
                                          status.epochs_at_start, job.epochs)
    return [restored[n] for n in sorted(restored)]


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
