"""The store fails under a running kernel: a typed CheckpointerError naming the cause, never a
silent loss. A process whose syscall could not be recorded stops unfinished (its program never
sees that result, and the store does not show it ended), and once the store is back,
``recover()`` finishes the work."""

from __future__ import annotations

import asyncio
import errno
import os
import sqlite3
import subprocess
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from ringzero import CheckpointerError, Context, Kernel, ProcessStatus
from ringzero.checkpointers import MemoryCheckpointer, PostgresCheckpointer, SqliteCheckpointer
from ringzero.core.contract.store import KernelStore
from ringzero.core.contract.types import Checkpoint
from ringzero.testing import InProcessExecutor, ScriptedProvider
from tests.postgres import PostgresServer, database_of, fresh_database, server_or_skip

CALLS: list[str] = []
AT_CALL: dict[int, Callable[[], object]] = {}
"""What to do when the model is asked for the n-th time (once), before it answers."""


def answer(request: object) -> str:
    prompt = request.messages[-1].content  # type: ignore[attr-defined]
    CALLS.append(prompt)
    happening = AT_CALL.pop(len(CALLS), None)
    if happening is not None:
        happening()
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


async def asks_once(ctx: Context) -> str:
    return (await ctx.llm("the last question")).content


ENDS = ("exited", "failed", "killed")


class RefusesEnds(MemoryCheckpointer):
    """A store that fails every write of a process's end while ``refusing`` (as a disk that
    fills up just then would), and takes every other write."""

    refusing = True

    async def put(self, checkpoint: Checkpoint) -> None:
        if self.refusing and checkpoint.namespace == "status" and checkpoint.metadata.get("status") in ENDS:
            raise CheckpointerError("the store is full (a test's refusal)")
        await super().put(checkpoint)

    async def put_many(self, checkpoints: Sequence[Checkpoint]) -> None:
        for checkpoint in checkpoints:  # refused before any of them is written, as one commit is
            if self.refusing and checkpoint.namespace == "status" and checkpoint.metadata.get("status") in ENDS:
                raise CheckpointerError("the store is full (a test's refusal)")
        await super().put_many(checkpoints)


async def test_an_end_that_could_not_be_written_is_not_shown_as_an_end() -> None:
    CALLS.clear()
    store = RefusesEnds()
    async with Kernel(checkpointer=store, llm=ScriptedProvider(answer)) as kernel:
        handle = await kernel.spawn(asks_once)
        with pytest.raises(CheckpointerError, match="full"):
            await handle.wait(timeout=30)
        assert not handle.status.terminal, "its status in memory is the one the store holds"
        assert handle.info().status is ProcessStatus.RUNNING
        stored = await kernel.store.load_process(handle.pid)
        assert stored is not None and not stored.status.terminal
        store.refusing = False
        [again] = await kernel.recover()
        assert await again.wait(timeout=30) == "answer to the last question"
        stored = await kernel.store.load_process(handle.pid)
        assert stored is not None and stored.status is ProcessStatus.EXITED
    assert CALLS == ["the last question"], "the recorded answer is served, not asked again"


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


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 32 MiB tmpfs mounted for the test: a disk that fills up."""
    where = tmp_path / "disk"
    where.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=32m", "tmpfs", str(where)], capture_output=True,
                             text=True)
    if mounted.returncode != 0:
        pytest.skip("a full disk is made by mounting a small tmpfs, which needs root (CAP_SYS_ADMIN); this host "
                    f"refused it: {mounted.stderr.strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], capture_output=True)


def fill(disk: Path) -> Path:
    """Take every free byte of ``disk`` with one file; deleting it gives the room back."""
    filler = disk / "filler"
    with filler.open("wb", buffering=0) as f:
        try:
            while True:
                f.write(b"\0" * 4096)
        except OSError as exc:
            assert exc.errno == errno.ENOSPC
    return filler


async def test_a_full_disk_stops_the_process_unfinished_until_there_is_room(small_disk: Path) -> None:
    CALLS.clear()
    db = small_disk / "state.db"
    expected = [f"answer to round {i}" for i in range(100)]
    async with kernel_on(db) as kernel:
        handle = await kernel.spawn(steady_worker, 100)
        while len(CALLS) < 5:
            await asyncio.sleep(0.005)
        filler = fill(small_disk)
        with pytest.raises(CheckpointerError, match="full") as caught:
            await handle.wait(timeout=60)
        assert str(db) in str(caught.value)
        assert not handle.status.terminal, "not reported as ended where its end was not recorded"
        seen = handle.state["done"]
        assert isinstance(seen, int) and seen < 100
        filler.unlink()  # room again
        assert await stored_status(db, handle.pid) not in ("exited", "failed", "killed")
        [again] = await kernel.recover()
        assert await again.wait(timeout=60) == expected
    assert sorted(set(CALLS)) == sorted(f"round {i}" for i in range(100))
    assert len(CALLS) <= 101, "only the call whose record could not be written is made again"


@pytest.fixture(scope="module")
def own_postgres() -> Iterator[PostgresServer]:
    """A PostgreSQL server of these tests' own: they stop it and cut its connections."""
    server = server_or_skip()
    server.start()
    try:
        yield server
    finally:
        server.remove()


