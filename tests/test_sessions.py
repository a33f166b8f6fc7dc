"""Sessions (``ctx.session()``): a process's persistent interpreter, each step journaled. A
function and a class defined in step 1 are used in step 3; a host killed with SIGKILL between
two steps or during one resumes with the interpreter as it was after the last finished step,
and no tool call is made again (but the one in flight, under its key)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from ringzero import Context, Kernel
from ringzero.checkpointers import MemoryCheckpointer, SqliteCheckpointer
from ringzero.core.contract.errors import Closed, InvalidArgument
from ringzero.providers.executors import MontyExecutor
from ringzero.testing import InProcessExecutor
from tests.session_host import STEP_1, STEP_3, note

ROOT = Path(__file__).resolve().parent.parent


async def test_what_step_1_defines_is_there_in_step_3_and_each_step_is_journaled(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SESSION_LOG", str(tmp_path / "notes.log"))

    async def program(ctx: Context) -> Any:
        async with ctx.session() as session:
            first = await session.exec(STEP_1, tools={"note": note})
            await session.exec("total = 21")
            third = await session.exec(STEP_3, tools={"note": note})
            failed = await session.exec("undefined_name")
            return [first.error, third.value, failed.error is not None and "NameError" in str(failed.error)]

    async with Kernel(checkpointer=SqliteCheckpointer(tmp_path / "state.db"), executor=MontyExecutor(),
                      monitor_interval=None) as kernel:
        handle = await kernel.spawn(program)
        assert await handle.wait(timeout=60) == [None, 42, True]
        kinds = [entry.kind for entry in await kernel.store.journal(handle.pid)]
        calls = await kernel.store.calls(handle.pid)
    assert kinds.count("session") == 4, kinds
    assert sorted(entry.outcome.value for entry in calls[0].values()) == ["noted step 1", "noted step 3"]  # type: ignore


async def test_a_session_needs_an_executor_that_keeps_an_interpreter_and_is_closed_after() -> None:
    async def program(ctx: Context) -> Any:
        with pytest.raises(InvalidArgument, match="keeps no interpreter between runs"):
            ctx.session(executor=InProcessExecutor())
        async with ctx.session() as session:
            await session.exec("x = 1")
        with pytest.raises(Closed, match="session 1 of pid"):
            await session.exec("x")
        return "ok"

    async with Kernel(checkpointer=MemoryCheckpointer(), executor=MontyExecutor(), monitor_interval=None) as kernel:
        assert await (await kernel.spawn(program)).wait(timeout=60) == "ok"


def notes(log: Path) -> list[tuple[str, str, str]]:
    return [(word, what, key[0] if key else "") for word, what, *key in
            (line.split() for line in log.read_text().splitlines())]


def _host(db: Path, log: Path, calls: int, kill: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tests.session_host", str(db), str(log), str(calls)], cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT), "SESSION_KILL": kill}, capture_output=True,
                          text=True, timeout=120)


@pytest.mark.parametrize("kill", ["between", "during"])
def test_a_host_killed_between_steps_or_during_one_resumes_with_the_session_and_no_call_again(
        tmp_path: Path, kill: str) -> None:
    """Killed once (``kill``), the host is started again: the resumed session runs step 1
    again only to rebuild (its call answered from the journal, not made), so step 3 finds
    ``double`` and ``Box``; every call ended once, but the one a kill caught in flight, which
    ran again under its key."""
    db, log, calls = tmp_path / "state.db", tmp_path / "notes.log", 30
    first = _host(db, log, calls, kill)
    assert first.returncode == -9, first.stderr
    again = _host(db, log, calls, kill)
    assert again.returncode == 0 and f"result {2 * sum(range(calls + 1))}" in again.stdout, again.stderr
    seen = notes(log)
    starts = Counter(what for word, what, _ in seen if word == "start")
    ends = Counter(what for word, what, _ in seen if word == "end")
    expected = {"step", *map(str, range(1, calls + 1))}  # 'step 1' and 'step 3' split on their space
    assert set(ends) == expected and starts["step"] == 2 and ends["step"] == 2, seen  # step 1 and step 3, once each
    twice = [what for what, count in starts.items() if count > 1 and what != "step"]
    assert twice == (["10"] if kill == "during" else []), starts
    if kill == "during":  # the call in flight: again, under the key it had
        assert len({key for word, what, key in seen if what == "10"}) == 1, seen
    assert all(ends[what] == 1 for what in ends if what != "step"), ends
