"""SharedTimeout: one loop timer for many calls, with asyncio.timeout's meaning for each; shielded waits;
cancel_and_wait; started_eagerly."""

from __future__ import annotations

import asyncio
import contextvars
import sys

import pytest

from ringzero.core.support.timeouts import SharedTimeout, cancel_and_wait, fail_after, shielded, started_eagerly


async def test_each_call_times_out_at_its_own_deadline_and_no_other() -> None:
    shared = SharedTimeout(0.1)
    loop = asyncio.get_running_loop()
    lasted: dict[str, float] = {}

    async def call(name: str, delay: float) -> str:
        start = loop.time()
        try:
            async with shared():
                await asyncio.sleep(delay)
        finally:
            lasted[name] = loop.time() - start
        return "done"

    first = asyncio.create_task(call("first", 5))  # over its deadline
    await asyncio.sleep(0.05)
    quick = asyncio.create_task(call("quick", 0.01))  # done well before
    second = asyncio.create_task(call("second", 5))  # over, 50 ms after the first
    results = await asyncio.gather(first, quick, second, return_exceptions=True)
    assert isinstance(results[0], TimeoutError) and results[1] == "done" and isinstance(results[2], TimeoutError)
    # Each lasted its own 0.1 s: not cut at the first one's deadline (0.05 s into the second),
    # and not left to run its 5 s. The upper bound leaves room for a slow host.
    assert 0.099 <= lasted["first"] < 2 and 0.099 <= lasted["second"] < 2, lasted
    assert not shared._calls and shared._timer is None  # nothing left behind once all ended


async def test_a_cancellation_from_outside_stays_a_cancellation() -> None:
    shared = SharedTimeout(10)

    async def call() -> None:
        async with shared():
            await asyncio.sleep(5)

    task = asyncio.create_task(call())
    await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_a_call_that_ends_before_its_deadline_is_left_alone_while_the_timer_serves_later_ones() -> None:
    shared = SharedTimeout(0.05)
    for _ in range(20):  # many quick calls: one timer, set once, not one each
        async with shared():
            await asyncio.sleep(0)
    if sys.version_info >= (3, 11):  # 3.10 has no Task.cancelling(): each call has a timer of its own there
        assert shared._timer is not None and len(shared._calls) == 0
    with pytest.raises(TimeoutError):
        async with shared():
            await asyncio.sleep(1)
    async with shared():  # the task is not left cancelled
        await asyncio.sleep(0.01)


async def test_run_is_the_same_timeout_without_the_context_manager() -> None:
    shared = SharedTimeout(0.05)
    assert await shared.run(asyncio.sleep(0, result="quick")) == "quick"
    with pytest.raises(TimeoutError):
        await shared.run(asyncio.sleep(1))
    task = asyncio.create_task(SharedTimeout(10).run(asyncio.sleep(5)))
    await asyncio.sleep(0.01)
    task.cancel()  # from outside: stays a cancellation
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await shared.run(asyncio.sleep(0.01, result="after")) == "after"  # the task was uncancelled


async def test_shielded_gives_the_outcome_and_a_cancelled_wait_leaves_the_future_alone() -> None:
    loop = asyncio.get_running_loop()
    inner: asyncio.Future[str] = loop.create_future()
    waiter = asyncio.ensure_future(shielded(inner))
    await asyncio.sleep(0)
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert not inner.done() and not inner._callbacks  # type: ignore[attr-defined]  # nothing left on it
    second = asyncio.ensure_future(shielded(inner))
    await asyncio.sleep(0)
    inner.set_result("answer")
    assert await second == "answer"
    assert await shielded(inner) == "answer"  # already done

    failing: asyncio.Future[str] = loop.create_future()
    waiting = asyncio.ensure_future(shielded(failing))
    await asyncio.sleep(0)
    failing.set_exception(KeyError("gone"))
    with pytest.raises(KeyError, match="gone"):
        await waiting

    dropped: asyncio.Future[str] = loop.create_future()
    waiting = asyncio.ensure_future(shielded(dropped))
    await asyncio.sleep(0)
    dropped.cancel()  # the future itself cancelled: its waiter is too
    with pytest.raises(asyncio.CancelledError):
        await waiting