def postgres_kernel(dsn: str) -> Kernel:
    return Kernel(checkpointer=PostgresCheckpointer(dsn, connect_timeout=2), llm=ScriptedProvider(answer),
                  executor=InProcessExecutor())


async def left_unfinished(handles: list[Any], rounds: int) -> list[int]:
    """Wait for every process; return the pids the store failure left unfinished (the rest ran to
    the end before or after it)."""
    pids = []
    for handle in handles:
        try:
            assert await handle.wait(timeout=60) == [f"answer to round {i}" for i in range(rounds)]
        except CheckpointerError as exc:
            assert "PostgreSQL at postgresql://postgres@127.0.0.1" in str(exc) and exc.__cause__ is not None
            assert not handle.status.terminal, "not reported as ended where its end was not recorded"
            pids.append(handle.pid)
    return pids


async def four_workers_under_way(kernel: Kernel) -> list[Any]:
    """Four processes of 100 rounds each, returned once 20 model calls are made between them."""
    CALLS.clear()
    handles = [await kernel.spawn(steady_worker, 100) for _ in range(4)]
    while len(CALLS) < 20:
        await asyncio.sleep(0.005)
    return handles


def check_calls_made_again(at_most: int) -> None:
    """Each round was asked by all four processes; only calls whose record could not be
    written (at most one per stopped process) were asked again."""
    made = {f"round {i}": CALLS.count(f"round {i}") for i in range(100)}
    assert all(n >= 4 for n in made.values())
    assert sum(n - 4 for n in made.values()) <= at_most, "only a call whose record could not be written is made again"


async def test_a_postgres_restart_mid_run_leaves_processes_unfinished_and_recover_finishes_them(
    own_postgres: PostgresServer,
) -> None:
    dsn = fresh_database(own_postgres.dsn)
    async with postgres_kernel(dsn) as kernel:
        handles = await four_workers_under_way(kernel)
        await asyncio.to_thread(own_postgres.stop, "fast")  # an operator's restart: down, then up
        try:
            stopped = await left_unfinished(handles, 100)
        finally:
            await asyncio.to_thread(own_postgres.start)
        assert sorted(stopped) == sorted(h.pid for h in handles), "every process was mid-run when the server went"
        async with postgres_kernel(dsn) as reader:  # what another host reads: none of them ended
            assert {p.status.value for p in await reader.ps(all=True)} <= {"ready", "running", "waiting"}
        again = await kernel.recover()
        assert sorted(h.pid for h in again) == sorted(stopped)
        assert await asyncio.gather(*(h.wait(timeout=60) for h in again)) == [
            [f"answer to round {i}" for i in range(100)]] * 4
    check_calls_made_again(at_most=4)


async def test_a_connection_killed_by_pg_terminate_backend_is_an_error_and_recover_finishes_the_work(
    own_postgres: PostgresServer,
) -> None:
    import psycopg

    dsn = fresh_database(own_postgres.dsn)
    killed: list[int] = []

    def terminate_every_connection() -> None:
        with psycopg.connect(own_postgres.dsn, autocommit=True) as admin:
            row = admin.execute("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                                "WHERE datname = %s", (database_of(dsn),)).fetchone()
        killed.append(row[0] if row is not None else 0)

    # Killed while a process waits for the model's answer: the record of that answer is the next
    # write, and it goes to a killed connection. (Killed from outside at a random moment, the
    # first write to fail was at times the kernel's own, of some transitions, which replaced
    # the pool before any process wrote: no process stopped, and the test could not tell.)
    AT_CALL[20] = terminate_every_connection
    async with postgres_kernel(dsn) as kernel:
        try:
            handles = await four_workers_under_way(kernel)
            stopped = await left_unfinished(handles, 100)
        finally:
            AT_CALL.clear()
        assert killed and killed[0] >= 1
        assert stopped, "a process whose write went to a killed connection stops"
        again = await kernel.recover()  # the server never went away: the same kernel finishes them
        assert sorted(h.pid for h in again) == sorted(stopped)
        for handle in again:
            assert await handle.wait(timeout=60) == [f"answer to round {i}" for i in range(100)]
    check_calls_made_again(at_most=len(stopped))
