"""A scheduler of this package's own: a heap of waiters over a fixed number of run slots."""

from __future__ import annotations

import asyncio
import heapq
import itertools

from ringzero import SchedulerCapabilities


class HeapScheduler:
    """Lower priority numbers first, equal ones in arrival order; a freed slot is handed to the
    head of the heap."""

    capabilities = SchedulerCapabilities(priorities=True, distributed=False)

    def __init__(self, slots: int = 1) -> None:
        self.free = slots
        self.waiting: list[tuple[int, int, int, asyncio.Future[None]]] = []
        self.arrivals = itertools.count()

    async def acquire(self, pid: int, priority: int) -> None:
        if self.free and not self.waiting:
            self.free -= 1
            return
        handed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry = (priority, next(self.arrivals), pid, handed)
        heapq.heappush(self.waiting, entry)
        try:
            await handed
        except asyncio.CancelledError:
            self.left(entry)
            raise

    def left(self, entry: tuple[int, int, int, asyncio.Future[None]]) -> None:
        """A wait was cancelled: out of the heap, and a slot handed to it an instant before goes on."""
        if entry in self.waiting:
            self.waiting.remove(entry)
            heapq.heapify(self.waiting)
        elif entry[3].done() and not entry[3].cancelled():
            self.release(entry[2])

    def release(self, pid: int) -> None:
        while self.waiting:
            *_, handed = heapq.heappop(self.waiting)
            if not handed.done():
                handed.set_result(None)  # the slot goes straight to the head of the heap
                return
        self.free += 1

    def should_yield(self, pid: int, priority: int) -> bool:
        return any(waiting[0] <= priority and not waiting[3].done() for waiting in self.waiting)
