"""The one timeout helper: ``async with fail_after(seconds):`` raises ``TimeoutError`` when
the block runs longer (``None``: no limit), and ``wait_until_set`` waits for an event up to a
deadline. ``Clock`` is what the LLM gate waits on, so a test can drive it by hand.
``shielded`` waits for a future without cancelling it; ``cancel_and_wait`` stops tasks for
good, even one that loses a cancellation.

On Python 3.11+ it is ``asyncio.timeout``; on 3.10, which has none, ``anyio.fail_after``
(anyio comes with httpx). Both raise the built-in ``TimeoutError`` (on 3.10 ``asyncio.wait_for``
raised another class, which is why nothing in ringzero uses it). Not anyio everywhere:
``anyio.fail_after`` costs several times what ``asyncio.timeout`` does, and the LLM gate enters
one on every call.

``started_eagerly`` starts a coroutine in the caller's turn, as Python 3.12's eager tasks do,
on every Python this project supports.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import sys
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Collection, Coroutine
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from types import TracebackType
from typing import Any, Protocol, TypeVar, runtime_checkable

__all__ = ["Clock", "MonotonicClock", "SharedTimeout", "cancel_and_wait", "fail_after", "retrieved", "shielded",
           "started_eagerly", "wait_until_set"]

T = TypeVar("T")

if sys.version_info >= (3, 11):
    def fail_after(seconds: float | None) -> AbstractAsyncContextManager[object]:
        """Cancel the block and raise ``TimeoutError`` after ``seconds``."""
        return asyncio.timeout(seconds)
else:  # pragma: no cover - exercised on Python 3.10
    import anyio

    @asynccontextmanager
    async def fail_after(seconds: float | None) -> AsyncIterator[None]:
        """Cancel the block and raise ``TimeoutError`` after ``seconds``."""
        with anyio.fail_after(seconds):
            yield


class SharedTimeout:
    """``fail_after(seconds)`` for many calls on one loop that share one length (the LLM gate's
    timeout per attempt): ``async with shared():``.

    Their deadlines come in the order the calls start, so one loop timer, set for the earliest
    deadline still pending, serves them all, and a call costs an append and a flag, where
    ``asyncio.timeout`` arms a timer per call (which, cancelled, stays in the loop's heap until
    it comes due): about four times the cost, in every ``ctx.llm``
    (``benchmarks/llm_syscall_overhead.py``). A call on another loop than the first one's (or
    on Python 3.10) gets ``fail_after`` instead.
    """

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self._loop: asyncio.AbstractEventLoop | None = None
        self._calls: deque[_TimedCall] = deque()
        self._timer: asyncio.TimerHandle | None = None

    def __call__(self) -> AbstractAsyncContextManager[object]:
        loop = asyncio.get_running_loop()
        if self._loop is None or self._loop.is_closed():  # the first call, or its loop is gone
            self._loop, self._calls, self._timer = loop, deque(), None
        if loop is not self._loop or sys.version_info < (3, 11):
            return fail_after(self.seconds)
        task = asyncio.current_task(loop)
        assert task is not None
        call = _TimedCall(self, task, loop.time() + self.seconds)
        self._calls.append(call)
        if self._timer is None:
            self._arm(call.deadline)
        return call

    async def run(self, call: Coroutine[Any, Any, T]) -> T:
        """``async with self(): return await call``, without the context manager's two extra
        coroutine steps (the LLM gate awaits one per attempt)."""
        timed = self()
        if not isinstance(timed, _TimedCall):
            async with timed:
                return await call
        cancelling = timed.task.cancelling()  # type: ignore[attr-defined]
        try:
            return await call
        except asyncio.CancelledError as exc:
            if timed.ended(cancelling):
                raise TimeoutError from exc
            raise
        finally:
            if not timed.done:
                timed.ended(cancelling)

    def _arm(self, deadline: float) -> None:
        # In an empty context: the timer outlives the call that set it, and the caller's context
        # holds that call's process (a syscall's context variables), which must not stay alive.
        assert self._loop is not None
        self._timer = self._loop.call_at(deadline, self._expire, context=contextvars.Context())

    def _expire(self) -> None:
        """The timer: cancel every call past its deadline, and set it again for the next."""
        self._timer = None
        calls = self._calls
        assert self._loop is not None
        now = self._loop.time()
        while calls:
            head = calls[0]
            if head.done:
                calls.popleft()
            elif head.deadline <= now:
                calls.popleft()
                head.expire()
            else:
                self._arm(head.deadline)
                return

    def _ended(self) -> None:
        calls = self._calls
        while calls and calls[0].done:
            calls.popleft()


class _TimedCall:
    """One call under a SharedTimeout, as ``asyncio.timeout`` handles one: the task is cancelled
    at the deadline, and that cancellation (only that one) comes out as ``TimeoutError``."""

    __slots__ = ("_cancelling", "_expired", "_owner", "deadline", "done", "task")

    def __init__(self, owner: SharedTimeout, task: asyncio.Task[object], deadline: float) -> None:
        self._owner = owner
        self.task = task
        self.deadline = deadline
        self.done = False
        self._expired = False
        self._cancelling = 0

    def expire(self) -> None:
        if not self.done:
            self._expired = True
            self.task.cancel()

    def ended(self, cancelling: int) -> bool:
        """The call is over; whether its cancellation was this timeout's (and only this one's),
        which the caller turns into ``TimeoutError``."""
        self.done = True
        self._owner._ended()
        return self._expired and self.task.uncancel() <= cancelling  # type: ignore[attr-defined]

    async def __aenter__(self) -> None:
        self._cancelling = self.task.cancelling()  # type: ignore[attr-defined]  # 3.11+, like all of this class

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        if self.ended(self._cancelling) and exc_type is asyncio.CancelledError:
            raise TimeoutError from exc


async def shielded(future: asyncio.Future[T]) -> T:
    """``await asyncio.shield(future)``: the outcome of ``future``, which cancelling this wait
    leaves running. Without shield's two closures (with their cells, and a context copied for
    each callback): a pending wait, its waiting task included, holds 7 objects for the garbage
    collector to walk, not 18 (``gc.get_objects()`` over 1,000 waits), at every
    ``ProcessHandle.wait`` and every spawn."""
    if future.done():
        return future.result()
    outer: asyncio.Future[T] = future.get_loop().create_future()
    settle = functools.partial(_settle_from, outer)
    future.add_done_callback(settle)
    try:
        return await outer
    except asyncio.CancelledError:
        future.remove_done_callback(settle)  # a cancelled wait leaves nothing behind on ``future``
        raise


def retrieved(future: asyncio.Future[Any]) -> None:
    """Mark a background future's exception as seen (whoever awaits it still gets it): a done
    callback for a task whose caller may be gone when it fails."""
    if not future.cancelled():
        future.exception()


def _settle_from(outer: asyncio.Future[T], inner: asyncio.Future[T]) -> None:
    if outer.done():
        return
    if inner.cancelled():
        outer.cancel()
    elif (error := inner.exception()) is not None:
        outer.set_exception(error)
    else:
        outer.set_result(inner.result())


def started_eagerly(coro: Coroutine[Any, Any, T]) -> asyncio.Future[T]:
    """``asyncio.ensure_future(coro)``, with the coroutine's first step run now, in the
    caller's turn, as Python 3.12's eager tasks run it: a coroutine that finishes without
    waiting for anything comes back as a done future, with no task and no turn of the loop;
    one that waits goes on in a task from where it stopped. Cancelling the caller does not
    reach it (nothing can interrupt the first step; the task is its own), which is what
    ``Runtime.spawn_process`` needs of a child's creation.

    The first step runs in a copy of the caller's context, and the task goes on in that copy
    (``create_task`` copies the context current at the call), as a task's whole run would."""
    loop = asyncio.get_running_loop()
    context = contextvars.copy_context()
    try:
        waiting_on = context.run(coro.send, None)
    except StopIteration as done:
        future: asyncio.Future[T] = loop.create_future()
        future.set_result(done.value)
        return future
    except asyncio.CancelledError:
        future = loop.create_future()
        future.cancel()
        return future
    except (KeyboardInterrupt, SystemExit) as error:  # kept, and raised on, as a task does
        future = loop.create_future()
        future.set_exception(error)
        raise
    except BaseException as error:  # the coroutine's outcome, kept as a task keeps it
        future = loop.create_future()
        future.set_exception(error)
        return future
    return context.run(loop.create_task, _Rest(coro, waiting_on))


