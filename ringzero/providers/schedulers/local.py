"""LocalScheduler: the default scheduler, on one asyncio loop.

Ready processes wait in a heap ordered by (priority, arrival). A slot freed by a running
process goes to the head of the heap, so lower priority numbers run first and equal
priorities take turns in the order they became ready. ``should_yield`` lets the kernel
rotate equal-priority processes at syscall boundaries when slots are scarce.
"""

from __future__ import annotations

import asyncio

from ringzero.core.contract.errors import InvalidArgument
from ringzero.core.contract.protocols import SchedulerCapabilities
from ringzero.core.support.waitline import PriorityLine

__all__ = ["LocalScheduler"]


class LocalScheduler:
    """Priority scheduler with an optional cap on how many processes run at once."""

    capabilities = SchedulerCapabilities(priorities=True, distributed=False)

    def __init__(self, max_running: int | None = None) -> None:
        if max_running is not None and (not isinstance(max_running, int) or max_running < 1):
            raise InvalidArgument(f"max_running must be a positive integer or None, got {max_running!r}")
        self.max_running = max_running
        self._running: set[int] = set()
        self._ready: PriorityLine[tuple[int, asyncio.Future[None]]] = PriorityLine()

    @property
    def running(self) -> frozenset[int]:
        return frozenset(self._running)

    @property
    def ready_count(self) -> int:
        return len(self._ready)

    def _has_slot(self) -> bool:
        return self.max_running is None or len(self._running) < self.max_running

    async def acquire(self, pid: int, priority: int) -> None:
        if self._has_slot() and not self._ready:
            self._running.add(pid)
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry = self._ready.push(priority, (pid, fut))
        try:
            await fut
        except asyncio.CancelledError:
            self._ready.leave(entry)
            if fut.done() and not fut.cancelled():
                # The slot was handed over just as we were cancelled: pass it on.
                self.release(pid)
            raise

    def release(self, pid: int) -> None:
        self._running.discard(pid)
        self._dispatch()

    def _dispatch(self) -> None:
        while self._ready and self._has_slot():
            pid, fut = self._ready.pop()
            if fut.done():  # its waiter was cancelled and has not left the line yet
                continue
            self._running.add(pid)
            fut.set_result(None)

    def should_yield(self, pid: int, priority: int) -> bool:
        if self._has_slot():
            return False
        head = self._ready.head()
        while head is not None and head.item[1].done():  # a cancelled waiter that has not left yet
            self._ready.leave(head)
            head = self._ready.head()
        return head is not None and head.priority <= priority
