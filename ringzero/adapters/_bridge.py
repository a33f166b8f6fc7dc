"""One place where async ringzero meets frameworks that call synchronously.

``LoopThread.run(coro)`` runs a coroutine on a private event loop in a daemon thread and
waits for it, so a sync caller never blocks (or deadlocks) an event loop of its own. Called
from that private loop itself, it refuses instead of waiting on itself forever.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any, TypeVar

from ringzero.core.errors import RingzeroError

if TYPE_CHECKING:
    from ringzero.core.context import Context

__all__ = ["LoopThread", "run_in_process"]

T = TypeVar("T")


class LoopThread:
    """A private event loop in a daemon thread, started on first use."""

    def __init__(self, name: str) -> None:
        self._name = name
        self.loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def _started(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self.loop is None:
                loop = asyncio.new_event_loop()
                self._thread = threading.Thread(target=loop.run_forever, name=self._name, daemon=True)
                self._thread.start()
                self.loop = loop
            return self.loop

    def run(self, coro: Coroutine[Any, Any, T], what: str = "this sync method") -> T:
        loop = self._started()
        if threading.current_thread() is self._thread:
            coro.close()
            raise RingzeroError(f"{what} was called from its own event loop thread, where it would wait on "
                                "itself forever: use the async variant there")
        return asyncio.run_coroutine_threadsafe(coro, loop).result()

    def stop(self) -> None:
        """Stop the loop and its thread (a later call starts them again)."""
        with self._lock:
            loop, thread = self.loop, self._thread
            self.loop, self._thread = None, None
        if loop is None or thread is None:
            return
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()

    async def arun(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the private loop and await it from another loop (objects bound to the
        private loop, such as a gate first used by sync calls, stay on it)."""
        loop = self._started()
        if threading.current_thread() is self._thread:
            return await coro
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, loop))


def run_in_process(ctx: Context, coro: Coroutine[Any, Any, T], what: str) -> T:
    """Run a syscall of ``ctx``'s process from a framework's worker thread and wait for it.

    Frameworks that call tools and models synchronously (CrewAI) do so in worker threads that
    inherit the process's Context; the syscall itself must run on the kernel's loop. Called
    on that loop's own thread it would wait on itself, so it refuses with what to do instead.
    """
    try:
        running = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    if running is ctx.loop:
        coro.close()
        raise RingzeroError(f"{what} was called synchronously on the kernel's event loop, which it would block "
                            "forever; run the framework in a worker thread (await asyncio.to_thread(...)) or "
                            "use its async API")
    return asyncio.run_coroutine_threadsafe(coro, ctx.loop).result()
