"""Long-running work started and stopped from watch events: one scheduling loop per
SchedulingPolicy, and one lifecycle sweep over every MLJob.

Why not kopf.daemon and kopf.timer: kopf puts its finalizer on every object that has a daemon
or a timer, so an MLJob or SchedulingPolicy could not be deleted while the operator was down,
and kopf's change handlers keep the whole spec in an annotation (256 KiB at most), so a large
pod template made a job impossible to edit or delete. Watch-event handlers need neither: the
operator keeps the latest body of each object itself and compares generations to see edits.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterator, Mapping
from typing import Any

log = logging.getLogger("mlsched.controller.process.supervision")

Key = tuple[str, str]  # (namespace, name)


def key_of(body: Mapping[str, Any]) -> Key:
    meta = body["metadata"]
    return meta.get("namespace", ""), meta["name"]


def plain(value: Any) -> Any:
    """A plain deep copy of a (kopf live-view) object, without managedFields (which nothing
    reads and which can be larger than the rest of the object)."""
    if isinstance(value, Mapping):
        return {k: plain(v) for k, v in value.items() if k != "managedFields"}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    return value


class LiveBody(Mapping[str, Any]):
    """The latest body seen of one object: a round reads it through this view, so a spec edit
    reaches the next round without restarting the loop."""

    def __init__(self, body: Mapping[str, Any]):
        self.current: Mapping[str, Any] = body

    def __getitem__(self, key: str) -> Any:
        return self.current[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.current)

    def __len__(self) -> int:
        return len(self.current)


LoopBody = Callable[[LiveBody, asyncio.Event], Awaitable[None]]


class PolicyLoops:
    """One task per SchedulingPolicy running `loop(body, stopped)`, from its first watch event
    until it is deleted (or the operator stops)."""

    def __init__(self, loop: LoopBody, active: bool = True):
        self._loop = loop
        # A standby replica keeps the bodies but runs no loop until it leads (activate).
        self.active = active
        self._bodies: dict[Key, LiveBody] = {}
        self._stopped: dict[Key, asyncio.Event] = {}
        self._tasks: dict[Key, asyncio.Task] = {}

    def observe(self, body: Mapping[str, Any]) -> bool:
        """A watch event's body. True when the spec was edited since the last event (a new
        generation), so the caller can wake the loop now instead of at its next interval."""
        key = key_of(body)
        body = plain(body)
        if body["metadata"].get("deletionTimestamp"):
            self.stop(key)
            return False
        live = self._bodies.get(key)
        if live is not None and live.current["metadata"].get("uid") != body["metadata"].get("uid"):
            self.stop(key)  # deleted and recreated between two events we saw
            live = None
        if live is None:
            live = self._bodies[key] = LiveBody(body)
            if self.active:
                self._start(key, live)
            return False
        edited = live.current["metadata"].get("generation") != body["metadata"].get("generation")
        live.current = body
        return edited

    def _start(self, key: Key, live: LiveBody) -> None:
        stopped = self._stopped[key] = asyncio.Event()

        async def run() -> None:
            try:
                await self._loop(live, stopped)
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001 - logged; the next event restarts it
                log.exception("SchedulingPolicy %s/%s: scheduling loop died", *key)
            finally:
                if self._tasks.get(key) is task:
                    self._forget(key)

        task = self._tasks[key] = asyncio.get_running_loop().create_task(
            run(), name=f"policy-loop/{key[0]}/{key[1]}")

    def activate(self) -> None:
        """Start a loop for every policy seen so far (a standby has become the leader)."""
        self.active = True
        for key, live in list(self._bodies.items()):
            if key not in self._tasks:
                self._start(key, live)

    def _forget(self, key: Key) -> None:
        self._bodies.pop(key, None)
        self._stopped.pop(key, None)
        self._tasks.pop(key, None)

    def stop(self, key: Key) -> None:
        """Ask the loop to stop (it finishes the step in flight, then cleans up)."""
        stopped = self._stopped.get(key)
        if stopped is not None:
            stopped.set()
        self._forget(key)

    def running(self) -> list[Key]:
        return sorted(self._tasks)

    async def stop_all(self, timeout: float = 10.0) -> None:
        tasks = list(self._tasks.values())
        for key in list(self._tasks):
            self.stop(key)
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=timeout)
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)


async def sweep_forever(step: Callable[[], Awaitable[None]], every_s: float,
                        stopped: asyncio.Event, first_after_s: float | None = None) -> None:
    """Run `step` every `every_s` seconds (the first after `first_after_s`, default `every_s`)
    until `stopped`; a failing step is logged and the sweep goes on (one bad object must not
    stop the lifecycle of all the others)."""
    wait = every_s if first_after_s is None else first_after_s
    while not stopped.is_set():
        try:
            await asyncio.wait_for(stopped.wait(), wait)
            return
        except TimeoutError:
            pass
        wait = every_s
        try:
            await step()
        except Exception:  # noqa: BLE001
            log.exception("lifecycle sweep failed; trying again in %.0f s", every_s)
