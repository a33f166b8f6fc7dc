"""Where plain (sync) host tools run: a bounded pool of daemon threads, never the event loop's
shared default executor, and, for tools declared :func:`cpu_bound`, a pool of processes.

Why a pool of its own: a tool that blocks (a socket with no timeout, a lock held forever) keeps
its thread after its run's wall limit ended the wait; on the loop's default executor enough of
them starve everything else that uses it (``loop.getaddrinfo``, ``asyncio.to_thread``). Here
they starve only this pool: at most ``threads`` tools run at once, a call beyond that waits in
line (its run's wall limit still ends the wait), and a tool still running after its caller
stopped waiting is counted in ``overrunning``, logged, shown by ``ringzero top`` until it
returns, and replaced by a fresh thread (up to ``overrun_limit`` such tools). Its thread is a
daemon: a tool that never returns does not keep the host from exiting.

A pure-Python tool that holds the GIL in one C call (``sum(range(10**9))``) stops every thread
of the host, the event loop's included, whatever thread it runs in. Declare such a tool
:func:`cpu_bound` and it runs in a worker process instead (it must be importable by name, as
``concurrent.futures.ProcessPoolExecutor`` requires).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import logging
import multiprocessing
import queue
import threading
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

__all__ = ["DEFAULT_TOOL_THREADS", "TOOL_THREAD_NAME", "ToolPool", "cpu_bound", "is_cpu_bound", "pools_in_use",
           "shared_pool"]

log = logging.getLogger("ringzero.tools")
F = TypeVar("F", bound=Callable[..., Any])
DEFAULT_TOOL_THREADS = 8
TOOL_THREAD_NAME = "ringzero-tool"
"""The name of every thread of a tool pool."""
"""Sync host tools one pool runs at once unless its owner says otherwise."""


def cpu_bound(tool: F) -> F:
    """Declare a sync host tool CPU-bound: it runs in a worker process, so that holding the GIL
    (a long pure-Python or C loop) cannot freeze the host's event loop. The tool, its arguments
    and its result must be picklable; it must be a module-level function."""
    tool.__ringzero_cpu_bound__ = True  # type: ignore[attr-defined]
    return tool


def is_cpu_bound(tool: Any) -> bool:
    return any(getattr(t, "__ringzero_cpu_bound__", False) for t in (tool, getattr(tool, "func", None)))


@dataclass(eq=False)
class _Job:
    call: Callable[[], Any]
    name: str
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[Any]
    started: bool = False
    finished: bool = False
    abandoned: bool = False  # its caller stopped waiting
    jobs: queue.SimpleQueue[_Job | None] | None = None  # the queue it was put on
    outcome: tuple[bool, Any] = field(default=(False, None))


class ToolPool:
    """Runs sync host tools in at most ``threads`` daemon threads (and tools declared
    :func:`cpu_bound` in at most ``processes`` worker processes). Threads start as calls need
    them and stay for the next call."""

    def __init__(self, threads: int = DEFAULT_TOOL_THREADS, processes: int = 2) -> None:
        if not isinstance(threads, int) or isinstance(threads, bool) or threads < 1:
            raise ValueError(f"a tool pool needs at least one thread, not {threads!r}")
        self.threads = threads
        self.processes = processes
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._workers = 0
        self._idle = 0
        self._queued = 0
        self.running = 0
        """Tools running in this pool's threads now."""
        self.overrunning = 0
        """Of those, the ones whose caller stopped waiting (its run's wall limit ended): each
        still holds a thread until it returns, and the pool starts another in its place."""
        self.overrun_limit = 4 * threads
        """Past this many tools overrunning, no thread replaces one: calls wait in line."""
        self._process_pool: ProcessPoolExecutor | None = None

    async def run(self, tool: Callable[..., Any], args: list[Any], kwargs: dict[str, Any]) -> Any:
        """Call ``tool(*args, **kwargs)`` here and wait for its result, in the caller's context
        (a kernel process's ``ctx`` is seen by the tool). Cancelling the wait leaves a tool that
        has started to finish on its own, counted in ``overrunning``."""
        if is_cpu_bound(tool):
            return await self._in_process(tool, args, kwargs)
        loop = asyncio.get_running_loop()
        context = contextvars.copy_context()
        job = _Job(functools.partial(context.run, tool, *args, **kwargs),
                   str(getattr(tool, "__name__", None) or type(tool).__name__), loop, loop.create_future())
        with self._lock:
            jobs = job.jobs = self._jobs
            self._queued += 1
            grow = self._queued > self._idle and self._workers < self.threads \
                and self.overrunning < self.overrun_limit
            if grow:
                self._workers += 1
                self._idle += 1
        if grow:
            threading.Thread(target=self._work, args=(jobs,), name=TOOL_THREAD_NAME, daemon=True).start()
        jobs.put(job)
        try:
            return await job.future
        except asyncio.CancelledError:
            with self._lock:
                job.abandoned = True
                overran = job.started and not job.finished
                if overran:  # its thread leaves the pool's count: the next call may start another
                    self.overrunning += 1
                    self._workers -= job.jobs is self._jobs
            if overran:
                log.warning("host tool %s still runs after its caller stopped waiting (a run's wall limit); "
                            "%d such tools hold a thread each (past %d, calls wait for a thread)", job.name,
                            self.overrunning, self.overrun_limit)
            raise

    def _work(self, jobs: queue.SimpleQueue[_Job | None]) -> None:
        """One thread of the pool, serving ``jobs`` (the queue of the pool as it was when the
        thread started: once the pool is closed, its threads finish what they hold and leave)."""
        while True:
            job = jobs.get()
            if job is None:
                return
            with self._lock:
                current = jobs is self._jobs
                self._queued -= current
                self._idle -= current
                skip = job.abandoned
                job.started = not skip
                self.running += not skip
            if not skip:
                try:
                    job.outcome = (True, job.call())
                except BaseException as exc:
                    job.outcome = (False, exc if isinstance(exc, Exception) else as_exception(exc))
                with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits any more
                    job.loop.call_soon_threadsafe(_settle, job)
            with self._lock:
                job.finished = True
                self.running -= not skip
                if job.abandoned and not skip:  # it had left the count: back in, if there is room
                    self.overrunning -= 1
                    if self._workers >= self.threads or jobs is not self._jobs:
                        return
                    self._workers += 1
                elif jobs is not self._jobs:  # the pool was closed meanwhile
                    return
                self._idle += 1

    async def _in_process(self, tool: Callable[..., Any], args: list[Any], kwargs: dict[str, Any]) -> Any:
        if self._process_pool is None:
            # forkserver: a worker never inherits the host's threads, locks or event loop
            self._process_pool = ProcessPoolExecutor(self.processes, mp_context=multiprocessing.get_context(
                "forkserver"))
        future = self._process_pool.submit(tool, *args, **kwargs)
        try:
            return await asyncio.wrap_future(future)
        except asyncio.CancelledError:
            if not future.done():
                log.warning("CPU-bound host tool %s still runs in a worker process after its caller stopped "
                            "waiting", getattr(tool, "__name__", tool))
            raise

    def close(self) -> None:
        """Let idle threads end and stop the worker processes; tools still running finish on
        their own (their threads are daemons). The pool may be used again: it starts afresh."""
        with self._lock:
            jobs, workers = self._jobs, self._workers
            self._jobs = queue.SimpleQueue()
            self._workers = self._idle = self._queued = 0
        for _ in range(workers):
            jobs.put(None)
        if self._process_pool is not None:
            pool, self._process_pool = self._process_pool, None
            pool.shutdown(wait=False, cancel_futures=True)

    def stats(self) -> dict[str, int]:
        """What ``ringzero top`` shows: threads, tools running, tools past their caller's wait."""
        return {"threads": self.threads, "running": self.running, "overrunning": self.overrunning}


