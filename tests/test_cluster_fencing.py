"""Ownership between kernels that share one PostgreSQL store (what a cluster's failover rests
on): racing takeovers, and a kernel that keeps running a process another node took."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from ringzero import Context, Fenced, Kernel
from ringzero.checkpointers.postgres import PostgresCheckpointer
from ringzero.testing import ScriptedProvider
from tests.postgres import fresh_database
from tests.test_cli import ringzero_cli


async def slow_steps(ctx: Context, n: int) -> list[str]:
    """n LLM calls with a sleep between them, long enough to be caught mid-run."""
    out = []
    for i in range(n):
        out.append((await ctx.llm(f"step {i}")).content)
        await ctx.sleep(0.1)
    return out


def _node(dsn: str, name: str, calls: list[str]) -> Kernel:
    def answer(request: object) -> str:
        prompt = request.messages[-1].content  # type: ignore[attr-defined]
        calls.append(f"{name} {prompt}")
        return f"{name} says {prompt}"

    return Kernel(llm=ScriptedProvider(answer), checkpointer=PostgresCheckpointer(dsn), node=name)


@pytest.fixture
async def dsn(postgres_dsn: str) -> AsyncIterator[str]:
    yield fresh_database(postgres_dsn)


async def test_of_nodes_racing_to_take_a_process_over_exactly_one_wins(dsn: str) -> None:
    calls: list[str] = []
    first = _node(dsn, "a", calls)
    await first.start()
    pids = [(await first.spawn(slow_steps, 3)).pid for _ in range(20)]
    await asyncio.sleep(0.05)
    await first.aclose()  # node a is gone with its processes mid-run
    racers = [_node(dsn, name, calls) for name in ("b", "c", "d")]
    taken = await asyncio.gather(*(k.recover(pids=pids, from_node="a") for k in racers))
    try:
        by_pid = [h.pid for handles in taken for h in handles]
        assert sorted(by_pid) == sorted(pids)  # every process once, none twice
        results = await asyncio.gather(*(h.wait(30) for handles in taken for h in handles))
        assert all(len(r) == 3 for r in results)
        owners = await racers[0].store.owners()
        assert all(owners[pid][0] == 2 and owners[pid][1] in "bcd" for pid in pids)
    finally:
        for kernel in racers:
            await kernel.aclose()


async def test_a_kernel_still_running_a_process_that_was_taken_over_records_nothing_more(dsn: str) -> None:
    calls: list[str] = []
    old, new = _node(dsn, "old", calls), _node(dsn, "new", calls)
    await old.start()
    try:
        stale = await old.spawn(slow_steps, 20)  # 2 s: longer than the ownership lease
        while not any(c.startswith("old step 1") for c in calls):
            await asyncio.sleep(0.01)
        # "old" is believed dead (it is not): "new" claims the process and runs it from its journal.
        (moved,) = await new.recover(pids=[stale.pid])
        result = await moved.wait(30)
        with pytest.raises(Fenced):
            await stale.wait(30)  # old's next journal write found the slot taken, and it stopped
        journal = await new.store.journal(stale.pid)
        llm_slots = [e.seq for e in journal if e.kind == "llm"]
        assert len(llm_slots) == 20 == len(set(llm_slots))  # every slot recorded once
        # What the process returned is what the journal holds, whichever node answered each call.
        assert result == [e.outcome.to_json()["value"]["message"]["content"]  # type: ignore[call-overload,index]
                          for e in journal if e.kind == "llm"]
        assert result[0] == "old says step 0"  # recorded by old before the takeover, not asked again
        assert calls.count("new step 0") == 0
        record = await new.store.load_process(stale.pid)
        assert record is not None and record.status.value == "exited"
    finally:
        await old.aclose()
        await new.aclose()


def resume_kernel(dsn: str) -> Kernel:
    """``ringzero resume --kernel`` for the test below: a node kernel's provider, no node name."""
    return Kernel(llm=ScriptedProvider(lambda r: f"resumed says {r.messages[-1].content}"),
                  checkpointer=PostgresCheckpointer(dsn))


async def test_ps_and_resume_work_against_the_cluster_store(dsn: str, tmp_path: Path) -> None:
    calls: list[str] = []
    node = _node(dsn, "node-a", calls)
    await node.start()
    pids = [(await node.spawn(slow_steps, 4)).pid for _ in range(3)]
    while sum(c.startswith("node-a step 1") for c in calls) < 3:
        await asyncio.sleep(0.01)
    await node.aclose()  # its host went away mid-run

    listing = await asyncio.to_thread(ringzero_cli, "ps", "--db", dsn, cwd=tmp_path)
    assert listing.returncode == 0, listing.stderr
    assert "node" in listing.stdout and listing.stdout.count("node-a") == 3
    assert "postgres@127.0.0.1" in listing.stdout  # the store named as the server, without a password

    out = await asyncio.to_thread(ringzero_cli, "resume", "--db", dsn, "--kernel",
                                  "tests.test_cluster_fencing:resume_kernel", cwd=tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "resumed 3 process(es)" in out.stdout
    check = Kernel(checkpointer=PostgresCheckpointer(dsn))
    try:
        for pid in pids:
            record = await check.store.load_process(pid)
            assert record is not None and record.status.value == "exited"
            assert record.result[:2] == ["node-a says step 0", "node-a says step 1"]  # type: ignore[index]
            assert record.result[3] == "resumed says step 3"  # type: ignore[index]
        owners = await check.store.owners()
        assert all(owners[pid][0] == 2 and owners[pid][1].startswith("resume@") for pid in pids)
    finally:
        await check.aclose()
    listing = await asyncio.to_thread(ringzero_cli, "ps", "--db", dsn, cwd=tmp_path)
    assert listing.stdout.count("resume@") == 3 and listing.stdout.count("exited") == 3
