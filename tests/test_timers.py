"""Durable timers: a waiting syscall's deadline is journaled when it is set, so a program resumed
after a crash waits only what was left of ``sleep``, ``recv(timeout=)`` or ``wait(timeout=)``,
and one whose deadline passed during the outage goes on at once.

Each crash here is a kernel shut down mid-wait, which leaves the store as a crash would; the
kill -9 trials are in ``tests/test_timer_kills.py``."""

from __future__ import annotations

import asyncio
import datetime
import time
from pathlib import Path
from typing import Any

import pytest

from ringzero import Context, Kernel, StopReason
from ringzero.checkpointers import SqliteCheckpointer
from ringzero.core.contract.errors import InvalidArgument, ProcessFailed
from ringzero.core.contract.store import KernelStore


def kernel_on(db: Path) -> Kernel:
    return Kernel(checkpointer=SqliteCheckpointer(db))


async def sleeps(ctx: Context, seconds: float) -> float:
    """How long after the time it read before the sleep it woke (the read is journaled: a
    resumed program gets the time of the first run)."""
    before = await ctx.now()
    await ctx.sleep(seconds)
    return (await ctx.now() - before).total_seconds()


async def receives(ctx: Context, timeout: float) -> list[Any]:
    before = await ctx.now()
    got = await ctx.recv(timeout=timeout)
    return [got, (await ctx.now() - before).total_seconds()]


async def waits_forever(ctx: Context) -> Any:
    return await ctx.recv()


async def waits_for_child(ctx: Context, timeout: float) -> list[Any]:
    child = await ctx.spawn(waits_forever)
    before = await ctx.now()
    try:
        await ctx.wait(child, timeout=timeout)
    except TimeoutError:
        return ["timed out", (await ctx.now() - before).total_seconds()]
    return ["ended", None]


async def sleeps_until(ctx: Context, when: str) -> float:
    await ctx.sleep_until(datetime.datetime.fromisoformat(when))
    return time.time()


async def polls(ctx: Context) -> Any:
    return await ctx.recv(timeout=0)


async def crash_while_waiting(db: Path, program: Any, *args: Any, after: float) -> int:
    """Run ``program`` until it has waited ``after`` seconds, then shut its kernel down as a crash would."""
    async with kernel_on(db) as kernel:
        handle = await kernel.spawn(program, *args)
        for _ in range(500):
            if handle.wake_at is not None:
                break
            await asyncio.sleep(0.01)
        assert handle.wake_at is not None, "the program never waited on its timer"
        await asyncio.sleep(after)
        return handle.pid


async def resume(db: Path, outage: float = 0.0) -> Any:
    await asyncio.sleep(outage)
    async with kernel_on(db) as kernel:
        [handle] = [h for h in await kernel.recover() if h.name != "waits_forever"]
        return await handle.wait(timeout=30)


async def test_a_sleep_resumed_after_a_crash_sleeps_only_what_was_left(tmp_path: Path) -> None:
    await crash_while_waiting(tmp_path / "state.db", sleeps, 2.0, after=1.0)
    slept = await resume(tmp_path / "state.db")
    # 1 s before the crash, the rest after it: a sleep that started over would make it 3 s.
    assert 2.0 <= slept < 2.6, slept


async def test_a_deadline_that_passed_during_the_outage_fires_at_once(tmp_path: Path) -> None:
    await crash_while_waiting(tmp_path / "state.db", sleeps, 1.0, after=0.2)
    started = time.monotonic()
    slept = await resume(tmp_path / "state.db", outage=1.5)
    assert time.monotonic() - started < 2.1, "the resumed sleep slept again"  # 1.5 s of it is the outage
    assert 1.0 <= slept < 2.3, slept


async def test_a_recv_timeout_resumed_after_a_crash_fires_at_its_first_deadline(tmp_path: Path) -> None:
    await crash_while_waiting(tmp_path / "state.db", receives, 2.0, after=1.0)
    got, waited = await resume(tmp_path / "state.db")
    assert got is None
    assert 2.0 <= waited < 2.6, waited


