"""A scheduler someone else wrote, passing ringzero's Scheduler conformance kit.

``StrictPriorityScheduler`` is a complete Scheduler in thirty lines: one run slot, a heap of
waiters ordered by (priority, arrival). The test class at the bottom is all it takes to run the
kit against it:

    pytest -p ringzero.compat examples/third_party_scheduler.py
"""

from __future__ import annotations

import asyncio
import heapq
import itertools

import pytest

from ringzero.compat.scheduler import SchedulerConformance
from ringzero.core.contract.protocols import SchedulerCapabilities


class StrictPriorityScheduler:
    """One process runs at a time; the most urgent waiter (then the earliest) goes next."""

    capabilities = SchedulerCapabilities(priorities=True, distributed=False)

    def __init__(self) -> None:
        self._holder: int | None = None
        self._waiting: list[tuple[int, int, int, asyncio.Future[None]]] = []
        self._arrivals = itertools.count()

    async def acquire(self, pid: int, priority: int) -> None:
        if self._holder is None and not self._live_waiters():
            self._holder = pid
            return
        slot: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._waiting, (priority, next(self._arrivals), pid, slot))
        try:
            await slot
        except asyncio.CancelledError:
            if slot.done() and not slot.cancelled():  # handed the slot just as it was cancelled
                self.release(pid)
            raise

    def release(self, pid: int) -> None:
        if self._holder == pid:
            self._holder = None
        while self._holder is None and self._waiting:
            _, _, next_pid, slot = heapq.heappop(self._waiting)
            if not slot.done():  # skip waiters that were cancelled
                self._holder = next_pid
                slot.set_result(None)

    def should_yield(self, pid: int, priority: int) -> bool:
        return any(p <= priority for p, _, _, slot in self._waiting if not slot.done())

    def _live_waiters(self) -> bool:
        return any(not slot.done() for *_, slot in self._waiting)


class TestStrictPriorityScheduler(SchedulerConformance):
    @pytest.fixture
    def scheduler(self) -> StrictPriorityScheduler:
        return StrictPriorityScheduler()