class _Rest(Coroutine[Any, T, T]):
    """The rest of a coroutine whose first step has run, as a coroutine a task can run: its
    first step hands the task what the coroutine waits on; the task's later sends and throws
    (a result, a cancellation, even one that comes before the task's first step) go to it."""

    __slots__ = ("_coro", "_handed", "_waiting_on")

    def __init__(self, coro: Coroutine[Any, Any, T], waiting_on: Any) -> None:
        self._coro, self._waiting_on, self._handed = coro, waiting_on, False

    def send(self, value: Any) -> Any:
        if not self._handed:
            self._handed = True
            waiting_on, self._waiting_on = self._waiting_on, None
            return waiting_on
        return self._coro.send(value)

    def throw(self, typ: Any, val: Any = None, tb: Any = None) -> Any:
        self._handed, self._waiting_on = True, None
        if val is None and tb is None:
            return self._coro.throw(typ)
        return self._coro.throw(typ, val, tb)  # pragma: no cover - the old three-argument form

    def close(self) -> None:
        self._coro.close()

    def __next__(self) -> Any:
        return self.send(None)

    def __iter__(self) -> _Rest[T]:
        return self

    def __await__(self) -> _Rest[T]:
        return self


RECANCEL_EVERY = 0.05
"""Seconds after which a task that was asked to stop and still runs is cancelled again."""


