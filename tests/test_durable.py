"""Durable execution: journaled syscalls are served again after a crash, never repeated."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from ringzero import Context, Kernel, ProcessStatus, StopReason
from ringzero.checkpointers import SqliteCheckpointer
from ringzero.core.contract.errors import NotResumed, ProcessFailed, ProgramNotFound
from ringzero.testing import ScriptedProvider
from tests.hosts import kill_host_when
from tests.programs import (
    echo_twice,
    logging_llm,
    parent_waits_for_child,
    prompted_then_the_host_died,
    receiver,
    record_tool,
)

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def call_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    log = tmp_path / "calls.log"
    log.touch()
    monkeypatch.setenv("RINGZERO_TEST_LOG", str(log))
    return log


def lines(path: Path) -> list[str]:
    return path.read_text().splitlines()


def crash_host_midrun(db: Path, rounds: int, call_log: Path) -> int:
    """Run durable_host in a subprocess, kill -9 it mid-run, return the pid it was running."""
    host = subprocess.Popen(
        [sys.executable, "-m", "tests.durable_host", str(db), str(rounds)],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.PIPE,
    )
    assert host.stdout is not None
    pid = int(host.stdout.readline())
    # mid-run: some rounds done
    assert kill_host_when(host, lambda: len(lines(call_log)) >= 9) == -signal.SIGKILL
    return pid


@pytest.mark.timeout(120)
async def test_kill_9_of_the_host_then_recover_repeats_no_recorded_call(tmp_path: Path, call_log: Path) -> None:
    db = tmp_path / "state.db"
    rounds = 12
    pid = await asyncio.to_thread(crash_host_midrun, db, rounds, call_log)
    before_crash = lines(call_log)
    assert 9 <= len(before_crash) < 2 * rounds, "the host was killed mid-run"

    store = SqliteCheckpointer(db)
    async with Kernel(checkpointer=store, llm=ScriptedProvider(logging_llm), tools={"record": record_tool}) as kernel:
        journal = await kernel.store.journal(pid)
        journaled = [f"{e.kind} {'step ' if e.kind == 'llm' else ''}{i // 2}" for i, e in enumerate(journal)]
        assert [j.split()[0] for j in journaled] == ["llm", "tool"] * (len(journal) // 2) + (
            ["llm"] if len(journal) % 2 else []
        )
        [handle] = await kernel.recover()
        assert handle.pid == pid
        result = await handle.wait(timeout=30)
        assert handle.status is ProcessStatus.EXITED

    assert result == [[f"answer to step {i}", i * i] for i in range(rounds)]
    counts = Counter(lines(call_log))
    for entry in journaled:  # every call whose result was journaled ran exactly once
        assert counts[entry] == 1, f"{entry} ran {counts[entry]} times"
    repeated = [call for call, n in counts.items() if n > 1]
    assert len(repeated) <= 1, f"only the call in flight at the kill may run twice, got {repeated}"
    assert sum(counts.values()) <= 2 * rounds + 1


async def test_recover_serves_recorded_llm_results_without_calling_the_provider(tmp_path: Path) -> None:
    db = tmp_path / "state.db"
    first = ScriptedProvider(lambda r: f"echo {r.messages[-1].content}")
    kernel = Kernel(checkpointer=SqliteCheckpointer(db), llm=first)
    p = await kernel.spawn(echo_twice, "hello")
    await p.wait()
    assert first.calls == 2
    # Pretend the host died before it recorded the exit: roll the record back to "running".
    record = await kernel.store.load_process(p.pid)
    assert record is not None
    record.status, record.stop_reason = ProcessStatus.RUNNING, None
    await kernel.store.save_process(record)
    await kernel.aclose()
    await kernel.checkpointer.aclose()

    second = ScriptedProvider(["must not be called"])
    async with Kernel(checkpointer=SqliteCheckpointer(db), llm=second) as again:
        [handle] = await again.recover()
        assert await handle.wait() == "echo echo hello"
    assert second.calls == 0


async def test_a_program_that_diverges_from_its_journal_fails_with_non_determinism(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    db = tmp_path / "state.db"
    monkeypatch.setenv("RINGZERO_TEST_PROMPT", "first")
    await prompted_then_the_host_died(db, ScriptedProvider(lambda r: "ok"))

    monkeypatch.setenv("RINGZERO_TEST_PROMPT", "something else")
    async with Kernel(checkpointer=SqliteCheckpointer(db), llm=ScriptedProvider(lambda r: "ok")) as kernel:
        [handle] = await kernel.recover()
        with pytest.raises(ProcessFailed, match="NonDeterminismError"):
            await handle.wait()
        assert handle.stop_reason is StopReason.NON_DETERMINISM
        assert handle.error is not None and "recorded as llm" in handle.error["message"]


async def test_unread_messages_survive_a_restart_and_read_ones_are_not_redelivered(tmp_path: Path) -> None:
    db = tmp_path / "state.db"
    kernel = Kernel(checkpointer=SqliteCheckpointer(db))
    p = await kernel.spawn(receiver, 3)
    await p.send("one")
    while len(await kernel.store.journal(p.pid)) < 1:
        await asyncio.sleep(0.005)
    await p.send("two")
    await p.send("three")
    await kernel.aclose()  # a shutdown mid-run, as a crash would leave it
    await kernel.checkpointer.aclose()

    async with Kernel(checkpointer=SqliteCheckpointer(db)) as again:
        [handle] = await again.recover()
        received = await asyncio.wait_for(handle.wait(), 5)
    assert received[0] == "one" and sorted(received[1:]) == ["three", "two"]


async def test_a_process_whose_program_cannot_be_imported_is_left_unfinished_until_it_can_be(tmp_path: Path) -> None:
    db = tmp_path / "state.db"

    async def local_program(ctx: Context) -> str:
        await ctx.sleep(0.2)
        return "done"

    kernel = Kernel(checkpointer=SqliteCheckpointer(db))
    await kernel.spawn(local_program)
    await asyncio.sleep(0.05)
    await kernel.aclose()
    await kernel.checkpointer.aclose()

    for _ in range(2):  # however often a resume cannot find it, it stays resumable
        async with Kernel(checkpointer=SqliteCheckpointer(db)) as again:
            [handle] = await again.recover()
            with pytest.raises(NotResumed, match="cannot import its program") as caught:
                await handle.wait()
            assert isinstance(caught.value.cause, ProgramNotFound) and caught.value.pid == handle.pid
            [row] = await again.ps(all=True)
            assert not row.status.terminal and row.stop_reason is None

    reference = f"{local_program.__module__}:{local_program.__qualname__}"
    async with Kernel(checkpointer=SqliteCheckpointer(db)) as third:  # one that has it finishes it
        [handle] = await third.recover(programs={reference: local_program})
        assert await handle.wait() == "done"


async def test_recover_accepts_programs_by_name(tmp_path: Path) -> None:
    db = tmp_path / "state.db"

    async def nested(ctx: Context) -> str:
        await ctx.sleep(0.01)
        return "resumed"

    kernel = Kernel(checkpointer=SqliteCheckpointer(db))
    await kernel.spawn(nested, name="nested")
    await kernel.aclose()
    await kernel.checkpointer.aclose()
    async with Kernel(checkpointer=SqliteCheckpointer(db)) as again:
        [handle] = await again.recover(programs={"nested": nested})
        assert await handle.wait() == "resumed"


@pytest.mark.parametrize(("child_seconds", "after_seconds"), [(0.3, 0.0), (0.0, 0.3)],
                         ids=["child-unfinished", "child-finished-before-the-crash"])
async def test_a_resumed_parent_finds_its_child_whether_or_not_the_child_had_finished(
    tmp_path: Path, child_seconds: float, after_seconds: float
) -> None:
    db = tmp_path / "state.db"
    kernel = Kernel(checkpointer=SqliteCheckpointer(db))
    parent = await kernel.spawn(parent_waits_for_child, 4, child_seconds, after_seconds)
    await asyncio.sleep(0.15)  # mid-run: the child naps, or has finished and the parent naps
    assert parent.status is ProcessStatus.WAITING
    await kernel.aclose()

    async with Kernel(checkpointer=SqliteCheckpointer(db)) as again:
        handles = await again.recover()
        assert parent.pid in [h.pid for h in handles]
        assert await asyncio.wait_for(again.get(parent.pid).wait(), 5) == 41
        assert again.get(parent.pid + 1).status is ProcessStatus.EXITED


async def test_spawn_with_parent_gives_the_child_a_slice_of_that_parents_budget() -> None:
    from ringzero import Limits
    from ringzero.testing import MemoryCheckpointer

    async def idle(ctx: Context) -> None:
        await ctx.sleep(3600)

    async with Kernel(checkpointer=MemoryCheckpointer()) as kernel:
        parent = await kernel.spawn(idle, limits=Limits(tokens=1000))
        child = await kernel.spawn(idle, parent=parent.pid, limits=Limits(tokens=300))
        assert kernel.runtime.process(parent.pid).meter.remaining("tokens") == 700
        await child.kill()
        assert kernel.runtime.process(parent.pid).meter.remaining("tokens") == 1000
        await parent.kill()


async def test_concurrent_syscalls_keep_their_program_order_slots_across_a_resume(tmp_path: Path) -> None:
    from tests import programs

    programs.CONCURRENT_RUNS.clear()
    db = tmp_path / "state.db"
    tools = {"slow_then_fast": programs.slow_then_fast}
    kernel = Kernel(checkpointer=SqliteCheckpointer(db), tools=tools)
    p = await kernel.spawn(programs.concurrent_syscalls)
    while len(await kernel.store.journal(p.pid)) < 2:
        await asyncio.sleep(0.005)
    entries = await kernel.store.journal(p.pid)
    assert [(e.seq, e.outcome.to_json()["value"]) for e in entries] == [(1, 10), (2, 20)]  # slots, not finishing order
    await kernel.aclose()  # the host stops during the sleep

    async with Kernel(checkpointer=SqliteCheckpointer(db), tools=tools) as again:
        [handle] = await again.recover()
        assert await handle.wait() == [10, 20]
    assert sorted(programs.CONCURRENT_RUNS) == [1, 2], "a recorded tool call ran again"
