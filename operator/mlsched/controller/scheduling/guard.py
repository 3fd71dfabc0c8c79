"""The regret guard in the operator (spec.guard): each policy's closed intervals kept as
records, the latest `window` of them judged at every closed interval once there are that many
(a rolling window: policies/regret_guard.py's rule over sim/regret_replay.py's estimates),
and what that means for the round: who serves, the GuardTripped condition, status.guard, the
Events and the metric.

- The judgement is made at the start of a round, from the intervals it closed, before the
  round decides: a trip serves the fallback from this very round on.
- The replay's cluster is the one the window ran on: the node names and (median) node shape
  of the snapshot of the round before (`remember`), and the spec's interval.
- A change of who serves (a trip, a clear, a spec edit) starts the window empty, so a window
  is always served by one policy: the one whose replay is checked against what the records
  say it achieved (the estimate's error). Rolling costs a replay per round (two simulations
  of `window` intervals, in a thread) where non-overlapping windows cost one per `window`.
- An estimate that fails (the window cannot be replayed: jobs of models the simulator lacks,
  a job that cannot run on the replayed nodes; or any error in the replay) is reported as
  GuardTripped=Unknown with why, and changes nothing: the model keeps serving. The guard
  never stops a round.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import UTC, datetime

import numpy as np

from mlsched.cluster.types import Snapshot
from mlsched.policies.decision_log import IntervalRecord
from mlsched.policies.regret_guard import (
    FALLBACK, LEARNED, Estimate, GuardSpec, GuardState, judge, on_generation,
)
from mlsched.sim.regret_replay import estimate, mean_start_s
from mlsched.sim.simulator import SimConfig

log = logging.getLogger("mlsched.controller.scheduling.guard")

TRIPPED, CLEARED = "GuardTripped", "GuardCleared"
REASONS = {"tripped": "FallbackAhead", "serving": "ModelServing", "waiting": "CollectingWindow",
           "failed": "EstimateFailed"}


@dataclass
class GuardBook:
    """One policy's guard between rounds."""

    spec: GuardSpec
    state: GuardState = field(default_factory=GuardState)
    records: list[IntervalRecord] = field(default_factory=list)
    failure: str | None = None  # why the latest window could not be judged
    cluster: tuple[SimConfig, list[str]] | None = None  # the replay's cluster (`remember`)
    # Per record (interval number), the served round's cycle guard's memory when it closed:
    # the replay of a window primes its own guard with that of its first interval.
    memories: dict[int, dict] = field(default_factory=dict)
    # What a job's start from nothing cost on this cluster, policy seconds (the latest window
    # that showed one: regret_replay.mean_start_s): a window without a start replays with it.
    start_s: float | None = None


@dataclass(frozen=True)
class GuardVerdict:
    status: str  # "True" | "False" | "Unknown"
    reason: str
    message: str


def replay_cluster(snapshot: Snapshot, interval_s: float) -> tuple[SimConfig, list[str]] | None:
    """The cluster a window is replayed on: the snapshot's nodes, each of the median shape
    (the simulator's nodes are alike); None with no node."""
    if not snapshot.node_names:
        return None
    cap = np.asarray(snapshot.capacity, dtype=float)
    cpus, gpus, mem = (float(np.median(cap[:, k])) for k in range(3))
    # served_round: the operator settles a heuristic fallback's rounds (run_served_round), so
    # the replay of the fallback does too.
    return (SimConfig(nodes=len(snapshot.node_names), node_cpus=cpus, node_gpus=gpus,
                      node_mem_gib=mem, interval_s=interval_s, admission="arrival",
                      served_round=True),
            list(snapshot.node_names))


def book_for(books: dict, key, spec: GuardSpec) -> GuardBook:
    """The policy's book; a new window when the guard's spec changed (threshold or window),
    the state kept, so that the edit's generation clears a trip with its Event (on_edit)."""
    book = books.get(key)
    if book is None or book.spec != spec:
        book = books[key] = GuardBook(spec, book.state if book else GuardState())
    return book


def on_edit(book: GuardBook, generation: int | None, now: float) -> bool:
    """A spec edit re-enables the model; True when that cleared a trip."""
    was = book.state.tripped
    book.state = on_generation(book.state, generation, now)
    if was and not book.state.tripped:
        book.records = []
        return True
    return False


