"""Tool calls from code journaled in the sandbox's own thread (``ToolCalls.call_here``): a
quick sync tool that Monty calls from its thread is answered there, its intent and its result
appended to the SQLite store from there (``capabilities.append_anywhere``), with no hop to
the event loop; and a host killed with SIGKILL at any point of such calls resumes with each
call made once, the one in flight at most once more under its key."""

from __future__ import annotations

import os
import random
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from ringzero import Context, Kernel
from ringzero.checkpointers import SqliteCheckpointer
from ringzero.core.contract.types import Checkpoint
from ringzero.providers.executors import MontyExecutor
from tests.hosts import kill_host_when, stop_host
from tests.journal_here_host import code, note

ROOT = Path(__file__).resolve().parent.parent


class WatchedStore(SqliteCheckpointer):
    """Keeps which threads appended through ``append_here``, and whether the store took them."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.here: list[tuple[int, bool]] = []

    def append_here(self, checkpoint: Checkpoint) -> bool:
        taken = super().append_here(checkpoint)
        self.here.append((threading.get_ident(), taken))
        return taken


async def test_quick_tool_calls_from_code_are_journaled_from_montys_thread(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NOTE_LOG", str(tmp_path / "notes.log"))
    store = WatchedStore(tmp_path / "state.db")
    loop_thread = threading.get_ident()

    async def program(ctx: Context) -> Any:
        await ctx.exec("note(0)", tools={"note": note})
        return (await ctx.exec(code(50), tools={"note": note})).value

    async with Kernel(checkpointer=store, executor=MontyExecutor(), monitor_interval=None) as kernel:
        handle = await kernel.spawn(program)
        assert await handle.wait(timeout=60) == sum(range(51))
        calls = await kernel.store.calls(handle.pid)
    taken = [thread for thread, ok in store.here if ok]
    assert len(taken) >= 100 and loop_thread not in taken, store.here[:5]  # 50 intents and 50 results, off the loop
    recorded = {key: entry.outcome.value for key, entry in calls[0].items()}  # type: ignore[attr-defined]
    assert sorted(recorded.values()) == list(range(51)), recorded


def notes(log: Path) -> list[tuple[str, int, str]]:
    return [(word, int(n), key[0] if key else "") for word, n, *key in
            (line.split() for line in log.read_text().splitlines())]


@pytest.mark.slow
def test_a_host_killed_at_any_point_of_calls_journaled_from_montys_thread_makes_each_once(tmp_path: Path) -> None:
    """Eight trials, each a kill at a random moment of the run (seeded, printed), then a new host
    that resumes it: every call ended, none started twice but the one the kill caught in flight,
    which ran again under the same key (the tool takes one: safe to repeat), and the result is
    the uninterrupted run's."""
    seed = int(os.environ.get("CRASH_SEED", str(int(time.time()))))
    print(f"seed {seed}")
    draw = random.Random(seed)
    calls = 300
    for trial in range(8):
        db, log = tmp_path / f"state-{trial}.db", tmp_path / f"notes-{trial}.log"
        first = _host(db, log, calls)
        assert first.stdout is not None
        assert first.stdout.readline().strip() == "running"
        kill_at = time.monotonic() + draw.uniform(0.0, 0.6)
        kill_host_when(first, lambda at=kill_at: time.monotonic() >= at)
        print(f"trial {trial}: killed with {len(notes(log)) if log.exists() else 0} lines of notes")
        again = _host(db, log, calls)
        try:
            out, _ = again.communicate(timeout=120)
        finally:
            stop_host(again)
        assert again.returncode == 0 and f"result {sum(range(calls + 1))}" in out, (trial, out)
        seen = notes(log)
        starts = Counter(n for word, n, _ in seen if word == "start")
        ends = Counter(n for word, n, _ in seen if word == "end")
        assert set(ends) == set(range(calls + 1)), (trial, sorted(set(range(calls + 1)) - set(ends)))
        twice = [n for n, count in starts.items() if count > 1]
        assert len(twice) <= 1 and all(starts[n] == 2 for n in twice), (trial, twice)
        for n in twice:  # the call in flight: again under the key it had
            assert len({key for word, m, key in seen if m == n}) == 1, (trial, n, seen)
        assert all(ends[n] == 1 for n in ends if n not in twice), (trial, ends)


def _host(db: Path, log: Path, calls: int) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "tests.journal_here_host", str(db), str(log), str(calls)], cwd=ROOT,
                            env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.PIPE, text=True)


def test_a_journal_write_waiting_on_a_loop_that_stopped_ends_instead_of_hanging_the_thread() -> None:
    """Where the store cannot take a record from Monty's thread, the write is made on the loop
    and waited for; a loop that stopped (its kernel closed while the code ran on) ends that wait
    with CheckpointerError, so none of Monty's few threads waits for ever."""
    import asyncio

    from ringzero.core._engine.tool_calls import journal_on_loop
    from ringzero.core.contract.errors import CheckpointerError

    written: list[str] = []

    async def write() -> None:
        written.append("made")

    stopped = asyncio.new_event_loop()  # made, never run: as a kernel's loop once it stopped
    started = time.monotonic()
    with pytest.raises(CheckpointerError, match="the kernel stopped before this tool call could be journaled"):
        journal_on_loop(stopped, write())
    assert time.monotonic() - started < 5 and written == []
    stopped.close()
    with pytest.raises(CheckpointerError, match="could be journaled"):
        journal_on_loop(stopped, write())  # closed: refused at once
