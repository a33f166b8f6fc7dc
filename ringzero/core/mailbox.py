"""A process's mailbox: messages come out by priority (lower first), then in arrival order.

A priority-0 stop request is never stuck behind a queue of priority-10 debug chatter.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from ringzero.core.timeouts import wait_until_set
from ringzero.core.types import JSON
from ringzero.core.waitline import PriorityLine

__all__ = ["Mail", "Mailbox"]


@dataclass(order=True, frozen=True)
class Mail:
    """One delivered message; ``seq`` is its durable id in the process's mailbox."""

    priority: int
    seq: int
    message: JSON = field(compare=False)
    sender: int | None = field(default=None, compare=False)


class Mailbox:
    """An in-memory priority queue mirroring the durable mailbox records."""

    def __init__(self) -> None:
        self._line: PriorityLine[Mail] = PriorityLine()
        self._arrived = asyncio.Event()

    def __len__(self) -> int:
        return len(self._line)

    def put(self, mail: Mail) -> None:
        """Queue ``mail`` (mail is put in ``seq`` order, so arrival order is ``seq`` order)."""
        self._line.push(mail.priority, mail)
        self._arrived.set()

    async def get(self, timeout: float | None = None) -> Mail | None:
        """The most urgent message, waiting up to ``timeout`` seconds (None: forever)."""
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        while not self._line:
            self._arrived.clear()
            remaining = None if deadline is None else deadline - loop.time()
            if remaining is not None and remaining <= 0:
                return None
            if not await wait_until_set(self._arrived, remaining):
                return None
        return self._line.pop()
