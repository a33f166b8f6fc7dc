"""MontyExecutor specifics: a slow tool call does not hold a worker, sessions keep their
variables, a limit hit discards the session's state, and limits are always set."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading

import pytest

from ringzero.core.contract.errors import Closed
from ringzero.core.contract.types import ExecLimits
from ringzero.core.support.tool_pool import TOOL_THREAD_NAME
from ringzero.providers.executors import MontyExecutor


async def test_a_slow_tool_call_does_not_hold_the_only_worker() -> None:
    """The slow tool does not return until the quick run has finished: were the quick run
    queued behind it on the one worker, the test would never end (no clock involved)."""
    executor = MontyExecutor(max_workers=1, park_after=0.02)
    entered, release = asyncio.Event(), asyncio.Event()

    async def slow_lookup(key: str) -> str:
        entered.set()
        await release.wait()
        return key.upper()

    slow = asyncio.create_task(executor.run("slow_lookup('a') + '!'", tools={"slow_lookup": slow_lookup}))
    await entered.wait()
    quick = await executor.run("sum(range(10))")
    assert quick.value == 45 and not slow.done()
    release.set()
    assert (await slow).value == "A!"
    await executor.aclose()


async def test_tool_calls_from_one_run_resume_on_whatever_worker_is_free() -> None:
    executor = MontyExecutor(max_workers=1, park_after=0.01)

    async def fetch(n: int) -> int:
        await asyncio.sleep(0.05)
        return n * n

    results = await asyncio.gather(*(executor.run("[fetch(i) for i in range(3)]", tools={"fetch": fetch})
                                     for _ in range(4)))
    assert [r.value for r in results] == [[0, 1, 4]] * 4
    await executor.aclose()


async def test_a_session_keeps_its_variables_between_runs() -> None:
    executor = MontyExecutor(max_workers=1)
    async with executor.session() as session:
        await session.run("counter = 40\ndef bump(n):\n    return n + 1")
        assert (await session.run("bump(counter) + 1")).value == 42
    other = await executor.run("counter")  # another run never sees a session's state
    assert other.error is not None and other.error.type == "NameError"
    with pytest.raises(Closed, match="not open"):
        await session.run("counter")
    await executor.aclose()


async def test_a_limit_hit_discards_the_sessions_state() -> None:
    executor = MontyExecutor(max_workers=1, limits=ExecLimits(wall_seconds=0.3))
    async with executor.session() as session:
        await session.run("kept = 1")
        hit = await session.run("while True:\n    pass")
        assert hit.error is not None and hit.error.type == "TimeoutError"
        after = await session.run("kept")
        assert after.error is not None and after.error.type == "NameError"  # a fresh session
        assert (await session.run("1 + 1")).value == 2
    await executor.aclose()


async def test_async_tools_gathered_by_async_style_code_overlap() -> None:
    executor = MontyExecutor(max_workers=1)

    in_flight = peak = 0

    async def fetch(n: int) -> int:
        nonlocal in_flight, peak
        in_flight += 1
        peak = max(peak, in_flight)
        await asyncio.sleep(0.05)
        in_flight -= 1
        return n * 10

    code = "import asyncio\nresults = await asyncio.gather(fetch(1), fetch(2), fetch(3))\nresults"
    result = await executor.run(code, tools={"fetch": fetch})
    assert result.value == [10, 20, 30], result.error
    assert peak == 3, f"only {peak} of the three gathered calls were in flight at once"
    single = await executor.run("x = await fetch(4)\nx", tools={"fetch": fetch})
    assert single.value == 40
    await executor.aclose()


EXIT_AFTER_A_CANCELLED_RUN = '''
import asyncio, sys
from ringzero.providers.executors import MontyExecutor

async def tick(i):
    await asyncio.sleep(0.01)
    return i

async def main():
    ex = MontyExecutor()
    code = "total = 0\\nfor i in range(10000):\\n    total += tick(i)\\ntotal"
    task = asyncio.ensure_future(ex.run(code, tools={"tick": tick}))
    await asyncio.sleep(0.2)
    task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        pass
    if sys.argv[1] == "close":
        await ex.aclose()
    print("reached the end")

asyncio.run(main())
'''


def test_the_interpreter_exits_cleanly_after_monty_runs_closed_or_not() -> None:
    """pydantic-monty completes awaitables from its own threads; one caught mid-callback by
    interpreter exit used to abort the process (exit 134) in about a third of these runs."""
    outcomes = []
    for attempt in range(8):
        close = "close" if attempt % 2 else "leave-open"
        done = subprocess.run([sys.executable, "-c", EXIT_AFTER_A_CANCELLED_RUN, close],
                              capture_output=True, text=True, timeout=60)
        assert "reached the end" in done.stdout, done.stderr
        outcomes.append((close, done.returncode))
    assert all(rc == 0 for _, rc in outcomes), outcomes


async def test_a_quick_sync_tool_is_answered_in_montys_own_thread_from_its_second_run() -> None:
    """The first run drives snapshots and its sync tool runs in the tool pool; once the tool has
    answered within park_after, a run calling it is one feed, each call answered in the thread
    Monty calls host functions from: same value, same record of calls."""
    executor = MontyExecutor(max_workers=1)
    threads: list[str] = []

    def double(i: int) -> int:
        threads.append(threading.current_thread().name)
        return 2 * i

    try:
        first = await executor.run("[double(i) for i in range(3)]", tools={"double": double})
        second = await executor.run("[double(i) for i in range(3)]", tools={"double": double})
    finally:
        await executor.aclose()
    assert first.value == second.value == [0, 2, 4] and first.tool_calls == second.tool_calls
    assert threads[:3] == [TOOL_THREAD_NAME] * 3
    assert TOOL_THREAD_NAME not in threads[3:] and threading.main_thread().name not in threads[3:]
    assert executor.tool_pool.stats()["running"] == 0


async def test_a_quick_tool_that_turns_slow_holds_its_worker_once_then_parks() -> None:
    """A call answered in Monty's thread holds the run's worker while it runs: the one that ran
    past park_after makes its tool slow, and from then on a run waiting on it gives the worker
    back (a quick run goes ahead on the only worker: were it queued, the test would never end)."""
    executor = MontyExecutor(max_workers=1, park_after=0.02)
    slow = threading.Event()
    entered, release = threading.Event(), threading.Event()

    def lookup(key: str) -> str:
        if slow.is_set():
            entered.set()
            release.wait(10)
        return key.upper()

    try:
        assert (await executor.run("lookup('a')", tools={"lookup": lookup})).value == "A"  # quick now
        slow.set()
        held = asyncio.create_task(executor.run("lookup('b')", tools={"lookup": lookup}))
        await asyncio.to_thread(entered.wait, 10)
        quick = asyncio.create_task(executor.run("sum(range(10))"))
        await asyncio.sleep(0.2)
        assert not quick.done()  # the worker is held by the call in Monty's thread
        release.set()
        assert (await held).value == "B" and (await quick).value == 45
        entered.clear()
        release.clear()
        parking = asyncio.create_task(executor.run("lookup('c')", tools={"lookup": lookup}))
        await asyncio.to_thread(entered.wait, 10)
        assert (await executor.run("sum(range(10))")).value == 45  # the slow call parked its run
        release.set()
        assert (await parking).value == "C"
    finally:
        release.set()
        await executor.aclose()


async def test_a_stuck_call_in_montys_thread_is_cut_short_recorded_and_counted_until_it_returns() -> None:
    executor = MontyExecutor(max_workers=1)
    stuck, release = threading.Event(), threading.Event()

    def fetch(n: int) -> int:
        if stuck.is_set():
            release.wait(10)
        return n

    try:
        assert (await executor.run("fetch(1)", tools={"fetch": fetch})).value == 1
        stuck.set()
        result = await executor.run("fetch(2)", tools={"fetch": fetch}, limits=ExecLimits(wall_seconds=0.3))
        assert result.error is not None and result.error.type == "TimeoutError", result
        assert [c.error for c in result.tool_calls] == ["Cancelled: the run ended before the tool returned"]
        assert executor.tool_pool.stats()["overrunning"] == 1
        assert (await executor.run("21 * 2")).value == 42  # the next run has a worker
        release.set()
        for _ in range(200):
            if executor.tool_pool.stats()["overrunning"] == 0:
                break
            await asyncio.sleep(0.01)
        assert executor.tool_pool.stats() == {"threads": executor.tool_pool.threads, "running": 0,
                                              "overrunning": 0, "stalls": 0}
    finally:
        release.set()
        await executor.aclose()
