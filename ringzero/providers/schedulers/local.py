"""LocalScheduler: the default scheduler, on one asyncio loop.

Ready processes wait in a heap ordered by (priority, arrival). A slot freed by a running
process goes to the head of the heap, so lower priority numbers run first and equal
priorities take turns in the order they became ready. ``should_yield`` lets the kernel
rotate equal-priority processes at syscall boundaries when slots are scarce.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools

from ringzero.core.errors import InvalidArgument
from ringzero.core.protocols import SchedulerCapabilities

__all__ = ["LocalScheduler"]


class LocalScheduler:
    """Priority scheduler with an optional cap on how many processes run at once."""

    capabilities = SchedulerCapabilities(priorities=True, distributed=False)

    def __init__(self, max_running: int | None = None) -> None:
        if max_running is not None and (not isinstance(max_running, int) or max_running < 1):
            raise InvalidArgument(f"max_running must be a positive integer or None, got {max_running!r}")
        self.max_running = max_running
        self._running: set[int] = set()
        self._ready: list[tuple[int, int, int, asyncio.Future[None]]] = []
        self._arrival = itertools.count()

    @property
    def running(self) -> frozenset[int]:
        return frozenset(self._running)

    @property
    def ready_count(self) -> int:
        return sum(1 for *_, fut in self._ready if not fut.done())

    def _has_slot(self) -> bool:
        return self.max_running is None or len(self._running) < self.max_running

    async def acquire(self, pid: int, priority: int) -> None:
        if self._has_slot() and not self._ready:
            self._running.add(pid)
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._ready, (priority, next(self._arrival), pid, fut))
        try:
            await fut
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():
                # The slot was handed over just as we were cancelled: pass it on.
                self.release(pid)
            raise

    def release(self, pid: int) -> None:
        self._running.discard(pid)
        self._dispatch()

    def _dispatch(self) -> None:
        while self._ready and self._has_slot():
            _, _, pid, fut = heapq.heappop(self._ready)
            if fut.done():  # its waiter was cancelled
                continue
            self._running.add(pid)
            fut.set_result(None)

    def should_yield(self, pid: int, priority: int) -> bool:
        if self._has_slot():
            return False
        while self._ready and self._ready[0][3].done():
            heapq.heappop(self._ready)
        return bool(self._ready) and self._ready[0][0] <= priority
