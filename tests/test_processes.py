"""Processes: lifecycle, failure isolation, pause/resume, kill, bad input."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Callable
from pathlib import Path

import pytest

from ringzero import Context, Kernel, Limits, ProcessStatus, StopReason
from ringzero.checkpointers import SqliteCheckpointer
from ringzero.core.contract.errors import (
    BudgetExceeded,
    InvalidLimits,
    NotAProgram,
    NotSerializable,
    ProcessFailed,
    ProcessNotFound,
    ProcessStateError,
    RingzeroError,
)
from ringzero.core.contract.types import Checkpoint
from ringzero.core.support.timeouts import fail_after
from ringzero.testing import MemoryCheckpointer, ScriptedProvider


async def returns_value(ctx: Context, x: int) -> int:
    await ctx.sleep(0)
    return x * 2


async def crashes(ctx: Context) -> None:
    await ctx.sleep(0)
    raise ValueError("boom in the program")


async def ticker(ctx: Context, n: int) -> int:
    for i in range(n):
        ctx.state["ticks"] = i + 1
        await ctx.sleep(0.01)
    return n


async def test_spawned_program_returns_its_value_and_shows_in_ps(kernel: Kernel) -> None:
    p = await kernel.spawn(returns_value, 21, name="doubler", priority=3)
    assert await p.wait() == 42
    assert p.status is ProcessStatus.EXITED and p.stop_reason is StopReason.RETURNED
    [row] = await kernel.ps()
    assert (row.pid, row.name, row.priority, row.status) == (p.pid, "doubler", 3, ProcessStatus.EXITED)


async def test_every_transition_is_recorded_through_the_checkpointer(kernel: Kernel) -> None:
    p = await kernel.spawn(returns_value, 1)
    await p.wait()
    path = [t["to"] for t in await kernel.store.transitions(p.pid)]
    assert path == ["ready", "running", "waiting", "ready", "running", "exited"]
    stored = await kernel.store.load_process(p.pid)
    assert stored is not None and stored.status is ProcessStatus.EXITED and stored.result == 2


async def test_a_crashing_program_fails_with_its_traceback_and_others_keep_running(kernel: Kernel) -> None:
    bad = await kernel.spawn(crashes)
    good = await kernel.spawn(ticker, 5)
    with pytest.raises(ProcessFailed, match="boom in the program"):
        await bad.wait()
    assert bad.status is ProcessStatus.FAILED and bad.stop_reason is StopReason.RAISED
    assert bad.error is not None and "ValueError" in bad.error["traceback"] and "crashes" in bad.error["traceback"]
    assert await good.wait() == 5
    assert await (await kernel.spawn(returns_value, 4)).wait() == 8


async def until(condition: Callable[[], bool]) -> None:
    """Wait (without an upper bound of its own: the per-test timeout is that) for ``condition``."""
    while not condition():
        await asyncio.sleep(0.01)


async def test_pause_takes_effect_at_the_next_syscall_and_resume_continues(kernel: Kernel) -> None:
    p = await kernel.spawn(ticker, 1000)
    await until(lambda: p.state.get("ticks", 0) > 0)
    await p.pause()
    await until(lambda: p.status is ProcessStatus.PAUSED)
    frozen = p.state["ticks"]
    await asyncio.sleep(0.1)
    assert p.state["ticks"] == frozen and p.status is ProcessStatus.PAUSED
    await p.resume()
    await until(lambda: p.state["ticks"] > frozen)
    assert p.status in (ProcessStatus.WAITING, ProcessStatus.RUNNING, ProcessStatus.READY)
    await p.kill()
    assert "paused" in [t["to"] for t in await kernel.store.transitions(p.pid)]


async def test_wall_time_stands_still_while_paused_in_top_in_the_record_and_for_the_wall_budget(
        tmp_path: Path) -> None:
    """Paused, a process's WALL stops (top's live row and the saved record agree, so a host that
    goes away mid-pause loses nothing and top's WALL does not jump back); the wall budget's clock
    stops too; resumed, both count on from where they stood."""
    from ringzero.top import read_snapshot

    db = tmp_path / "k.db"
    first = Kernel(checkpointer=SqliteCheckpointer(db), monitor_interval=0.05)
    p = await first.spawn(ticker, 100_000, limits=Limits(wall_seconds=1.0))
    await until(lambda: p.state.get("ticks", 0) > 0)
    await p.pause()
    await until(lambda: p.status is ProcessStatus.PAUSED)
    at_pause = (await first.handle(p.pid)).info().wall_seconds
    await asyncio.sleep(1.5)  # past the whole wall budget: a pause spends none of it
    assert p.status is ProcessStatus.PAUSED, "the wall budget ran out while the process was paused"
    [row] = [r for r in (await read_snapshot(first.checkpointer)).rows if r.pid == p.pid]
    assert row.live and row.wall == pytest.approx(at_pause, abs=0.02), "top's WALL went on while paused"
    await first.aclose()  # the host goes away mid-pause

    async with Kernel(checkpointer=SqliteCheckpointer(db), monitor_interval=0.05) as again:
        [row] = [r for r in (await read_snapshot(again.checkpointer)).rows if r.pid == p.pid]
        assert row.wall == pytest.approx(at_pause, abs=0.02), "the saved WALL differs from what top showed"
        [handle] = await again.recover()
        await handle.resume()
        with pytest.raises(BudgetExceeded):
            await asyncio.wait_for(handle.wait(), 5)
        info = handle.info()
    assert info.stop_reason is StopReason.WALL_SECONDS
    assert 1.0 <= info.wall_seconds < 1.5, "the wall budget counted the pause, or not the time after it"


async def test_resume_of_a_process_that_is_not_paused_is_refused(kernel: Kernel) -> None:
    p = await kernel.spawn(ticker, 1000)
    with pytest.raises(ProcessStateError, match="not paused"):
        await p.resume()
    await p.kill()


async def slow_llm(ctx: Context) -> str:
    reply = await ctx.llm("this takes a minute")
    return reply.content


async def test_kill_cancels_the_llm_call_the_program_is_waiting_on() -> None:
    """kill() does not wait for the model: the call in flight is cancelled, and kill() returns
    once the process is recorded as killed (no clock involved: a kill that waited for the
    model's 60 s would hit the test's timeout)."""
    cancelled = asyncio.Event()

    async def a_minute(request: object) -> str:
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return "never seen"

    provider = ScriptedProvider(a_minute)
    async with Kernel(checkpointer=MemoryCheckpointer(), llm=provider) as kernel:
        p = await kernel.spawn(slow_llm)
        while provider.calls == 0:
            await asyncio.sleep(0.005)
        await p.kill()
        assert cancelled.is_set(), "kill returned while the model call was still running"
        assert p.status is ProcessStatus.KILLED and p.stop_reason is StopReason.KILLED
        with pytest.raises(ProcessFailed, match="killed"):
            await p.wait()
        assert kernel.gate().stats.calls == 1


async def parent_with_child(ctx: Context) -> None:
    await ctx.spawn(ticker, 10_000, name="child")
    await ctx.sleep(3600)


async def test_killing_a_parent_kills_its_live_children(kernel: Kernel) -> None:
    parent = await kernel.spawn(parent_with_child)
    while len(await kernel.ps()) < 2:
        await asyncio.sleep(0.01)
    await parent.kill()
    child = kernel.get(parent.pid + 1)
    assert child.status is ProcessStatus.KILLED and parent.status is ProcessStatus.KILLED


class HoldsOneWrite(MemoryCheckpointer):
    """Holds the first write that ``holds`` picks until ``release`` is set: the moment a kill
    may land while a spawn is half recorded."""

    def __init__(self, holds: Callable[[Checkpoint], bool]) -> None:
        super().__init__()
        self.holds = holds
        self.held = asyncio.Event()
        self.release = asyncio.Event()

    async def put(self, checkpoint: Checkpoint) -> None:
        if not self.held.is_set() and self.holds(checkpoint):
            self.held.set()
            await self.release.wait()
        await super().put(checkpoint)


@pytest.mark.parametrize("held", ["the parent's spawn record", "the child's first record"])
async def test_a_kill_that_lands_while_a_spawn_is_recorded_still_kills_the_child(held: str) -> None:
    def holds(checkpoint: Checkpoint) -> bool:
        if held == "the parent's spawn record":
            return checkpoint.namespace == "journal" and json.loads(checkpoint.payload)["kind"] == "spawn"
        return checkpoint.thread_id == "ringzero/processes" and checkpoint.id == f"{2:012d}"

    store = HoldsOneWrite(holds)
    async with Kernel(checkpointer=store) as kernel:
        parent = await kernel.spawn(parent_with_child)
        await store.held.wait()
        kill = asyncio.ensure_future(parent.kill())
        for _ in range(5):
            await asyncio.sleep(0)
        store.release.set()
        await kill
        child = kernel.get(parent.pid + 1)
        assert parent.status is ProcessStatus.KILLED
        assert child.status is ProcessStatus.KILLED, child
        stored = await kernel.store.load_process(child.pid)
        assert stored is not None and stored.status is ProcessStatus.KILLED


class SlowRunningRows(MemoryCheckpointer):
    """Status rows that say ``running`` take 50 ms to land, as a write on a busy connection of a
    pool does while another connection commits at once."""

    async def put(self, checkpoint: Checkpoint) -> None:
        await asyncio.sleep(0)  # every write waits on I/O, as a real store's does
        if checkpoint.namespace == "status" and checkpoint.metadata.get("status") == "running":
            await asyncio.sleep(0.05)
        await super().put(checkpoint)


async def wake_then_return(ctx: Context) -> str:
    await ctx.sleep(0.001)  # the wake is a batched `running` row; the end follows in the same turn
    return "done"


async def test_a_status_row_that_lands_late_never_undoes_the_end_of_a_process() -> None:
    store = SlowRunningRows()
    async with Kernel(checkpointer=store) as kernel:
        process = await kernel.spawn(wake_then_return)
        assert await process.wait() == "done"
        await kernel.flush()
        stored = await kernel.store.load_process(process.pid)
        assert stored is not None and stored.status is ProcessStatus.EXITED


async def test_a_kill_survives_a_library_that_swallows_one_cancellation() -> None:
    async def stubborn_tool() -> None:
        with contextlib.suppress(asyncio.CancelledError):  # as Python 3.11's wait_for may
            await asyncio.sleep(3600)
        await asyncio.sleep(3600)

    async def swallows_once(ctx: Context) -> None:
        await ctx.tool(stubborn_tool)

    async with Kernel(checkpointer=MemoryCheckpointer()) as kernel:
        p = await kernel.spawn(swallows_once)
        while p.status is not ProcessStatus.RUNNING:
            await asyncio.sleep(0.005)
        await asyncio.wait_for(p.kill(), 30)  # a hang detector, not a speed claim
        assert p.status is ProcessStatus.KILLED


async def test_bad_input_gets_a_clear_error_and_loses_no_state(kernel: Kernel) -> None:
    alive = await kernel.spawn(ticker, 10_000, name="survivor")

    def not_async(ctx: Context) -> None:
        return None

    with pytest.raises(ProcessNotFound, match="no process with pid 999"):
        kernel.get(999)
    with pytest.raises(NotAProgram, match="async def"):
        await kernel.spawn(not_async)  # type: ignore[arg-type]
    with pytest.raises(InvalidLimits, match="tokens must not be negative"):
        await kernel.spawn(ticker, 1, limits=Limits(tokens=-5))
    with pytest.raises(NotSerializable, match="message to pid"):
        await alive.send({"when": object()})
    with pytest.raises(NotSerializable, match="arguments"):
        await kernel.spawn(ticker, object())  # type: ignore[arg-type]
    with pytest.raises(RingzeroError, match="priority"):
        await kernel.spawn(ticker, 1, priority=-1)

    rows = await kernel.ps()
    assert [r.name for r in rows] == ["survivor"] and rows[0].status is not ProcessStatus.FAILED
    await alive.send({"still": "works"})
    assert await (await kernel.spawn(returns_value, 5)).wait() == 10
    await alive.kill()


async def test_new_kernel_on_the_same_store_continues_pid_numbering(tmp_path: object) -> None:
    store = MemoryCheckpointer()
    async with Kernel(checkpointer=store) as first:
        a = await first.spawn(returns_value, 1)
        await a.wait()
    async with Kernel(checkpointer=store) as second:
        b = await second.spawn(returns_value, 1)
        await b.wait()
        assert b.pid == a.pid + 1
        assert [r.pid for r in await second.ps(all=True)] == [a.pid, b.pid]


@pytest.mark.parametrize("store", ["sqlite", "memory"])
async def test_a_spawn_whose_record_is_written_at_once_takes_no_turn_of_the_loop(store: str, tmp_path: Path) -> None:
    """Where the store writes a new process's record without waiting (SQLite's append log, the
    in-memory store), a spawn returns in its caller's turn: spawning 10,000 processes one after
    another took 30,000 turns of the loop when each child's creation was a task of its own.
    The child runs once its spawner lets the loop turn."""
    checkpointer = SqliteCheckpointer(tmp_path / "state.db") if store == "sqlite" else MemoryCheckpointer()
    async with Kernel(checkpointer=checkpointer) as kernel:
        await (await kernel.spawn(returns_value, 0)).wait()  # the first spawn claims a block of pids
        turns: list[str] = []
        asyncio.get_running_loop().call_soon(turns.append, "a turn of the loop")
        handles = [await kernel.spawn(returns_value, i) for i in range(1, 21)]
        assert turns == [], "a spawn waited for a turn of the loop"
        assert all(h.status is ProcessStatus.CREATED for h in handles)  # none has run yet
        assert [await h.wait() for h in handles] == [2 * i for i in range(1, 21)]
        stored = await kernel.store.load_processes()
        assert [r.status for r in stored[-20:]] == [ProcessStatus.EXITED] * 20


async def test_a_process_whose_end_is_recorded_wakes_its_waiters_even_if_the_bookkeeping_after_it_fails() -> None:
    """Once its end is in the store, ``wait`` returns, whatever the kernel's bookkeeping after
    it does (a failure there used to leave every waiter hanging, silently)."""
    async with Kernel(checkpointer=MemoryCheckpointer()) as kernel:
        def breaks(child: object) -> None:
            raise RuntimeError("bookkeeping broke")

        kernel.runtime.child_finished = breaks  # type: ignore[method-assign]
        handle = await kernel.spawn(returns_value, 4)
        process = kernel.runtime.process(handle.pid)
        async with fail_after(10):
            assert await handle.wait() == 8
        assert process.task is not None
        with pytest.raises(RuntimeError, match="bookkeeping broke"):
            await process.task  # the failure is the task's, for the loop to report
        stored = await kernel.store.load_process(handle.pid)
        assert stored is not None and stored.status is ProcessStatus.EXITED
