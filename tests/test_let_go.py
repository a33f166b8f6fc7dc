"""Letting waiting processes go (``Kernel.let_go_waiting``, what ``ringzero serve`` runs): a
process that waits for a message or on a timer leaves memory, and a message (from this kernel,
another kernel on the store, or a process) or its timer brings it back, replayed from its
journal: the calls it made before are not made again."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from pathlib import Path
from typing import Any

from ringzero import Context, Kernel
from ringzero.checkpointers import SqliteCheckpointer
from ringzero.testing import ScriptedProvider

RUNS: Counter[str] = Counter()
"""How many times each program's code ran from the top (a replay runs it again)."""


def kernel_on(db: Path, answers: Counter[str] | None = None) -> Kernel:
    def answer(request: Any) -> str:
        if answers is not None:
            answers[request.messages[-1].content] += 1
        return f"answer to {request.messages[-1].content}"

    return Kernel(checkpointer=SqliteCheckpointer(db), llm=ScriptedProvider(answer), monitor_interval=0.1)


async def asks_then_waits(ctx: Context) -> list[Any]:
    RUNS["asks_then_waits"] += 1
    draft = await ctx.llm("draft")
    approval = await ctx.recv()
    return [draft.content, approval]


async def naps(ctx: Context, seconds: float) -> float:
    RUNS["naps"] += 1
    await ctx.sleep(seconds)
    return time.time()


async def tells(ctx: Context, pid: int) -> str:
    await ctx.send(pid, "from a process")
    return "sent"


async def parent_of_a_waiter(ctx: Context) -> Any:
    child = await ctx.spawn(asks_then_waits)
    return await ctx.wait(child)


async def let_go(kernel: Kernel, count: int = 1, within: float = 5.0) -> None:
    """Wait until ``count`` processes are let go."""
    assert kernel.keeper is not None
    give_up = time.monotonic() + within
    while len(kernel.keeper.let_go) < count and time.monotonic() < give_up:
        await asyncio.sleep(0.02)
    assert len(kernel.keeper.let_go) == count, kernel.keeper.let_go


async def ended(kernel: Kernel, pid: int, within: float = 10.0) -> Any:
    handle = await kernel.handle(pid)  # one that follows the process through the store
    return await handle.wait(timeout=within)


async def test_a_waiting_process_is_let_go_and_a_message_brings_it_back_without_asking_again(
        tmp_path: Path) -> None:
    answers: Counter[str] = Counter()
    RUNS.clear()
    async with kernel_on(tmp_path / "state.db", answers) as kernel:
        kernel.let_go_waiting(0.2)
        pid = (await kernel.spawn(asks_then_waits)).pid
        await let_go(kernel)
        assert kernel.runtime.procs == {} and kernel.hosting == 1  # nothing of it in memory
        await kernel.send(pid, "approved")
        assert await ended(kernel, pid) == ["answer to draft", "approved"]
    assert answers == {"draft": 1}, "the model call made before it was let go was made again"
    assert RUNS["asks_then_waits"] == 2  # its first run, and its replay when it came back


async def test_a_sleeper_let_go_wakes_at_its_deadline(tmp_path: Path) -> None:
    async with kernel_on(tmp_path / "state.db") as kernel:
        kernel.let_go_waiting(0.2)
        started = time.time()
        pid = (await kernel.spawn(naps, 1.5)).pid
        await let_go(kernel)
        woke = await ended(kernel, pid)
    assert started + 1.5 <= woke < started + 2.0, woke - started


async def test_a_message_from_another_kernel_on_the_store_brings_it_back(tmp_path: Path) -> None:
    async with kernel_on(tmp_path / "state.db") as kernel:
        kernel.let_go_waiting(0.2)
        pid = (await kernel.spawn(asks_then_waits)).pid
        await let_go(kernel)
        async with Kernel(checkpointer=SqliteCheckpointer(tmp_path / "state.db")) as other:  # another OS process's
            await other.send(pid, "from elsewhere")
        assert await ended(kernel, pid) == ["answer to draft", "from elsewhere"]


async def test_a_process_s_send_brings_back_a_process_let_go(tmp_path: Path) -> None:
    async with kernel_on(tmp_path / "state.db") as kernel:
        kernel.let_go_waiting(0.2)
        pid = (await kernel.spawn(asks_then_waits)).pid
        await let_go(kernel)
        assert await (await kernel.spawn(tells, pid)).wait(timeout=10) == "sent"
        assert await ended(kernel, pid) == ["answer to draft", "from a process"]


