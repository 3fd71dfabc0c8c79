"""Writes of whole objects in the background (the retraining dataset's ConfigMaps), retried
until they are done: what status_writer.py does for status records, for plain objects.

A round submits an operation under a key (one record, one deletion) and goes on. The
operations run at most `concurrency` at a time within a token bucket; a failure the API server
may get over (409, 429, 5xx, no connection, missing rights) is retried with exponential backoff
and jitter, never dropped; one it refuses as invalid (400/422) is logged and given up. A newer
operation under the same key replaces one not yet started: operations read what they write
when they run (the record as it is then), so the newer one holds everything the older would
have written. One operation per key runs at a time.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass
from itertools import islice

from mlsched.controller.status_writer import TokenBucket, retryable

log = logging.getLogger("mlsched.controller.object_writer")

Operation = Callable[[], Awaitable[None]]


@dataclass
class _Queued:
    run: Operation
    what: str  # for the log
    attempts: int = 0
    not_before: float = 0.0


class ObjectWriter:
    def __init__(self, *, concurrency: int = 4, rate: float = 20.0, burst: float = 40.0,
                 backoff_s: float = 0.5, max_backoff_s: float = 30.0,
                 on_failure: Callable[[], None] | None = None,
                 clock: Callable[[], float] = time.monotonic):
        self.concurrency = max(1, concurrency)
        self.bucket = TokenBucket(rate, burst, clock)
        self.backoff_s, self.max_backoff_s = backoff_s, max_backoff_s
        self.on_failure = on_failure or (lambda: None)
        self.clock = clock
        self._queue: dict[Hashable, _Queued] = {}
        self._inflight: dict[Hashable, tuple[_Queued, asyncio.Task]] = {}
        self._task: asyncio.Task | None = None
        self._kick: asyncio.Future | None = None

    def submit(self, key: Hashable, run: Operation, what: str = "") -> None:
        old = self._queue.get(key)
        queued = _Queued(run, what or str(key))
        if old is not None:  # replaced, but its backoff stands
            queued.attempts, queued.not_before = old.attempts, old.not_before
        self._queue[key] = queued
        self._start()

    def pending(self) -> int:
        return len(self._queue.keys() | self._inflight.keys())

    async def flush(self, timeout: float | None = None) -> bool:
        """Wait until everything submitted is done (retries included); False on timeout."""
        self._start()
        if not self.pending():
            return True
        try:
            await asyncio.wait_for(asyncio.shield(self._task), timeout)
        except TimeoutError:
            return False
        return not self.pending()

    def _start(self) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # kept; run once a loop runs
        if self._task is None or self._task.done() or self._task.get_loop() is not loop:
            self._task = (loop.create_task(self._work(), name="mlsched-object-writer")
                          if self._queue else None)
        elif self._kick is not None and not self._kick.done():
            self._kick.set_result(None)

    async def _work(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while self._queue or self._inflight:
                now = self.clock()
                free = self.concurrency - len(self._inflight)
                due = (k for k, q in self._queue.items()
                       if k not in self._inflight and q.not_before <= now)
                for key in list(islice(due, max(0, free))):
                    queued = self._queue.pop(key)
                    self._inflight[key] = (queued, loop.create_task(self._run(key, queued)))
                timeout = None
                if len(self._inflight) < self.concurrency:
                    waiting = [q.not_before for k, q in self._queue.items()
                               if k not in self._inflight]
                    timeout = max(0.0, min(waiting) - now) if waiting else None
                self._kick = loop.create_future()
                await asyncio.wait({self._kick, *(t for _, t in self._inflight.values())},
                                   timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for key, (queued, task) in list(self._inflight.items()):
                del self._inflight[key]
                self._queue.setdefault(key, queued)
                task.cancel()

    async def _run(self, key: Hashable, queued: _Queued) -> None:
        try:
            await self.bucket.take()
            await queued.run()
        except asyncio.CancelledError:
            if self._owns(key, queued):
                self._queue.setdefault(key, queued)
            raise
        except Exception as err:  # noqa: BLE001 - every failure is retried or reported here
            self.on_failure()
            if not retryable(err):
                log.error("%s: refused by the API server, not retried: %s", queued.what, err)
                return
            queued.attempts += 1
            delay = min(self.max_backoff_s, self.backoff_s * 2 ** (queued.attempts - 1))
            queued.not_before = self.clock() + delay * (0.5 + random.random() / 2)
            log.warning("%s: not written (attempt %d, again in %.1fs): %s", queued.what,
                        queued.attempts, queued.not_before - self.clock(), err)
            newer = self._queue.get(key)
            if newer is None:
                self._queue[key] = queued
            else:  # the newer one writes what this one would have; it waits out the backoff
                newer.attempts, newer.not_before = queued.attempts, queued.not_before
        finally:
            if self._owns(key, queued):
                del self._inflight[key]

    def _owns(self, key: Hashable, queued: _Queued) -> bool:
        return key in self._inflight and self._inflight[key][0] is queued