def add_and_judge(book: GuardBook, closed: list[IntervalRecord], learned: tuple, fallback: tuple,
                  now: float, memory: dict | None = None) -> str | None:
    """Add the intervals a round closed; judge the latest `window` of them when there are
    that many and the round closed one with jobs (the window rolls). `memory`: the policy's
    cycle guard's (CycleGuard.remembered) as the intervals close. Returns "tripped" or
    "cleared" when that changed who serves, else None. Never raises."""
    fresh = [r for r in closed if r.jobs]  # an idle interval says nothing
    book.records = [*book.records, *fresh][-book.spec.window:]
    for r in fresh:
        book.memories[r.interval] = dict(memory or {})
    book.memories = {r.interval: book.memories.get(r.interval, {}) for r in book.records}
    if not fresh or len(book.records) < book.spec.window:
        return None
    window = book.records
    ran = FALLBACK if book.state.tripped else LEARNED
    try:
        if book.cluster is None:
            raise ValueError("no snapshot of the cluster the window ran on yet")
        config, names = book.cluster
        measured = mean_start_s(window)
        if measured is not None:
            book.start_s = measured
        found = estimate(window, config, names, learned, fallback, ran,
                         book.memories.get(window[0].interval), book.start_s, operator=True)
    except Exception as err:  # noqa: BLE001 - a failed estimate must not stop scheduling
        log.warning("regret guard: the window could not be replayed: %s", err)
        book.failure = f"{type(err).__name__}: {err}" if not isinstance(err, ValueError) else str(err)
        return None
    book.failure = None
    was = book.state.tripped
    book.state = judge(book.state, found, book.spec, now)
    if book.state.tripped != was:
        book.records = []  # the next window is served by the policy now serving
        return "tripped" if book.state.tripped else "cleared"
    return None


def verdict(book: GuardBook) -> GuardVerdict:
    last = book.state.last
    if book.failure:
        return GuardVerdict("Unknown", REASONS["failed"], f"the window could not be estimated, "
                                                          f"the model keeps serving: {book.failure}")
    if book.state.tripped:
        return GuardVerdict("True", REASONS["tripped"],
                            f"the fallback serves: {last.describe() if last else ''}")
    if last is None:
        return GuardVerdict("False", REASONS["waiting"],
                            f"{len(book.records)} of {book.spec.window} intervals closed before "
                            "the first judgement")
    return GuardVerdict("False", REASONS["serving"], f"the model serves: {last.describe()}")


def event(change: str | None, edited: bool, book: GuardBook) -> tuple[str, str, str] | None:
    """(type, reason, message) of the Event for a change of who serves."""
    if change == "tripped":
        return "Warning", TRIPPED, verdict(book).message
    if change == "cleared":
        return "Normal", CLEARED, f"the model serves again: {book.state.last.describe()}"
    if edited:
        return "Normal", CLEARED, "the model serves again: the policy's spec was edited"
    return None


def status_of(book: GuardBook) -> dict:
    """status.guard."""
    last: Estimate | None = book.state.last
    since = (datetime.fromtimestamp(book.state.since, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
             if book.state.since is not None else None)
    out = {"tripped": book.state.tripped, "since": since, "window": book.spec.window,
           "intervals": len(book.records), "message": verdict(book).message[:1024]}
    if last is not None:
        out.update(learnedEstimate=round(last.learned, 6), fallbackEstimate=round(last.fallback, 6),
                   recorded=round(last.recorded, 6), served=last.ran,
                   estimateError=round(last.error, 6) if np.isfinite(last.error) else None)
    return out


def learned_serves(resolved) -> bool:
    """Whether a learned model decides allocation or placement (what the guard replaces)."""
    return any(getattr(p, "card", None) is not None for p in (resolved.allocation, resolved.placement))


def fallback_of(resolved) -> tuple:
    """(allocation, placement) the fallback serves: spec.fallback, and load-balance in place of
    a learned placement (models.ResolvedPolicy.fallback_placement), as after a failed phase."""
    from mlsched.policies import registry

    return (registry.make_allocation(resolved.fallback),
            resolved.fallback_placement or resolved.placement)


def serve_fallback(resolved, book: GuardBook) -> None:
    """While tripped, the round (and admission steps) run the fallback: `resolved` is changed
    in place (it is this round's), Ready says FallbackActive with the guard's message."""
    from mlsched.controller.serving.models import Verdict

    resolved.allocation, resolved.placement = fallback_of(resolved)
    resolved.ready = Verdict(True, "FallbackActive", f"regret guard: {verdict(book).message}")
