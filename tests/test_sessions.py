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

from ringzero import Context, ExecLimits, Kernel
from ringzero.checkpointers import MemoryCheckpointer, SqliteCheckpointer
from ringzero.core._engine import session as sessions
from ringzero.core.contract.errors import Closed, InvalidArgument
from ringzero.providers.executors import MontyExecutor
from ringzero.testing import InProcessExecutor
from tests import session_host
from tests.session_host import STEP_1, STEP_3, note

ROOT = Path(__file__).resolve().parent.parent


SESSION_EXECUTORS = pytest.mark.parametrize("where", ["monty", "process"])
"""A session per executor that keeps an interpreter: a Monty worker, a confined sandbox process."""


@SESSION_EXECUTORS
async def test_what_step_1_defines_is_there_in_step_3_and_each_step_is_journaled(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str) -> None:
    monkeypatch.setenv("SESSION_LOG", str(tmp_path / "notes.log"))

    async def program(ctx: Context) -> Any:
        async with ctx.session() as session:
            first = await session.exec(STEP_1, tools={"note": note})
            await session.exec("total = 21")
            third = await session.exec(STEP_3, tools={"note": note})
            failed = await session.exec("undefined_name")
            return [first.error, third.value, failed.error is not None and "NameError" in str(failed.error)]

    monkeypatch.setenv("SESSION_EXECUTOR", where)
    async with Kernel(checkpointer=SqliteCheckpointer(tmp_path / "state.db"), executor=session_host.executor(),
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


def _host(db: Path, log: Path, calls: int, kill: str, where: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tests.session_host", str(db), str(log), str(calls)], cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT), "SESSION_KILL": kill, "SESSION_EXECUTOR": where},
                          capture_output=True, text=True, timeout=120)


@SESSION_EXECUTORS
@pytest.mark.parametrize("kill", ["between", "during"])
def test_a_host_killed_between_steps_or_during_one_resumes_with_the_session_and_no_call_again(
        tmp_path: Path, kill: str, where: str) -> None:
    """Killed once (``kill``), the host is started again: the resumed session runs step 1
    again only to rebuild (its call answered from the journal, not made), so step 3 finds
    ``double`` and ``Box``; every call ended once, but the one a kill caught in flight, which
    ran again under its key."""
    db, log, calls = tmp_path / "state.db", tmp_path / "notes.log", 30
    first = _host(db, log, calls, kill, where)
    assert first.returncode == -9, first.stderr
    again = _host(db, log, calls, kill, where)
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


@SESSION_EXECUTORS
async def test_a_session_is_bounded_by_its_limits_and_closed_with_its_process(
        monkeypatch: pytest.MonkeyPatch, where: str) -> None:
    """The session's memory is its limits' (a step past it fails, the interpreter kept), a
    step the executor stops (its wall limit) leaves a new, empty interpreter, and a session
    the program never closes is closed when its process ends."""
    monkeypatch.setenv("SESSION_EXECUTOR", where)
    opened: list[Any] = []

    async def program(ctx: Context) -> Any:
        session = ctx.session(limits=ExecLimits(memory_bytes=256 * 1024 * 1024, wall_seconds=10))
        opened.append(session)
        await session.exec("kept = 1")
        grown = await session.exec("big = 'x' * (1024 * 1024 * 1024)\nlen(big)")
        after = await session.exec("kept")  # Monty starts afresh after any limit; CPython's MemoryError is the code's
        stopped = await session.exec("while True:\n    pass", limits=ExecLimits(wall_seconds=0.5))
        again = await session.exec("kept")
        kept_now = after.error.type if after.error else after.value
        return [grown.error and grown.error.type, kept_now, stopped.error and stopped.error.type,
                again.error and again.error.type, open_sessions_of(ctx)]

    def open_sessions_of(ctx: Context) -> int:
        return sessions.open_sessions(ctx._process)  # type: ignore[attr-defined]

    executor = session_host.executor()
    async with Kernel(checkpointer=MemoryCheckpointer(), executor=executor, monitor_interval=None) as kernel:
        ended = await (await kernel.spawn(program)).wait(timeout=60)
        kept = {"monty": "NameError", "process": 1}[where]
        assert ended == ["MemoryError", kept, "TimeoutError", "NameError", 1]
        live = opened[0]._live  # closed with the process, though the program did not close it
        assert live is None
        if where == "process":
            assert [server.runs for server in executor.servers] == [0], "the session's sandbox process ended"