async def test_a_message_sent_during_the_outage_is_received_before_the_timer(tmp_path: Path) -> None:
    pid = await crash_while_waiting(tmp_path / "state.db", receives, 30.0, after=0.2)
    async with kernel_on(tmp_path / "state.db") as sender:
        await sender.send(pid, "hello")
    got, waited = await resume(tmp_path / "state.db")
    assert got == "hello" and waited < 5, (got, waited)


async def test_a_wait_timeout_resumed_after_a_crash_fires_at_its_first_deadline(tmp_path: Path) -> None:
    await crash_while_waiting(tmp_path / "state.db", waits_for_child, 2.0, after=1.0)
    outcome, waited = await resume(tmp_path / "state.db")
    assert outcome == "timed out"
    assert 2.0 <= waited < 2.6, waited


async def test_the_timer_is_journaled_once_and_is_not_counted_as_a_tool_call(tmp_path: Path) -> None:
    pid = await crash_while_waiting(tmp_path / "state.db", sleeps, 0.5, after=0.1)
    store = SqliteCheckpointer(tmp_path / "state.db")
    try:
        effects = await KernelStore(store).effects(pid)
    finally:
        await store.aclose()
    assert effects.calls == {}, "a timer is no tool call"
    [timer] = effects.timers.values()
    assert timer.kind == "timer" and isinstance(timer.outcome.value, float)
    assert timer.outcome.value > time.time() - 5
    await resume(tmp_path / "state.db")


async def test_a_poll_sets_no_timer(tmp_path: Path) -> None:
    async with kernel_on(tmp_path / "state.db") as kernel:
        handle = await kernel.spawn(polls)
        assert await handle.wait(timeout=10) is None
        assert (await kernel.store.effects(handle.pid)).timers == {}


async def test_sleep_until_wakes_at_an_aware_time_and_at_once_for_a_past_one(tmp_path: Path) -> None:
    async with kernel_on(tmp_path / "state.db") as kernel:
        when = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(seconds=1)
        handle = await kernel.spawn(sleeps_until, when.isoformat())
        woke = await handle.wait(timeout=10)
        assert when.timestamp() <= woke < when.timestamp() + 0.5
        past = datetime.datetime.now(datetime.timezone(datetime.timedelta(hours=-5))) - datetime.timedelta(hours=1)
        started = time.monotonic()
        await (await kernel.spawn(sleeps_until, past.isoformat())).wait(timeout=10)
        assert time.monotonic() - started < 1


async def test_a_sleep_until_resumed_after_a_crash_wakes_at_its_time(tmp_path: Path) -> None:
    when = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(seconds=2)
    await crash_while_waiting(tmp_path / "state.db", sleeps_until, when.isoformat(), after=0.5)
    woke = await resume(tmp_path / "state.db")
    assert when.timestamp() <= woke < when.timestamp() + 0.6


@pytest.mark.parametrize("when", [datetime.datetime(2030, 1, 1), "2030-01-01T00:00:00+00:00", 1893456000])
async def test_sleep_until_refuses_what_is_not_an_aware_datetime(when: Any) -> None:
    async def program(ctx: Context) -> None:
        await ctx.sleep_until(when)

    async with Kernel() as kernel:
        handle = await kernel.spawn(program)
        with pytest.raises(ProcessFailed):
            await handle.wait(timeout=10)
    assert handle.error is not None and handle.error["type"] == InvalidArgument.__name__
    assert "needs an aware datetime" in handle.error["message"], handle.error


async def test_a_resumed_program_that_sets_another_timer_in_the_slot_is_told(tmp_path: Path) -> None:
    await crash_while_waiting(tmp_path / "state.db", sleeps, 5.0, after=0.1)
    async with kernel_on(tmp_path / "state.db") as kernel:
        # The program now sleeps another length in the slot whose timer was set: it diverged.
        [record] = await kernel.store.load_processes()
        [handle] = await kernel.recover(programs={record.program: _sleeps_longer})
        with pytest.raises(ProcessFailed):
            await handle.wait(timeout=10)
        assert handle.stop_reason is StopReason.NON_DETERMINISM
        assert handle.error is not None and "sleep(10.0s)" in handle.error["message"]


async def _sleeps_longer(ctx: Context, seconds: float) -> float:
    return await sleeps(ctx, seconds * 2)
