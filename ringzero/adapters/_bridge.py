"""One place where async ringzero meets frameworks that call synchronously.

``LoopThread.run(coro)`` runs a coroutine on a private event loop in a daemon thread and
waits for it, so a sync caller never blocks (or deadlocks) an event loop of its own. Called
from that private loop itself, it refuses instead of waiting on itself forever.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

from ringzero.core.errors import RingzeroError

__all__ = ["LoopThread"]

T = TypeVar("T")


class LoopThread:
    """A private event loop in a daemon thread, started on first use."""

    def __init__(self, name: str) -> None:
        self._name = name
        self.loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def run(self, coro: Coroutine[Any, Any, T], what: str = "this sync method") -> T:
        with self._lock:
            if self.loop is None:
                loop = asyncio.new_event_loop()
                self._thread = threading.Thread(target=loop.run_forever, name=self._name, daemon=True)
                self._thread.start()
                self.loop = loop
        if threading.current_thread() is self._thread:
            coro.close()
            raise RingzeroError(f"{what} was called from its own event loop thread, where it would wait on "
                                "itself forever: use the async variant there")
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()