async def cancel_and_wait(tasks: Collection[asyncio.Task[Any]], *,
                          again: Callable[[asyncio.Task[Any]], bool] | None = None) -> None:
    """Cancel each of ``tasks`` and wait until every one has ended, cancelling again, every
    ``RECANCEL_EVERY`` seconds, each that still runs (where ``again(task)`` says so).

    Why again: library code can lose a cancellation. Python 3.11's ``asyncio.wait_for`` returns
    its result instead when the cancellation and the result land in the same turn, and
    psycopg's pool waits for a free connection with it. A task that lost its one cancellation
    runs on (a loop with a sleep in it, for ever), and whoever waited for it to end waits for
    ever: ``Kernel.aclose`` waited so on the monitor's task. The outcome of each task is
    retrieved here (read it from the task where it matters), as ``gather(...,
    return_exceptions=True)`` would. ``Process.request_stop`` repeats a stop the same way."""
    pending = {task for task in tasks if not task.done()}
    for task in pending:
        task.cancel()
    while pending:
        _, pending = await asyncio.wait(pending, timeout=RECANCEL_EVERY)
        for task in pending:
            if again is None or again(task):
                task.cancel()
    for task in tasks:
        if not task.cancelled():
            task.exception()


async def wait_until_set(event: asyncio.Event, seconds: float | None) -> bool:
    """Wait for ``event`` up to ``seconds`` (None: forever); whether it was set."""
    if event.is_set():
        return True
    try:
        async with fail_after(seconds):
            await event.wait()
    except TimeoutError:
        return False
    return True


@runtime_checkable
class Clock(Protocol):
    """What the LLM gate paces by: the time, and waits measured on it. The default is the
    monotonic clock; ``ringzero.testing.ManualClock`` is one a test moves by hand, so pacing
    and back-off are checked by what happened, never by how long a test took."""

    def now(self) -> float:
        """Seconds, from any fixed origin."""
        ...

    async def sleep(self, seconds: float) -> None: ...

    async def wait(self, event: asyncio.Event, seconds: float | None) -> bool:
        """Wait for ``event`` up to ``seconds`` on this clock (None: forever); whether it was set."""
        ...


class MonotonicClock:
    """The real clock: ``time.monotonic`` and the event loop's own timers."""

    def now(self) -> float:
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)

    async def wait(self, event: asyncio.Event, seconds: float | None) -> bool:
        return await wait_until_set(event, seconds)
