"""The event-loop lag probe, the collector's timer and the freeze-after-full-collection rule."""

from __future__ import annotations

import asyncio
import gc
import logging
import time
import weakref

import pytest
from prometheus_client import CollectorRegistry

from mlsched.controller.process import loop_health
from mlsched.controller.process.loop_health import LoopHealth


def _sample(registry: CollectorRegistry, name: str, **labels: str) -> float:
    value = registry.get_sample_value(name, labels or None)
    return 0.0 if value is None else value


class LoopTime:
    """The watcher's clock and sleep, driven by the test: each of its sleeps returns at once,
    `late_by[i]` seconds later than it asked for (the loop blocked that long), and runs
    `between[i]` first (what the process does meanwhile). After the last scripted sleep the
    watcher is stopped, so it makes exactly len(late_by) measurements."""

    def __init__(self, stopped: asyncio.Event, late_by: list[float], between=None):
        self.now = 1000.0
        self.stopped = stopped
        self.late_by = list(late_by)
        self.between = dict(between or {})
        self.sleeps = 0

    def clock(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        i = self.sleeps
        self.sleeps += 1
        if i in self.between:
            self.between[i]()
        self.now += seconds + self.late_by[i]
        if self.sleeps == len(self.late_by):
            self.stopped.set()
        await asyncio.sleep(0)


def _watch(health: LoopHealth, late_by: list[float], between=None) -> LoopTime:
    async def scenario():
        loop_time = LoopTime(asyncio.Event(), late_by, between)
        await health.watch(loop_time.stopped, clock=loop_time.clock, sleep=loop_time.sleep)
        return loop_time

    return asyncio.run(scenario())


@pytest.fixture
def collector_restored():
    threshold = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*threshold)
    loop_health._tuned = False


def test_a_blocked_loop_is_measured_and_logged(caplog):
    registry = CollectorRegistry()
    health = LoopHealth(registry)

    # The second wake-up comes 1.4 s late: what a long synchronous step does to every task.
    with caplog.at_level(logging.WARNING, logger="mlsched.controller.process.loop_health"):
        _watch(health, [0.0, 1.4, 0.02])
    assert health.worst_s == pytest.approx(1.4)
    assert _sample(registry, "mlsched_event_loop_lag_seconds_count") == 3
    assert _sample(registry, "mlsched_event_loop_lag_seconds_bucket", le="1.0") == 2
    assert _sample(registry, "mlsched_event_loop_lag_seconds_sum") == pytest.approx(1.42)
    warned = [r.getMessage() for r in caplog.records]
    assert len(warned) == 1 and "event loop was blocked for 1.4 s" in warned[0]
    assert health.gc not in gc.callbacks  # removed when the watcher stops


def test_the_default_clock_measures_a_real_block():
    """The same with the loop's real time (one short block, no scripted clock)."""
    health = LoopHealth(CollectorRegistry())

    async def scenario():
        stopped = asyncio.Event()
        task = asyncio.create_task(health.watch(stopped))
        await asyncio.sleep(0)  # the watcher is asleep, due PERIOD_S from now
        time.sleep(loop_health.PERIOD_S + 0.05)  # a synchronous step holds the loop past that
        await asyncio.sleep(0)
        stopped.set()
        await task

    asyncio.run(scenario())
    assert health.worst_s >= 0.04


def test_every_collection_is_timed_by_generation():
    registry = CollectorRegistry()
    health = LoopHealth(registry)
    health.gc.install()
    try:
        gc.collect(0)
        gc.collect(2)
    finally:
        health.gc.remove()
    assert _sample(registry, "mlsched_gc_pause_seconds_count", generation="0") >= 1
    assert _sample(registry, "mlsched_gc_pause_seconds_count", generation="2") >= 1
    assert health.gc.full_collections >= 1 and health.gc.paused_s > 0


def test_survivors_of_a_full_collection_are_frozen_once_tuned(collector_restored):
    loop_health.tune_collector()
    assert gc.get_threshold()[0] == loop_health.GEN0_THRESHOLD
    frozen_at_start = gc.get_freeze_count()
    assert frozen_at_start > 0  # the imports
    health = LoopHealth(CollectorRegistry())
    kept = [{"job": i, "history": [{"interval": k} for k in range(5)]} for i in range(5000)]
    # As CPython starts one when the long-lived objects grew by a quarter, during a sleep.
    _watch(health, [0.0, 0.0], between={0: gc.collect})
    assert gc.get_freeze_count() >= frozen_at_start + len(kept)


def test_untuned_processes_are_never_frozen(collector_restored):
    # Tests, and programs embedding the operator, keep the collector as they set it.
    health = LoopHealth(CollectorRegistry())
    _watch(health, [0.0, 0.0], between={0: gc.collect})
    assert health.gc.full_collections >= 1  # the watcher saw it, and froze nothing
    assert gc.get_freeze_count() == 0


def test_refreeze_reclaims_cycles_that_died_while_frozen(collector_restored):
    class Node:
        pass

    a, b = Node(), Node()
    a.other, b.other = b, a  # a cycle: only the collector frees it
    alive = weakref.ref(a)
    gc.collect()
    gc.freeze()
    del a, b
    gc.collect()
    assert alive() is not None  # frozen: the collector does not look at it
    loop_health.refreeze()
    assert alive() is None


def test_a_round_holds_the_collector_off_and_gives_it_back_raised_or_not():
    """collection_paused: no automatic collection inside (nested blocks too: admission and a
    round may overlap), the collector back on when the last block is left, even by an
    exception, and left off if it was off before."""
    assert gc.isenabled()
    with loop_health.collection_paused():
        assert not gc.isenabled()
        with loop_health.collection_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()  # the outer block is still in its round
    assert gc.isenabled()
    with pytest.raises(RuntimeError):
        with loop_health.collection_paused():
            raise RuntimeError("a policy bug")
    assert gc.isenabled()
    gc.disable()
    try:
        with loop_health.collection_paused():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_no_collection_runs_inside_a_paused_round_and_they_resume_after():
    started: list[int] = []

    def count(phase: str, info: dict) -> None:
        if phase == "start":
            started.append(info["generation"])

    def make_cycles() -> None:
        for _ in range(50_000):  # well past any young threshold
            a: list = []
            a.append(a)

    gc.callbacks.append(count)
    try:
        with loop_health.collection_paused():
            make_cycles()
            assert started == []
        make_cycles()
        assert started  # the collector runs on its own again
    finally:
        gc.callbacks.remove(count)
