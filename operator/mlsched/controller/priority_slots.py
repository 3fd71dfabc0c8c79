"""A semaphore whose waiters are served by priority (lowest first), then in arrival order.

The operator's creates share a few slots (kube.ClientKubeApi). In a burst of new jobs each
job's handler creates its StatefulSets, then its Service and its `Created` Event; served in
arrival order, every job's StatefulSets waited behind the Services and Events of the jobs
before it, though nothing waits on those (a pod needs its DNS name only once it exists, an
Event only informs). Served by priority, the StatefulSets of a burst go first.
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

    @contextlib.asynccontextmanager
    async def slot(self, priority: int) -> AsyncIterator[None]:
        await self._acquire(priority)
        try:
            yield
        finally:
            self._release()

    async def _acquire(self, priority: int) -> None:
        if self._free > 0 and not self._waiting:
            self._free -= 1
            return
        granted = asyncio.get_running_loop().create_future()
        heapq.heappush(self._waiting, (priority, next(self._order), granted))
        try:
            await granted
        except asyncio.CancelledError:
            if granted.done() and not granted.cancelled():
                self._release()  # handed a slot as it was cancelled: pass it on
            raise

    def _release(self) -> None:
        while self._waiting:
            _, _, granted = heapq.heappop(self._waiting)
            if not granted.done():  # (a cancelled waiter's future is done)
                granted.set_result(None)
                return
        self._free += 1
