"""Where plain (sync) host tools run: a bounded pool of daemon threads, shared fairly among the
processes that call them, never the event loop's shared default executor; and, for tools
declared :func:`cpu_bound`, worker processes (``ringzero.core.support.tool_workers``).

Why a pool of its own: a tool that blocks (a socket with no timeout, a lock held forever) keeps
its thread after its run's wall limit ended the wait; on the loop's default executor enough of
them starve everything else that uses it (``loop.getaddrinfo``, ``asyncio.to_thread``). Here
they starve only this pool: at most ``threads`` tools run at once, a call beyond that waits in
line (its run's wall limit still ends the wait), and a tool still running after its caller
stopped waiting is counted in ``overrunning``, logged, shown by ``ringzero top`` until it
returns, and replaced by a fresh thread (up to ``overrun_limit`` such tools). Its thread is a
daemon: a tool that never returns does not keep the host from exiting.

**Fair shares.** Each call has an owner: the kernel process it is made for (or the executor
run, outside a kernel). A free thread takes the next call of the owner with the fewest tools
running, so one agent gathering eight slow tools cannot keep another waiting behind them; and
an owner with nothing running gets a thread at once even when the pool is full (an extra one,
up to ``overrun_limit`` threads in all), so its quick tool answers while the others' slow ones
run.

A pure-Python tool that holds the GIL in one C call (``sum(range(10**9))``) stops every thread
of the host, the event loop's included, whatever thread it runs in. Declare such a tool
:func:`cpu_bound` and it runs in a worker process instead (it must be importable by name). One
that is not declared is caught in the act: ``ringzero.core.support.loop_stalls`` logs a stall of the
event loop over 100 ms with the name of the tool whose thread ran through it, and ``ringzero
top`` shows it, with that advice.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import contextvars
import functools
import logging
import threading
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from ringzero.core.support.live import RUNNING_LIVE
from ringzero.core.support.loop_stalls import StallWatch, Watched, watch_stalls
from ringzero.core.support.tool_parameters import declare, declared
from ringzero.core.support.tool_workers import ToolWorkers, as_exception

__all__ = ["DEFAULT_TOOL_THREADS", "TOOL_THREAD_NAME", "CallHere", "ToolPool", "as_exception", "cpu_bound",
           "is_cpu_bound", "pools_in_use", "shared_pool"]

log = logging.getLogger("ringzero.tools")
F = TypeVar("F", bound=Callable[..., Any])
DEFAULT_TOOL_THREADS = 8
"""Sync host tools one pool runs at once unless its owner says otherwise."""
TOOL_THREAD_NAME = "ringzero-tool"
"""The name of every thread of a tool pool."""
_HOST = "host"
"""The owner of a call made outside any kernel process and run."""


def cpu_bound(tool: F) -> F:
    """Declare a sync host tool CPU-bound: it runs in a worker process, so that holding the GIL
    (a long pure-Python or C loop) cannot freeze the host's event loop. The tool and its
    arguments must be picklable, its result JSON; it must be a module-level function."""
    return declare(tool, "__ringzero_cpu_bound__", True)


def is_cpu_bound(tool: Any) -> bool:
    return bool(declared(tool, "__ringzero_cpu_bound__"))


@dataclass(eq=False)
class _Job:
    call: Callable[[], Any]
    name: str
    owner: Hashable
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[Any]
    generation: int
    watched: Watched
    started: bool = False
    finished: bool = False
    abandoned: bool = False  # its caller stopped waiting
    outcome: tuple[bool, Any] = field(default=(False, None))


@dataclass(eq=False)
class CallHere:
    """One ``ToolPool.run_here`` call, as its caller holds it."""

    name: str
    finished: bool = False
    abandoned: bool = False


class ToolPool:
    """Runs sync host tools in at most ``threads`` daemon threads, shared fairly among their
    owners (and tools declared :func:`cpu_bound` in at most ``processes`` worker processes).
    Threads start as calls need them and stay for the next call."""

    def __init__(self, threads: int = DEFAULT_TOOL_THREADS, processes: int = 2) -> None:
        if not isinstance(threads, int) or isinstance(threads, bool) or threads < 1:
            raise ValueError(f"a tool pool needs at least one thread, not {threads!r}")
        self.threads = threads
        self.workers = ToolWorkers(processes)
        """Where tools declared cpu_bound run."""
        self._lock = threading.Condition()
        self._waiting: dict[Hashable, collections.deque[_Job]] = {}  # by owner, in the order owners came
        self._owners_running: collections.Counter[Hashable] = collections.Counter()
        self._generation = 0  # close() starts a new one: threads of an older one leave when idle
        self._workers = 0  # threads of this generation that are not overrunning
        self._idle = 0
        self.running = 0
        """Tools running in this pool's threads now."""
        self.overrunning = 0
        """Of those, the ones whose caller stopped waiting (its run's wall limit ended): each
        still holds a thread until it returns, and the pool starts another in its place."""
        self.overrun_limit = 4 * threads
        """Past this many tools overrunning, no thread replaces one; past this many threads in
        all, an owner with nothing running waits in line like the others."""
        self.stalls = StallWatch()
        """Stalls of the event loop caught while this pool's tools ran (``loop_stalls``)."""
        self._here_lock = threading.Lock()
        self._running_here = 0  # tools run_here runs now
        self._overrunning_here = 0  # of those, the ones whose caller stopped waiting

    async def run(self, tool: Callable[..., Any], args: list[Any], kwargs: dict[str, Any], *,
                  owner: Hashable | None = None, result_bytes: int | None = None) -> Any:
        """Call ``tool(*args, **kwargs)`` here and wait for its result, in the caller's context
        (a kernel process's ``ctx`` is seen by the tool). ``owner``: whose share the call takes
        (by default the kernel process it runs for). ``result_bytes``: a cpu_bound tool's result
        is refused in its worker past this size. Cancelling the wait leaves a tool that has
        started to finish on its own, counted in ``overrunning`` (a cpu_bound tool's worker is
        killed)."""
        if is_cpu_bound(tool):
            return await self.workers.run(tool, args, kwargs, result_bytes)
        owner = owner if owner is not None else (RUNNING_LIVE.get() or _HOST)
        loop = asyncio.get_running_loop()
        context = contextvars.copy_context()
        name = str(getattr(tool, "__name__", None) or type(tool).__name__)
        with self._lock:
            job = _Job(functools.partial(context.run, tool, *args, **kwargs), name, owner, loop, loop.create_future(),
                       self._generation, Watched(name))
            self._waiting.setdefault(owner, collections.deque()).append(job)
            total = self._workers + self.overrunning
            first = self._owners_running[owner] == 0 and len(self._waiting[owner]) == 1
            grow = False
            if self._idle:  # an idle thread takes the fairest call; it leaves the idle count now, not when it wakes
                self._idle -= 1
                self._lock.notify()
            elif total < self.overrun_limit and (self._workers < self.threads or first):
                grow = True
                self._workers += 1
        if grow:
            threading.Thread(target=self._work, args=(job.generation,), name=TOOL_THREAD_NAME, daemon=True).start()
        watch_stalls(loop, self.stalls)
        try:
            return await job.future
        except asyncio.CancelledError:
            self._abandon(job)
            raise

    def run_here(self, tool: Callable[..., Any], args: list[Any], kwargs: dict[str, Any], call: CallHere) -> Any:
        """Call a plain sync ``tool`` in the calling thread, which must not be an event loop's:
        an engine that calls host functions from a thread of its own (Monty's ``feed_run``)
        answers each call there, without two hops to a pool thread and back. The call counts in
        ``running`` and is watched for loop stalls as the pool's own calls are (the caller has
        ``watch_stalls`` on its loop); it takes no thread of the pool, so neither its bound nor
        its fair shares count it (the engine bounds its threads: one per run). ``call`` lets the
        caller say it stopped waiting (``abandon_here``): the tool then counts in
        ``overrunning`` until it returns. A tool's exit (``SystemExit``) comes back as an
        Exception of the same name."""
        watched = Watched(call.name)
        with self._here_lock:
            self._running_here += 1
        self.stalls.start(watched)
        try:
            return tool(*args, **kwargs)
        except (SystemExit, KeyboardInterrupt, GeneratorExit) as exc:
            raise as_exception(exc) from None
        finally:
            self.stalls.end(watched)
            with self._here_lock:
                call.finished = True
                self._running_here -= 1
                self._overrunning_here -= call.abandoned

    def abandon_here(self, call: CallHere) -> None:
        """The caller of a ``run_here`` stopped waiting for it (its run's wall limit ended): a
        tool still running counts in ``overrunning`` until it returns, and is logged."""
        with self._here_lock:
            if call.finished or call.abandoned:
                return
            call.abandoned = True
            self._overrunning_here += 1
        log.warning("host tool %s still runs after its caller stopped waiting (a run's wall limit); it holds the "
                    "thread that called it until it returns", call.name)

    def _abandon(self, job: _Job) -> None:
        with self._lock:
            job.abandoned = True
            overran = job.started and not job.finished
            waiting = self._waiting.get(job.owner)
            if not job.started and waiting is not None:
                with contextlib.suppress(ValueError):
                    waiting.remove(job)
                if not waiting:
                    del self._waiting[job.owner]
            if overran:  # its thread leaves the pool's count: the next call may start another
                self.overrunning += 1
                self._workers -= job.generation == self._generation
        if overran:
            log.warning("host tool %s still runs after its caller stopped waiting (a run's wall limit); %d such "
                        "tools hold a thread each (past %d, calls wait for a thread)", job.name, self.overrunning,
                        self.overrun_limit)

    def _next(self) -> _Job | None:
        """The call to run next: the oldest of the owner with the fewest tools running (called
        with the lock held)."""
        best = None
        for owner, jobs in self._waiting.items():
            if jobs and (best is None or self._owners_running[owner] < self._owners_running[best]):
                best = owner
        if best is None:
            return None
        jobs = self._waiting[best]
        job = jobs.popleft()
        if not jobs:
            del self._waiting[best]
        return job

    def _work(self, generation: int) -> None:
        """One thread of the pool: it runs the fairest waiting call, again and again, and leaves
        when its pool was closed, or when it is one more than ``threads`` and nothing waits."""
        with self._lock:
            while True:
                job = self._next() if generation == self._generation else None
                if job is None:
                    if generation != self._generation:
                        return
                    if self._workers > self.threads:  # an extra thread given to a newcomer: not kept
                        self._workers -= 1
                        return
                    self._idle += 1
                    self._lock.wait()  # whoever wakes us took us out of the idle count
                    continue
                job.started = True
                self.running += 1
                self._owners_running[job.owner] += 1
                self._lock.release()
                self.stalls.start(job.watched)
                try:
                    job.outcome = (True, job.call())
                except BaseException as exc:
                    job.outcome = (False, exc if isinstance(exc, Exception) else as_exception(exc))
                finally:
                    self.stalls.end(job.watched)
                    self._lock.acquire()
                with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits any more
                    job.loop.call_soon_threadsafe(_settle, job)
                job.finished = True
                self.running -= 1
                self._owners_running[job.owner] -= 1
                if not self._owners_running[job.owner]:
                    del self._owners_running[job.owner]
                if job.abandoned:  # it had left the count: back in, if there is room
                    self.overrunning -= 1
                    if self._workers >= self.threads or generation != self._generation:
                        return
                    self._workers += 1

    def close(self) -> None:
        """Let idle threads end and stop the idle worker processes; tools still running finish
        on their own (their threads are daemons). The pool may be used again: it starts afresh."""
        with self._lock:
            self._generation += 1
            self._workers = self._idle = 0
            self._waiting.clear()
            self._lock.notify_all()
        self.workers.close()

    def stats(self) -> dict[str, Any]:
        """What ``ringzero top`` shows: threads, tools running, tools past their caller's wait,
        and the event loop's stalls caught while tools ran."""
        return {"threads": self.threads, "running": self.running + self._running_here,
                "overrunning": self.overrunning + self._overrunning_here, **self.stalls.stats()}


def _settle(job: _Job) -> None:
    if job.future.done():
        return
    ok, value = job.outcome
    if ok:
        job.future.set_result(value)
    else:
        job.future.set_exception(value)


_shared: ToolPool | None = None


def shared_pool() -> ToolPool:
    """The pool for tools called outside any executor (``ctx.tool``): one per host process."""
    global _shared
    if _shared is None:
        _shared = ToolPool()
    return _shared


def pools_in_use(*owners: object) -> dict[str, Any]:
    """The tool pools of ``owners`` (an executor's ``tool_pool``) and the shared one, added up:
    what ``ringzero top`` shows of a kernel's host tools."""
    pools = [p for p in (*(getattr(o, "tool_pool", None) for o in owners), _shared) if isinstance(p, ToolPool)]
    total: dict[str, Any] = {key: sum(p.stats()[key] for p in pools)
                             for key in ("threads", "running", "overrunning", "stalls")}
    latest = max((p.stalls for p in pools if p.stalls.last is not None), key=lambda w: w.last_at, default=None)
    if latest is not None and latest.last is not None:
        total["stalled_by"], total["stall_s"] = latest.last
    return total
