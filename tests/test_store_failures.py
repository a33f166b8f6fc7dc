"""The store fails under a running kernel: a typed CheckpointerError naming the cause, never a
silent loss. A process whose syscall could not be recorded stops unfinished (its program never
sees that result, and the store does not show it ended), and once the store is back,
``recover()`` finishes the work."""

from __future__ import annotations

import asyncio
import os
import sqlite3
from pathlib import Path

import pytest

from ringzero import CheckpointerError, Context, Kernel
from ringzero.checkpointers import SqliteCheckpointer
from ringzero.core.store import KernelStore
from ringzero.testing import InProcessExecutor, ScriptedProvider

CALLS: list[str] = []


def answer(request: object) -> str:
    prompt = request.messages[-1].content  # type: ignore[attr-defined]
    CALLS.append(prompt)
    return f"answer to {prompt}"


async def steady_worker(ctx: Context, rounds: int) -> list[str]:
    """A model call, then a short nap, ``rounds`` times; ``ctx.state['done']`` counts what it saw."""
    out = []
    for i in range(rounds):
        out.append((await ctx.llm(f"round {i}")).content)
        ctx.state["done"] = i + 1
        await ctx.sleep(0.01)
    return out


def kernel_on(db: Path, busy_timeout: float = 30.0) -> Kernel:
    return Kernel(checkpointer=SqliteCheckpointer(db, busy_timeout=busy_timeout), llm=ScriptedProvider(answer),
                  executor=InProcessExecutor())


async def stored_status(db: Path, pid: int) -> str:
    store = SqliteCheckpointer(db)
    try:
        record = await KernelStore(store).load_process(pid)
        assert record is not None
        return record.status.value
    finally:
        await store.aclose()


async def test_a_file_locked_past_the_busy_timeout_stops_the_process_unfinished_until_it_is_free(
    tmp_path: Path,
) -> None:
    CALLS.clear()
    db = tmp_path / "state.db"
    expected = [f"answer to round {i}" for i in range(40)]
    async with kernel_on(db, busy_timeout=0.2) as kernel:
        handle = await kernel.spawn(steady_worker, 40)
        while len(CALLS) < 5:
            await asyncio.sleep(0.005)
        locker = sqlite3.connect(db, isolation_level=None)
        locker.execute("BEGIN EXCLUSIVE")  # another writer that keeps the lock past the busy timeout
        try:
            with pytest.raises(CheckpointerError, match="locked") as caught:
                await handle.wait(timeout=30)
        finally:
            locker.execute("ROLLBACK")
            locker.close()
        assert str(db) in str(caught.value)
        assert not handle.status.terminal, "not reported as ended where its end was not recorded"
        assert await stored_status(db, handle.pid) not in ("exited", "failed", "killed")
        [again] = await kernel.recover()  # the store is back: the same kernel finishes it
        assert await again.wait(timeout=30) == expected
    assert sorted(set(CALLS)) == sorted(f"round {i}" for i in range(40))


async def test_a_file_deleted_under_a_running_kernel_is_an_error_not_a_silent_loss(tmp_path: Path) -> None:
    CALLS.clear()
    db = tmp_path / "state.db"
    kept = tmp_path / "kept"
    kept.mkdir()
    expected = [f"answer to round {i}" for i in range(40)]
    async with kernel_on(db) as kernel:
        handle = await kernel.spawn(steady_worker, 40)
        while len(CALLS) < 5:
            await asyncio.sleep(0.005)
        for suffix in ("", "-wal", "-shm"):  # what an operator's backup keeps: hard links to the files
            os.link(f"{db}{suffix}", kept / f"state.db{suffix}")
            os.unlink(f"{db}{suffix}")
        with pytest.raises(CheckpointerError, match="deleted or replaced") as caught:
            await handle.wait(timeout=30)
        assert str(db) in str(caught.value)
        seen = handle.state["done"]
    assert isinstance(seen, int) and seen < 40
    for suffix in ("", "-wal", "-shm"):  # the file is restored
        os.replace(kept / f"state.db{suffix}", f"{db}{suffix}")
    async with kernel_on(db) as kernel:
        [again] = await kernel.recover()
        assert await again.wait(timeout=30) == expected
