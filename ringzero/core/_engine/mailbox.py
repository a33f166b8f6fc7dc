"""A process's mailbox: messages come out by priority (lower first), then in arrival order.

A priority-0 stop request is never stuck behind a queue of priority-10 debug chatter.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from ringzero.core.contract.errors import InvalidArgument
from ringzero.core.contract.outcomes import NONE, Outcome, Value
from ringzero.core.contract.types import JSON, json_size
from ringzero.core.support.timeouts import wait_until_set
from ringzero.core.support.waitline import PriorityLine

__all__ = ["MAX_MESSAGE_BYTES", "Mail", "Mailbox", "check_message"]

MAX_MESSAGE_BYTES = 16 * 1024 * 1024
"""The largest message (its JSON) a mailbox takes: each is stored, and read back at recovery."""


def check_message(pid: int, message: JSON, priority: int) -> None:
    """Refuse, naming what is wrong, a message a mailbox cannot take (or a pid that is none)."""
    size = json_size(message, f"a message to pid {pid}")
    if size > MAX_MESSAGE_BYTES:
        raise InvalidArgument(f"a message to pid {pid} is {size:,} bytes of JSON, over the {MAX_MESSAGE_BYTES:,} a "
                              "mailbox takes: send a reference to the data (a file, a memory key) instead")
    if isinstance(priority, bool) or not isinstance(priority, int) or priority < 0:
        raise InvalidArgument(f"message priority must be a non-negative integer, got {priority!r}")
    if isinstance(pid, bool) or not isinstance(pid, int):
        raise InvalidArgument(f"a message goes to a pid (an integer) or a process's handle, not {pid!r:.80}")


@dataclass(order=True, frozen=True)
class Mail:
    """One delivered message; ``seq`` is its durable id in the process's mailbox."""

    priority: int
    seq: int
    message: JSON = field(compare=False)
    sender: int | None = field(default=None, compare=False)


class Mailbox:
    """An in-memory priority queue mirroring the durable mailbox records.

    Its line and event are made when first needed: most idle processes never get mail, and
    every object a process holds is one more for the garbage collector to walk at 100,000."""

    def __init__(self) -> None:
        self._line: PriorityLine[Mail] | None = None
        self._waiter: asyncio.Future[None] | None = None
        """What the one ``receive`` waiting forever awaits: a bare future, not an event (an
        event is three more objects per idle process: itself, its deque and its ``wait``)."""
        self._arrived: asyncio.Event | None = None
        """For any other wait: one with a timeout, or a second ``receive`` at the same time."""

    def __len__(self) -> int:
        return 0 if self._line is None else len(self._line)

    def pending(self) -> list[int]:
        """The seqs of the messages not received yet."""
        return sorted(mail.seq for mail in self._line.items()) if self._line is not None else []

    def put(self, mail: Mail) -> None:
        """Queue ``mail`` (mail is put in ``seq`` order, so arrival order is ``seq`` order)."""
        if self._line is None:
            self._line = PriorityLine()
        self._line.push(mail.priority, mail)
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)
        if self._arrived is not None:
            self._arrived.set()

    async def receive(self, timeout: float | None = None) -> Outcome:
        """The outcome the ``recv`` syscall journals: ``Value({"seq", "message"})`` for the
        most urgent message, ``NONE`` when ``timeout`` seconds (None: forever) passed
        first. The syscall runs this itself (the bound method, or ``functools.partial`` with a
        timeout), with no closure and no coroutine of its own in every idle process's await
        chain."""
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        while not self._line:
            if deadline is None and self._waiter is None:  # forever, alone: most idle processes
                self._waiter = waiter = loop.create_future()
                try:
                    await waiter
                finally:
                    self._waiter = None
                continue
            if self._arrived is None:
                self._arrived = asyncio.Event()
            self._arrived.clear()
            remaining = None if deadline is None else deadline - loop.time()
            if remaining is not None and remaining <= 0:
                return NONE
            if remaining is None:
                await self._arrived.wait()
            elif not await wait_until_set(self._arrived, remaining):
                return NONE
        mail = self._line.pop()
        if not self._line:  # emptied: the line goes (three objects fewer for every idle process that got mail)
            self._line = None
        return Value({"seq": mail.seq, "message": mail.message})
