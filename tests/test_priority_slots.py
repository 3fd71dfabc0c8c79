"""The create slots serve waiters by priority, then in arrival order, and a waiter cancelled
while it waits (or just as it was handed a slot) loses no slot."""

from __future__ import annotations

import asyncio

from mlsched.controller.priority_slots import PrioritySlots


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
