"""Catching a host tool that stalls the event loop: which tool, for how long, and what to do.

A sync tool runs in a thread of its pool, but a tool that holds the GIL for a long C call
(``sum(range(10**9))``, a regex on a hostile input) stops every thread of the host, the event
loop's included: no other agent's syscall, no heartbeat, no wall limit runs meanwhile. The
cure is to declare it ``@ringzero.cpu_bound`` (it then runs in a worker process); this module
makes the need visible.

While a pool has tools running on a loop, a ticker on that loop wakes every ``TICK`` seconds
and reads how much CPU time each tool's thread has used. A tick that comes more than ``STALL``
seconds late means the loop was held; the tool whose thread used most of that time (at least
half of it) held it. That stall is logged (logger ``ringzero.tools``) with the tool's name and
the advice, counted, and shown by ``ringzero top`` (the pool's ``stats()``). The ticker stops
when no tool runs: an idle host pays nothing.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import threading
import time
import weakref
from dataclasses import dataclass
from typing import Any

__all__ = ["STALL", "TICK", "StallWatch", "Watched", "watch_stalls"]

log = logging.getLogger("ringzero.tools")
TICK = 0.02
"""Seconds between two looks while tools run."""
STALL = 0.1
"""A loop held longer than this by a tool is a stall worth a warning."""


@dataclass(eq=False)
class Watched:
    """One tool call as the watch sees it; ``started`` and ``ended`` run on the tool's thread."""

    name: str
    thread: int = 0
    cpu_seen: float = 0.0
    """Its thread's CPU seconds when last looked at (at its start, then at each tick)."""
    cpu_end: float | None = None
    ended_at: float = 0.0

    def started(self) -> None:
        self.thread, self.cpu_seen = threading.get_ident(), time.thread_time()

    def ended(self) -> None:
        self.cpu_end, self.ended_at = time.thread_time(), time.monotonic()


class StallWatch:
    """The tools of one pool as they run, and the stalls caught while they did."""

    def __init__(self) -> None:
        self.count = 0
        self.last: tuple[str, float] | None = None
        """The tool that held the loop last, and for how many seconds."""
        self.last_at = 0.0
        self._lock = threading.Lock()
        self._active: set[Watched] = set()
        self._ended: collections.deque[Watched] = collections.deque(maxlen=64)
        self._loops: weakref.WeakSet[asyncio.AbstractEventLoop] = weakref.WeakSet()

    def start(self, call: Watched) -> None:
        """On the tool's thread, as it starts."""
        call.started()
        with self._lock:
            self._active.add(call)

    def end(self, call: Watched) -> None:
        """On the tool's thread, as it returns."""
        call.ended()
        with self._lock:
            self._active.discard(call)
            self._ended.append(call)

    def _calls(self, since: float) -> tuple[list[Watched], list[Watched]]:
        with self._lock:
            return list(self._active), [c for c in self._ended if c.ended_at >= since]

    def record(self, tool: str, seconds: float) -> None:
        self.count += 1
        self.last, self.last_at = (tool, round(seconds, 3)), time.time()
        log.warning("host tool %s held the event loop for %.2f s: a tool that holds the GIL stops every agent on "
                    "this host; declare it @ringzero.cpu_bound so that it runs in a worker process", tool, seconds)

    def stats(self) -> dict[str, Any]:
        shown: dict[str, Any] = {"stalls": self.count}
        if self.last is not None:
            shown["stalled_by"], shown["stall_s"] = self.last
        return shown


def watch_stalls(loop: asyncio.AbstractEventLoop, watch: StallWatch) -> None:
    """Make sure ``loop`` has a ticker for ``watch`` while its tools run."""
    if loop not in watch._loops:
        watch._loops.add(loop)
        _Ticker(loop, watch).schedule()


class _Ticker:
    def __init__(self, loop: asyncio.AbstractEventLoop, watch: StallWatch) -> None:
        self.loop, self.watch = loop, watch
        self.due = self.last = loop.time()

    def schedule(self) -> None:
        self.last = self.loop.time()
        self.due = self.last + TICK
        self.loop.call_at(self.due, self.tick)

    def tick(self) -> None:
        late = self.loop.time() - self.due
        active, ended = self.watch._calls(since=self.last - TICK)
        used = []
        for call in active:
            now = _thread_cpu(call.thread)
            if now is not None:
                used.append((now - call.cpu_seen, call.name))
                call.cpu_seen = now
        used += [(call.cpu_end - call.cpu_seen, call.name) for call in ended if call.cpu_end is not None]
        if late > STALL and used:
            burnt, tool = max(used)
            if burnt >= late / 2:
                self.watch.record(tool, late)
        if active:
            self.schedule()
        else:  # nothing runs: the next tool call starts the ticker again
            self.watch._loops.discard(self.loop)


def _thread_cpu(thread: int) -> float | None:
    """CPU seconds the thread has used, or None once it is gone."""
    with contextlib.suppress(OSError, OverflowError, ValueError):
        return time.clock_gettime(time.pthread_getcpuclockid(thread))
    return None
