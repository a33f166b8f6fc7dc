"""The Scheduler conformance kit: what every Scheduler must do, run against yours.

Subclass ``SchedulerConformance`` and provide a ``scheduler`` fixture that yields a fresh
instance with exactly **one** run slot (so that the order in which waiters get it is visible)::

    class TestMyScheduler(SchedulerConformance):
        @pytest.fixture
        def scheduler(self):
            return MyScheduler(slots=1)

Needs pytest-asyncio (``pytest -p ringzero.compat`` checks it is there). Priority order is
tested only where ``capabilities.priorities`` declares it.
"""

from __future__ import annotations

import asyncio

import pytest

from ringzero.core.contract.protocols import Scheduler, backend_problems
from ringzero.core.support.timeouts import fail_after

__all__ = ["SchedulerConformance"]


async def _settle() -> None:
    """Let every task that can run, run (waiters join the line, handed slots are taken)."""
    for _ in range(5):
        await asyncio.sleep(0)


async def _queue(scheduler: Scheduler, order: list[int], waiters: list[tuple[int, int]]) -> list[asyncio.Task[None]]:
    """Start a waiter per (pid, priority), one after another, each recording when it gets the slot."""
    async def wait_for_slot(pid: int, priority: int) -> None:
        await scheduler.acquire(pid, priority)
        order.append(pid)

    tasks = []
    for pid, priority in waiters:
        tasks.append(asyncio.create_task(wait_for_slot(pid, priority)))
        await _settle()  # arrival order is the order they were started in
    return tasks


async def _drain(scheduler: Scheduler, order: list[int], expected: int) -> None:
    """Release each slot holder in turn until ``expected`` waiters have held the slot."""
    while len(order) < expected:
        before = len(order)
        scheduler.release(order[-1])
        await _settle()
        assert len(order) > before, f"a released slot was not handed on (held so far: {order})"


@pytest.mark.asyncio
class SchedulerConformance:
    """Priorities, fairness among equals, cancellation that leaves no trace, ``should_yield``."""

    async def test_it_is_a_scheduler(self, scheduler: Scheduler) -> None:
        """What ``Kernel(scheduler=...)`` checks: every member of the protocol is there."""
        assert backend_problems(scheduler, Scheduler) == []

    async def test_a_free_slot_is_taken_at_once(self, scheduler: Scheduler) -> None:
        async with fail_after(5):  # a slot that is not free hangs here: the test fails, not the suite
            await scheduler.acquire(1, 10)
            scheduler.release(1)
            await scheduler.acquire(2, 10)
            scheduler.release(2)

    async def test_lower_priority_numbers_get_the_slot_first(self, scheduler: Scheduler) -> None:
        if not scheduler.capabilities.priorities:
            pytest.skip("this scheduler declares no priorities")
        await scheduler.acquire(1, 10)
        order = [1]
        tasks = await _queue(scheduler, order, [(2, 20), (3, 5), (4, 10), (5, 0)])
        await _drain(scheduler, order, 5)
        assert order == [1, 5, 3, 4, 2]
        scheduler.release(order[-1])
        await asyncio.gather(*tasks)

    async def test_equal_priorities_take_turns_in_arrival_order(self, scheduler: Scheduler) -> None:
        await scheduler.acquire(1, 10)
        order = [1]
        tasks = await _queue(scheduler, order, [(pid, 10) for pid in (7, 3, 9, 2)])
        await _drain(scheduler, order, 5)
        assert order == [1, 7, 3, 9, 2]
        scheduler.release(order[-1])
        await asyncio.gather(*tasks)

    async def test_a_cancelled_wait_leaves_no_trace(self, scheduler: Scheduler) -> None:
        await scheduler.acquire(1, 10)
        order = [1]
        [gone, stays] = await _queue(scheduler, order, [(2, 10), (3, 10)])
        gone.cancel()
        await _settle()
        assert gone.cancelled()
        await _drain(scheduler, order, 2)
        assert order == [1, 3], "the slot went to a cancelled waiter"
        assert not scheduler.should_yield(3, 10), "a cancelled waiter still counts as waiting"
        scheduler.release(3)
        await asyncio.wait_for(scheduler.acquire(4, 10), 5)  # the slot is free, nobody holds it
        scheduler.release(4)
        await stays

    async def test_a_wait_cancelled_right_after_hand_off_leaks_no_slot(self, scheduler: Scheduler) -> None:
        """The slot is handed to a waiter whose wait is cancelled before it ever runs again
        (its process was killed): the slot is free afterwards, held by nobody."""
        await scheduler.acquire(1, 10)
        waiter = asyncio.create_task(scheduler.acquire(2, 10))
        await _settle()
        scheduler.release(1)  # handed to pid 2...
        waiter.cancel()  # ...which is cancelled before it could take it
        await asyncio.gather(waiter, return_exceptions=True)
        if not waiter.cancelled():
            scheduler.release(2)  # it had the slot after all, and gives it back
        try:
            await asyncio.wait_for(scheduler.acquire(3, 10), 1)  # a free slot is taken at once
        except asyncio.TimeoutError:
            raise AssertionError("the slot handed to a cancelled wait was never given back") from None
        scheduler.release(3)

    async def test_should_yield_when_an_equal_or_more_urgent_process_waits(self, scheduler: Scheduler) -> None:
        await scheduler.acquire(1, 10)
        assert not scheduler.should_yield(1, 10), "nobody is waiting"
        order = [1]
        tasks = await _queue(scheduler, order, [(2, 10)])
        assert scheduler.should_yield(1, 10), "an equal priority waits"
        if scheduler.capabilities.priorities:
            assert scheduler.should_yield(1, 20), "a more urgent process waits"
            assert not scheduler.should_yield(1, 5), "only a less urgent process waits"
        await _drain(scheduler, order, 2)
        assert not scheduler.should_yield(2, 10)
        scheduler.release(2)
        await asyncio.gather(*tasks)
