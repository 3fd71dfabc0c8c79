"""The create slots serve waiters by priority, then in arrival order, and a waiter cancelled
while it waits (or just as it was handed a slot) loses no slot."""

from __future__ import annotations

import asyncio

from mlsched.controller.kube.priority_slots import PrioritySlots


def test_waiters_are_served_by_priority_then_in_arrival_order():
    async def scenario():
        slots, served, answered = PrioritySlots(1), [], asyncio.Event()

        async def create(name, priority):
            async with slots.slot(priority):
                served.append(name)
                if name == "first":
                    await answered.wait()
        holder = asyncio.ensure_future(create("first", 2))
        await asyncio.sleep(0)  # holds the only slot
        waiters = [asyncio.ensure_future(create(n, p)) for n, p in
                   (("event-1", 2), ("service-1", 1), ("sts-1", 0), ("event-2", 2), ("sts-2", 0))]
        await asyncio.sleep(0)  # all waiting
        answered.set()
        await asyncio.gather(holder, *waiters)
        return served
    assert asyncio.run(scenario()) == ["first", "sts-1", "sts-2", "service-1", "event-1", "event-2"]


def test_a_cancelled_waiter_loses_no_slot():
    async def scenario():
        slots = PrioritySlots(1)
        async with slots.slot(0):
            waiting = asyncio.ensure_future(slots._acquire(0))
            await asyncio.sleep(0)
            waiting.cancel()
        # The slot went back; and a waiter cancelled after being handed it passes it on.
        async with slots.slot(1):
            handed = asyncio.ensure_future(slots._acquire(0))
            await asyncio.sleep(0)
        handed.cancel()  # handed the slot on release, cancelled before it ran
        try:
            await handed
        except asyncio.CancelledError:
            pass
        await asyncio.wait_for(slots._acquire(0), 1)  # the slot is free again
        return slots._free
    assert asyncio.run(scenario()) == 0


def test_a_tagged_waiter_promoted_goes_after_those_already_at_its_new_priority():
    async def scenario():
        slots, served = PrioritySlots(1), []
        answered = asyncio.Event()

        async def use(name, priority, tag=None):
            async with slots.slot(priority, tag):
                served.append(name)
                await answered.wait()

        holder = asyncio.ensure_future(use("first", 2))
        await asyncio.sleep(0)
        waiters = [asyncio.ensure_future(use(n, p, t)) for n, p, t in
                   (("count-a", 2, "a"), ("count-b", 2, "b"), ("phase", 1, None), ("run", 0, None))]
        await asyncio.sleep(0)
        moved = [slots.promote("b", 1), slots.promote("b", 1), slots.promote("nobody", 0),
                 slots.promote("a", 2)]
        answered.set()
        await asyncio.gather(holder, *waiters)
        return moved, served, slots._tagged, slots._free
    moved, served, tagged, free = asyncio.run(scenario())
    # Moved once (not again to where it is, nor one not waiting, nor down or level).
    assert moved == [True, False, False, False]
    assert served == ["first", "run", "phase", "count-b", "count-a"]
    assert tagged == {} and free == 1
