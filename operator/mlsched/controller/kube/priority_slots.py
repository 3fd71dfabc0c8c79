"""A semaphore whose waiters are served by priority (lowest first), then in arrival order.

The operator's creates share a few slots (kube.ClientKubeApi). In a burst of new jobs each
job's handler creates its StatefulSets, then its Service and its `Created` Event; served in
arrival order, every job's StatefulSets waited behind the Services and Events of the jobs
before it, though nothing waits on those (a pod needs its DNS name only once it exists, an
Event only informs). Served by priority, the StatefulSets of a burst go first.

A waiter may carry a tag, by which it can be moved up while it waits (`promote`): a job's
pod-count patch queued last must not keep the job's next evaluation, which may find it
Running, waiting behind every other patch (jobs.sync_job).
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
from collections.abc import AsyncIterator


class PrioritySlots:
    def __init__(self, slots: int):
        self._free = slots
        self._waiting: list[tuple[int, int, asyncio.Future]] = []
        self._order = itertools.count()
        self._tagged: dict[object, tuple[int, asyncio.Future]] = {}  # tag → waiting at

    @contextlib.asynccontextmanager
    async def slot(self, priority: int, tag: object = None) -> AsyncIterator[None]:
        await self._acquire(priority, tag)
        try:
            yield
        finally:
            self._release()

    def promote(self, tag: object, priority: int) -> bool:
        """The waiter tagged `tag`, if one waits at a lower priority, now waits at `priority`
        (after those already waiting there). Whether one was moved."""
        waiting = self._tagged.get(tag)
        if waiting is None or waiting[0] <= priority or waiting[1].done():
            return False
        # Pushed again; its old entry stays in the heap and is skipped, its future done.
        heapq.heappush(self._waiting, (priority, next(self._order), waiting[1]))
        self._tagged[tag] = (priority, waiting[1])
        return True

    async def _acquire(self, priority: int, tag: object = None) -> None:
        if self._free > 0 and not self._waiting:
            self._free -= 1
            return
        granted = asyncio.get_running_loop().create_future()
        heapq.heappush(self._waiting, (priority, next(self._order), granted))
        if tag is not None:
            self._tagged[tag] = (priority, granted)
        try:
            await granted
        except asyncio.CancelledError:
            if granted.done() and not granted.cancelled():
                self._release()  # handed a slot as it was cancelled: pass it on
            raise
        finally:
            if tag is not None and self._tagged.get(tag, (0, None))[1] is granted:
                del self._tagged[tag]

    def _release(self) -> None:
        while self._waiting:
            _, _, granted = heapq.heappop(self._waiting)
            if not granted.done():  # (a cancelled waiter's future is done)
                granted.set_result(None)
                return
        self._free += 1