def _settle(job: _Job) -> None:
    if job.future.done():
        return
    ok, value = job.outcome
    if ok:
        job.future.set_result(value)
    else:
        job.future.set_exception(value)


@functools.cache
def _exception_named(name: str) -> type[Exception]:
    return type(name, (Exception,), {"__module__": "ringzero.core.host_tools"})


def as_exception(exc: BaseException) -> Exception:
    """An Exception of ``exc``'s name and arguments: what a tool's SystemExit, KeyboardInterrupt
    or GeneratorExit becomes, so that every handler of a tool's failure sees it, and it never
    reaches the event loop (which stops on either of the first two)."""
    return _exception_named(type(exc).__name__)(*exc.args)


_shared: ToolPool | None = None


def shared_pool() -> ToolPool:
    """The pool for tools called outside any executor (``ctx.tool``): one per host process."""
    global _shared
    if _shared is None:
        _shared = ToolPool()
    return _shared


def pools_in_use(*owners: object) -> dict[str, int]:
    """The tool pools of ``owners`` (an executor's ``tool_pool``) and the shared one, added up:
    what ``ringzero top`` shows of a kernel's host tools."""
    pools = [p for p in (*(getattr(o, "tool_pool", None) for o in owners), _shared) if isinstance(p, ToolPool)]
    return {key: sum(p.stats()[key] for p in pools) for key in ("threads", "running", "overrunning")}
