"""Writes of whole objects in the background (the retraining dataset's ConfigMaps), retried
until they are done: what status_writer.py does for status records, for plain objects.

A round submits an operation under a key (one record, one deletion) and goes on; the shared
write queue (write_queue.py) runs it within its slots and rate and retries it. A newer
operation under the same key replaces one not yet started: operations read what they write
when they run (the record as it is then), so the newer one holds everything the older would
have written, and it waits out the older one's backoff.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass

from mlsched.controller.kube.write_queue import WriteQueue

log = logging.getLogger("mlsched.controller.kube.object_writer")

Operation = Callable[[], Awaitable[None]]


@dataclass
class _Queued:
    run: Operation
    what: str  # for the log
    attempts: int = 0
    not_before: float = 0.0


class ObjectWriter(WriteQueue[_Queued]):
    def __init__(self, *, concurrency: int = 4, rate: float = 20.0, burst: float = 40.0,
                 backoff_s: float = 0.5, max_backoff_s: float = 30.0,
                 on_failure: Callable[[], None] | None = None,
                 clock: Callable[[], float] = time.monotonic):
        super().__init__(name="object-writer", log=log, concurrency=concurrency, rate=rate,
                         burst=burst, backoff_s=backoff_s, max_backoff_s=max_backoff_s,
                         on_failure=on_failure, clock=clock)

    def submit(self, key: Hashable, run: Operation, what: str = "") -> None:
        queued = _Queued(run, what or str(key))
        old = self._queued.get(key)
        if old is not None:  # replaced, but its backoff stands
            queued.attempts, queued.not_before = old.attempts, old.not_before
        self._put(key, queued)

    async def _perform(self, key: Hashable, item: _Queued) -> None:
        await self.bucket.take()
        await item.run()

    def _requeue(self, key: Hashable, item: _Queued) -> None:
        newer = self._queued.get(key)
        if newer is None:
            self._queued[key] = item
        else:  # the newer one writes what this one would have; it waits out the backoff
            newer.attempts, newer.not_before = item.attempts, item.not_before

    def _describe(self, key: Hashable, item: _Queued) -> str:
        return item.what