async def test_processes_waiting_in_the_store_are_let_go_without_being_replayed(tmp_path: Path) -> None:
    RUNS.clear()
    async with kernel_on(tmp_path / "state.db") as host:  # a host that dies with three processes waiting
        pids = [(await host.spawn(asks_then_waits)).pid for _ in range(2)]
        pids.append((await host.spawn(naps, 3600)).pid)
        while any(host.get(pid).status.value != "waiting" for pid in pids):
            await asyncio.sleep(0.02)
    assert RUNS == {"asks_then_waits": 2, "naps": 1}
    async with kernel_on(tmp_path / "state.db") as kernel:
        keeper = kernel.let_go_waiting(0.2)
        let_go_pids, resumed = await keeper.adopt()
        assert sorted(let_go_pids) == sorted(pids) and resumed == []
        assert kernel.runtime.procs == {} and RUNS == {"asks_then_waits": 2, "naps": 1}  # none replayed
        await kernel.send(pids[0], "yes")
        assert await ended(kernel, pids[0]) == ["answer to draft", "yes"]
        assert RUNS["asks_then_waits"] == 3  # only the one the message was for


async def test_a_child_and_its_waiting_parent_are_not_let_go(tmp_path: Path) -> None:
    async with kernel_on(tmp_path / "state.db") as kernel:
        kernel.let_go_waiting(0.1)
        parent = await kernel.spawn(parent_of_a_waiter)
        await asyncio.sleep(0.6)
        assert kernel.keeper is not None and kernel.keeper.let_go == {}
        assert len(kernel.runtime.procs) == 2
        child = next(pid for pid in kernel.runtime.procs if pid != parent.pid)
        await kernel.send(child, "ok")
        assert await parent.wait(timeout=10) == ["answer to draft", "ok"]


async def test_a_child_waiting_in_the_store_is_resumed_not_let_go(tmp_path: Path) -> None:
    async with kernel_on(tmp_path / "state.db") as host:
        parent = await host.spawn(parent_of_a_waiter)
        while len(host.runtime.procs) < 2 or any(p.status.value != "waiting" for p in host.runtime.procs.values()):
            await asyncio.sleep(0.02)
        child = next(pid for pid in host.runtime.procs if pid != parent.pid)
    async with kernel_on(tmp_path / "state.db") as kernel:
        let_go_pids, resumed = await kernel.let_go_waiting(0.2).adopt()
        assert let_go_pids == [] and sorted(h.pid for h in resumed) == sorted([parent.pid, child])
        await kernel.send(child, "ok")
        assert await ended(kernel, parent.pid) == ["answer to draft", "ok"]


async def test_on_postgresql_waiting_processes_are_adopted_let_go_and_brought_back(postgres_dsn: str) -> None:
    from tests.postgres import fresh_database

    dsn = fresh_database(postgres_dsn)
    RUNS.clear()
    async with Kernel(checkpointer=dsn, llm=ScriptedProvider(lambda r: "ok")) as host:
        waiter = (await host.spawn(asks_then_waits)).pid
        sleeper = (await host.spawn(naps, 2.0)).pid
        while any(host.get(pid).status.value != "waiting" for pid in (waiter, sleeper)):
            await asyncio.sleep(0.02)
    async with Kernel(checkpointer=dsn, llm=ScriptedProvider(lambda r: "ok"), monitor_interval=0.1) as kernel:
        let_go_pids, resumed = await kernel.let_go_waiting(0.2).adopt()
        assert sorted(let_go_pids) == sorted([waiter, sleeper]) and resumed == []
        async with Kernel(checkpointer=dsn) as other:
            await other.send(waiter, "from elsewhere")
        assert await ended(kernel, waiter) == ["ok", "from elsewhere"]
        assert isinstance(await ended(kernel, sleeper), float)
    assert RUNS == {"asks_then_waits": 2, "naps": 2}  # each ran once and was replayed once: no other replay


async def test_a_burst_of_messages_wakes_every_process_let_go(tmp_path: Path) -> None:
    async with kernel_on(tmp_path / "state.db") as kernel:
        kernel.let_go_waiting(0.2)
        pids = [h.pid for h in await asyncio.gather(*(kernel.spawn(asks_then_waits) for _ in range(120)))]
        await let_go(kernel, count=120)
        async with Kernel(checkpointer=SqliteCheckpointer(tmp_path / "state.db")) as other:
            for pid in pids:  # more wake commands than one read of the newest takes
                await other.send(pid, pid)
        results = await asyncio.gather(*(ended(kernel, pid, within=30) for pid in pids))
    assert results == [["answer to draft", pid] for pid in pids]


async def test_a_process_let_go_and_brought_back_counts_the_time_it_waited_as_wall_time(tmp_path: Path) -> None:
    """``ps`` showed ``wall s`` 0.0 for a process ``serve`` had let go and woken: the time it
    waited in the store was lost. It counts, as it does for one kept in memory while it waits."""
    async with kernel_on(tmp_path / "state.db") as kernel:
        kernel.let_go_waiting(0.2)
        started = time.monotonic()
        pid = (await kernel.spawn(naps, 1.0)).pid
        await let_go(kernel)
        await ended(kernel, pid)
        lived = time.monotonic() - started
        record = await kernel.store.load_process(pid)
    assert record is not None and 0.9 <= record.wall_seconds <= lived + 0.05, (record.wall_seconds, lived)
