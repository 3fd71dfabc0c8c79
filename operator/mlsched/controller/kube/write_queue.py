"""The background write queue both writers share: keyed work, a few at a time, retried.

status_writer.py (status records) and object_writer.py (the retraining dataset's ConfigMaps)
queue work under a key per object and go on. One background task runs the queue on the
current event loop: at most `concurrency` keys at a time, one item per key at a time, each
write taking a token from a bucket of `rate` per second. A failure the API server may get over
(409, 429, 5xx, no connection, missing rights) is retried with exponential backoff and jitter,
never dropped; one it refuses as invalid (400/422) is logged and given up. What a subclass
decides is what an item is, how it is written (`_perform`) and how an item that was not
written goes back beside whatever was queued for its key meanwhile (`_requeue`).
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Callable, Hashable
from itertools import islice
from typing import Generic, Protocol, TypeVar

from mlsched.controller.kube.kube import KubeError
from mlsched.controller.kube.token_bucket import TokenBucket


def retryable(err: BaseException) -> bool:
    """Everything but the API server refusing the write itself (a bug to log, not to repeat):
    conflicts, throttling, server errors, lost connections, missing rights (fixable)."""
    return not (isinstance(err, KubeError) and err.rejected)


class Retried(Protocol):
    attempts: int
    not_before: float  # monotonic seconds: backing off until then


Item = TypeVar("Item", bound=Retried)


class WriteQueue(Generic[Item]):
    def __init__(self, *, name: str, log: logging.Logger, concurrency: int, rate: float,
                 burst: float, backoff_s: float = 0.5, max_backoff_s: float = 30.0,
                 on_failure: Callable[[], None] | None = None,
                 clock: Callable[[], float] = time.monotonic):
        self.name, self.log = name, log
        self.concurrency = max(1, concurrency)
        self.bucket = TokenBucket(rate, burst, clock)
        self.backoff_s, self.max_backoff_s = backoff_s, max_backoff_s
        self.on_failure = on_failure or (lambda: None)
        self.clock = clock
        self._queued: dict[Hashable, Item] = {}
        self._inflight: dict[Hashable, tuple[Item, asyncio.Task]] = {}
        self._task: asyncio.Task | None = None
        self._kick: asyncio.Future | None = None

    # ---- what a subclass decides ----------------------------------------------------------
    async def _perform(self, key: Hashable, item: Item) -> None:
        """Write `item`, taking a token from `self.bucket` for each API call; raise to retry."""
        raise NotImplementedError

    def _requeue(self, key: Hashable, item: Item) -> None:
        """Put back an item that was not written, beside what was queued for `key` since."""
        raise NotImplementedError

    def _describe(self, key: Hashable, item: Item) -> str:
        return str(key)

    # ---- queueing -------------------------------------------------------------------------
    def _put(self, key: Hashable, item: Item, *, first: bool = False) -> None:
        """Queue `item`; with `first`, ahead of everything queued (O(queued): for the rare
        item that must not wait behind a round's thousands)."""
        if first:
            self._queued = {key: item, **{k: v for k, v in self._queued.items() if k != key}}
        else:
            self._queued[key] = item
        self._start()

    def pending(self) -> int:
        """Keys with something not yet written (in flight included)."""
        return len(self.pending_keys())

    def pending_keys(self) -> set[Hashable]:
        """Which keys those are."""
        return self._queued.keys() | self._inflight.keys()

    async def flush(self, timeout: float | None = None) -> bool:
        """Wait until everything queued is written (retries included); False on timeout."""
        self._start()
        if not self.pending():
            return True
        try:
            await asyncio.wait_for(asyncio.shield(self._task), timeout)
        except TimeoutError:
            return False
        return not self.pending()

    # ---- the background task --------------------------------------------------------------
    def _start(self) -> None:
        """Run the queue on the current event loop (a new task per loop: tests run each step
        in its own asyncio.run, and what a cancelled task held stays queued)."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # kept; written once a loop runs
        if self._task is None or self._task.done() or self._task.get_loop() is not loop:
            self._task = (loop.create_task(self._work(), name=f"mlsched-{self.name}")
                          if self._queued else None)
        elif self._kick is not None and not self._kick.done():
            self._kick.set_result(None)

    async def _work(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while self._queued or self._inflight:
                now = self.clock()
                free = self.concurrency - len(self._inflight)
                # Only as far into the queue as there are free slots: this runs each time a
                # write completes, and a round queues one record per job (thousands), so a
                # full scan each time cost O(jobs²) per round (py-spy: 10 % of the operator
                # at 2,000 jobs).
                due = (k for k, item in self._queued.items()
                       if k not in self._inflight and item.not_before <= now)
                for key in list(islice(due, max(0, free))):
                    item = self._queued.pop(key)
                    self._inflight[key] = (item, loop.create_task(self._run(key, item)))
                timeout = None
                if len(self._inflight) < self.concurrency:  # a slot is free: wake for a backoff
                    waiting = [item.not_before for k, item in self._queued.items()
                               if k not in self._inflight]
                    timeout = max(0.0, min(waiting) - now) if waiting else None
                self._kick = loop.create_future()
                await asyncio.wait({self._kick, *(t for _, t in self._inflight.values())},
                                   timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            # Stopped (the event loop is closing, maybe already closed: nothing to await any
            # more): what was in flight goes back to the queue, for the next task to write.
            for key, (item, task) in list(self._inflight.items()):
                del self._inflight[key]
                self._requeue(key, item)
                task.cancel()

    async def _run(self, key: Hashable, item: Item) -> None:
        try:
            await self._perform(key, item)
        except asyncio.CancelledError:
            if self._owns(key, item):  # else the stopping task put it back already
                self._requeue(key, item)
            raise
        except Exception as err:  # noqa: BLE001 - every failure is retried or reported here
            self.on_failure()
            what = self._describe(key, item)
            if not retryable(err):
                self.log.error("%s: refused by the API server, not retried: %s", what, err)
                return
            item.attempts += 1
            delay = min(self.max_backoff_s, self.backoff_s * 2 ** (item.attempts - 1))
            item.not_before = self.clock() + delay * (0.5 + random.random() / 2)
            self.log.warning("%s: not written (attempt %d, again in %.1fs): %s", what,
                             item.attempts, item.not_before - self.clock(), err)
            self._requeue(key, item)
        finally:
            if self._owns(key, item):
                del self._inflight[key]

    def _owns(self, key: Hashable, item: Item) -> bool:
        return key in self._inflight and self._inflight[key][0] is item