_WHOSE: contextvars.ContextVar[str] = contextvars.ContextVar("whose", default="the caller's")


async def test_started_eagerly_runs_the_first_step_now_and_makes_a_task_only_for_the_rest() -> None:
    loop = asyncio.get_running_loop()
    steps: list[str] = []

    async def quick() -> str:
        steps.append("quick ran")
        return "done"

    tasks_before = asyncio.all_tasks()
    finished = started_eagerly(quick())
    assert steps == ["quick ran"]  # in the caller's turn: no turn of the loop went by
    assert finished.done() and finished.result() == "done"
    assert asyncio.all_tasks() == tasks_before  # and no task was made for it

    async def fails() -> None:
        raise KeyError("at once")

    with pytest.raises(KeyError, match="at once"):
        started_eagerly(fails()).result()

    release: asyncio.Future[None] = loop.create_future()

    async def waits() -> str:
        _WHOSE.set("its own")
        steps.append("first step")
        await release
        steps.append("the rest")
        return _WHOSE.get()

    rest = started_eagerly(waits())
    assert steps[-1] == "first step" and isinstance(rest, asyncio.Task) and not rest.done()
    assert _WHOSE.get() == "the caller's"  # what its first step set stays in its own context
    release.set_result(None)
    assert await rest == "its own" and steps[-1] == "the rest"


async def test_a_coroutine_started_eagerly_gets_a_cancellation_of_its_task_even_before_the_tasks_first_turn() -> None:
    seen: list[str] = []

    async def sleeps() -> None:
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            seen.append("cancelled where it waited")
            raise

    task = started_eagerly(sleeps())
    task.cancel()  # the task has not run a step of its own yet
    with pytest.raises(asyncio.CancelledError):
        await task
    assert seen == ["cancelled where it waited"]

    release: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    async def finishes() -> str:
        await release
        return "finished"

    creation = started_eagerly(finishes())
    caller = asyncio.ensure_future(shielded(creation))
    await asyncio.sleep(0)
    caller.cancel()  # the caller gives up; what it started goes on
    with pytest.raises(asyncio.CancelledError):
        await caller
    release.set_result(None)
    assert await creation == "finished"


async def test_cancel_and_wait_stops_a_task_that_lost_its_first_cancellation() -> None:
    lost: list[int] = []

    async def ticker() -> None:  # the monitor's loop: a tick, then a sleep, for ever
        while True:
            try:
                await asyncio.sleep(0.01)
            except asyncio.CancelledError:
                if lost:
                    raise
                lost.append(1)  # what Python 3.11's wait_for does when its result lands in the same turn

    once = asyncio.create_task(ticker())
    await asyncio.sleep(0.02)
    once.cancel()
    _, running = await asyncio.wait([once], timeout=0.3)
    assert running == {once} and lost == [1]  # one cancellation, lost: the task runs on
    lost.clear()
    task = asyncio.create_task(ticker())
    await asyncio.sleep(0.02)
    async with fail_after(5):
        await cancel_and_wait([task])
    assert task.cancelled() and lost == [1]
    await cancel_and_wait([once])
    assert once.cancelled()


async def test_cancel_and_wait_leaves_a_task_alone_where_again_says_no_and_retrieves_each_outcome() -> None:
    async def cleans_up() -> str:
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            await asyncio.sleep(0.2)  # longer than the repeat interval: not cut short
            return "cleaned up"
        return "slept"

    async def fails() -> None:
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            raise ValueError("while stopping") from None

    first, second = asyncio.create_task(cleans_up()), asyncio.create_task(fails())
    await asyncio.sleep(0)
    await cancel_and_wait([first, second], again=lambda task: task is not first)
    assert first.result() == "cleaned up"
    assert isinstance(second.exception(), ValueError)
    await cancel_and_wait([first])  # an ended task: nothing to do
