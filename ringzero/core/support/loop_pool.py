"""asyncio's default thread pool, as a kernel's loop has it: a thread blocked waiting for the
loop does not count against the pool's cap.

The documented way (docs/langgraph.md) to run a sync framework (a LangChain ``invoke``, a CrewAI crew, a sync
LangGraph graph) in a kernel process is a worker thread, ``asyncio.to_thread``: a thread of the
loop's default pool, which then blocks while its syscalls run on the loop (``run_on``). What
those syscalls need may itself use that pool (``loop.getaddrinfo`` for a provider's first
connection, ``asyncio.to_thread`` in an executor's first run): with as many processes blocked
as the pool holds (``min(32, cores + 4)``), nothing could run, for good.

``LoopPool`` is ``ThreadPoolExecutor`` with one addition: while one of its threads blocks in
``blocked()`` (every wait for a loop from a thread goes through ``wait_for_loop``), the pool
may hold one more thread, as a work-stealing pool compensates a worker that blocks. The kernel
installs it as its loop's default executor when it starts (``install``); its cap is the
default one for everything else.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

__all__ = ["LoopPool", "LoopStopped", "install", "wait_for_loop"]

STOPPED_LOOP_CHECK = 0.25
"""Seconds between two looks, while a thread waits on a loop it names, at whether it still runs."""


class LoopStopped(RuntimeError):
    """The loop a thread waited on stopped before it ran what was sent to it."""

T = TypeVar("T")
class _ThisThread(threading.local):
    """What this module knows of the calling thread: the LoopPool it belongs to, if any."""

    pool: LoopPool | None = None

    def belongs_to(self, pool: LoopPool) -> None:
        self.pool = pool


_HERE = _ThisThread()


class LoopPool(concurrent.futures.ThreadPoolExecutor):
    """The default executor of a kernel's loop (see the module docstring).

    ``ThreadPoolExecutor`` starts a thread for new work only where none is idle, and counts a
    thread idle each time it finishes a piece of work, even where it goes straight on to the
    next one queued: with every thread blocked on the loop, such a stale count kept the work
    the loop waited for queued for good (48 processes on worker threads, one run in 26 under
    load). This pool counts the work running itself, and where every thread runs something it
    starts one more for work that waits, up to its cap."""

    def __init__(self) -> None:
        super().__init__(thread_name_prefix="asyncio", initializer=self._mark)
        self._running = 0
        """Pieces of work running now (a thread blocked on the loop is running one)."""
        self._counting = threading.Lock()

    def _mark(self) -> None:
        _HERE.belongs_to(self)

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> concurrent.futures.Future[T]:
        future = super().submit(self._counted, fn, *args, **kwargs)
        self._start_one_for_waiting_work()
        return future

    def _counted(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        with self._counting:
            self._running += 1
        try:
            return fn(*args, **kwargs)
        finally:
            with self._counting:
                self._running -= 1

    def _start_one_for_waiting_work(self) -> None:
        """Where work waits and every thread runs something (their idle counts, if any, are
        stale), start a thread, if the cap allows one more."""
        with self._shutdown_lock:
            if self._shutdown or self._work_queue.empty():
                return
            with self._counting:
                all_busy = self._running >= len(self._threads)
            if all_busy and len(self._threads) < self._max_workers:
                while self._idle_semaphore.acquire(timeout=0):  # stale: no thread is idle
                    pass
                self._adjust_thread_count()

    @contextlib.contextmanager
    def blocked(self) -> Iterator[None]:
        """The calling thread, one of this pool's, waits for a loop meanwhile: the pool may
        hold a thread more than its cap, started now for work already queued (queued before
        every thread blocked, it would otherwise wait for good), or for work submitted later."""
        with self._shutdown_lock:
            self._max_workers += 1
        self._start_one_for_waiting_work()
        try:
            yield
        finally:
            with self._shutdown_lock:
                self._max_workers -= 1


def install(loop: asyncio.AbstractEventLoop) -> None:
    """Make a ``LoopPool`` the default executor of ``loop`` (the running kernel's), in place of
    none or of the plain pool asyncio made itself (which goes on with what it runs; new work
    goes to the new one). A pool the application set (``loop.set_default_executor``) is kept."""
    # asyncio has no public word for its loop's default executor, nor for who made it: the
    # private attributes are read, by name, and never written.
    current = getattr(loop, "_default_executor", None)
    made_by_asyncio = type(current) is concurrent.futures.ThreadPoolExecutor and \
        getattr(current, "_thread_name_prefix", None) == "asyncio"
    if current is None or made_by_asyncio:
        loop.set_default_executor(LoopPool())


def wait_for_loop(future: concurrent.futures.Future[T], loop: asyncio.AbstractEventLoop | None = None) -> T:
    """``future.result()`` for a coroutine sent to a loop from this thread: where the thread
    is a ``LoopPool``'s, that pool may start another thread meanwhile. Given ``loop`` (the one
    the coroutine was sent to), a loop that stops first ends the wait with ``LoopStopped``, the
    coroutine cancelled where it had not started: a thread that must not wait for ever (one of
    Monty's few, answering the code's tool calls) never waits on a loop that will not run again."""
    pool = _HERE.pool
    with pool.blocked() if pool is not None else contextlib.nullcontext():
        while loop is not None and not future.done():
            concurrent.futures.wait((future,), timeout=STOPPED_LOOP_CHECK)
            if not future.done() and (loop.is_closed() or not loop.is_running()):
                future.cancel()
                raise LoopStopped("the event loop stopped before it ran what this thread waited for")
        return future.result()
