"""How long the operator's event loop is blocked, and how much of that is the garbage collector.

Everything the operator does (watch events, rounds, the progress endpoint, /metrics, /healthz)
runs on one asyncio loop, so anything that holds it for seconds delays all of it and can fail
the liveness probe. Two measurements, both exported as metrics:

- `mlsched_event_loop_lag_seconds`: a task asks to wake up every `PERIOD_S` and records how
  late it woke. A lag above `WARN_S` is also logged, with the collector's share of it.
  `mlsched_event_loop_lag_worst_seconds` is the longest since start.
- `mlsched_gc_pause_seconds{generation}`: every collection, timed through `gc.callbacks`.

And one remedy, `tune_collector` (called by `python -m mlsched.controller` only: the collector
is process-wide). With thousands of jobs the operator holds a few million long-lived objects
(job bodies, index records, kopf's per-object state) that are almost never cyclic garbage, yet
every full collection walks all of them (0.1-1 s each at 2,000 jobs), and while jobs keep
arriving CPython starts one each time the long-lived objects grew by a quarter: back to back
during a burst. After each full collection the watcher calls `gc.freeze()`, which moves what
survived into a generation the collector never scans, so the next full collection walks only
what arrived since. Cyclic garbage among frozen objects (an object that was alive when frozen
and later became part of an unreachable cycle) is reclaimed by `refreeze` every `REFREEZE_S`:
one scan of the whole heap then, instead of one per quarter of growth. JSON-shaped data, most of
the heap, has no cycles and is freed by reference counting whether frozen or not.

And `collection_paused`, around a round's snapshot and decision (loop.py): a round of 10,000
jobs allocates about a million short-lived objects (job views, states, grants), which start
sixty young collections and a few older ones that walk the round's own live objects again and
again: 90-180 ms of a one-second round. They are acyclic and freed by reference counting when
the round ends, so the collector is held off for the round and runs once after it, when they
are gone.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import threading
import time
from collections.abc import Awaitable, Callable
from contextlib import contextmanager
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Gauge, Histogram

log = logging.getLogger(__name__)

PERIOD_S = 0.25
WARN_S = 1.0
#: How often frozen objects are scanned for cyclic garbage (one full-heap collection each time).
REFREEZE_S = 1800.0
#: Young collections are cheap but frequent; with a larger first threshold a burst of watch
#: events (each a few hundred container objects) triggers a tenth as many.
GEN0_THRESHOLD = 7000

LAG_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
GC_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


@dataclass
class GcTimer:
    """Times every collection through `gc.callbacks`: the running total, the longest, and how
    many were full (generation 2) collections."""

    histogram: Histogram
    paused_s: float = 0.0
    longest_s: float = 0.0
    full_collections: int = 0
    _started: float | None = field(default=None, repr=False)

    def __call__(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        elif self._started is not None:
            took = time.perf_counter() - self._started
            self._started = None
            self.paused_s += took
            self.longest_s = max(self.longest_s, took)
            if info.get("generation") == 2:
                self.full_collections += 1
            self.histogram.labels(str(info.get("generation", ""))).observe(took)

    def install(self) -> None:
        if self not in gc.callbacks:
            gc.callbacks.append(self)

    def remove(self) -> None:
        if self in gc.callbacks:
            gc.callbacks.remove(self)


class LoopHealth:
    """The lag probe and the collector's timer, registered on the operator's metrics."""

    def __init__(self, registry: CollectorRegistry):
        self.lag = Histogram("mlsched_event_loop_lag_seconds",
                             "How late the event loop ran a task due now (blocked that long)",
                             buckets=LAG_BUCKETS, registry=registry)
        self.gc = GcTimer(Histogram("mlsched_gc_pause_seconds",
                                    "Garbage collections, by generation",
                                    ["generation"], buckets=GC_BUCKETS, registry=registry))
        self.worst_s = 0.0
        Gauge("mlsched_event_loop_lag_worst_seconds", "The longest event-loop lag since start",
              registry=registry).set_function(lambda: self.worst_s)

    async def watch(self, stopped: asyncio.Event, *,
                    clock: Callable[[], float] = time.monotonic,
                    sleep: Callable[[float], Awaitable[object]] = asyncio.sleep) -> None:
        """Until `stopped`. `clock` and `sleep` are the loop's time (tests pass a fake one)."""
        self.gc.install()
        frozen_after = self.gc.full_collections
        last_refreeze = clock()
        try:
            while not stopped.is_set():
                due = clock() + PERIOD_S
                gc_before = self.gc.paused_s
                await sleep(PERIOD_S)
                late = max(0.0, clock() - due)
                self.lag.observe(late)
                self.worst_s = max(self.worst_s, late)
                if late > WARN_S:
                    log.warning("the event loop was blocked for %.1f s (garbage collection %.1f s "
                                "of it)", late, self.gc.paused_s - gc_before)
                if not _tuned:
                    continue
                if clock() - last_refreeze > REFREEZE_S:
                    refreeze()
                    last_refreeze = clock()
                elif self.gc.full_collections > frozen_after:
                    gc.freeze()  # (not from the callback: the collector is still running there)
                frozen_after = self.gc.full_collections
        finally:
            self.gc.remove()


_tuned = False


def tune_collector() -> None:
    """At startup: fewer young collections, the imports frozen out of every later scan, and
    from now on the watcher freezes the survivors of each full collection."""
    global _tuned
    _tuned = True
    _, gen1, gen2 = gc.get_threshold()
    gc.set_threshold(GEN0_THRESHOLD, gen1, gen2)
    gc.collect()
    gc.freeze()


def refreeze() -> None:
    """Reclaim cyclic garbage among the frozen objects, then freeze what is alive again."""
    gc.unfreeze()
    gc.collect()
    gc.freeze()


_pause_lock = threading.Lock()
_pauses = 0  # rounds inside collection_paused now (admission and a round may overlap)
_resume = False  # whether the collector was on when the first of them began


@contextmanager
def collection_paused():
    """No automatic garbage collection while inside (the collector is process-wide: the
    event loop's other work goes uncollected too, for the second or so a round takes); it
    resumes, if it was on, when the last such block is left, raised or not."""
    global _pauses, _resume
    with _pause_lock:
        if _pauses == 0:
            _resume = gc.isenabled()
            gc.disable()
        _pauses += 1
    try:
        yield
    finally:
        with _pause_lock:
            _pauses -= 1
            if _pauses == 0 and _resume:
                gc.enable()
