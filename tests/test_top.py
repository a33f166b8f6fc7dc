"""``ringzero top`` as a person uses it: in a real terminal (tmux), against a kernel in another OS
process; and the kernel's side of it (``ringzero.core.support.monitor``)."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from ringzero import Context, Kernel
from ringzero.checkpointers import MemoryCheckpointer, SqliteCheckpointer
from ringzero.core.contract.errors import InvalidArgument
from ringzero.core.contract.store import KernelStore
from ringzero.core.support.monitor import command_outcome, read_activity, send_command
from ringzero.testing import ScriptedProvider
from ringzero.top import TopView, _follow, parse_keys, read_snapshot
from tests.debian import apt_install
from tests.postgres import fresh_database
from tests.test_cli import ROOT, ringzero_cli

ROW = re.compile(r"^\s*(?P<selected>>?)\s*(?P<pid>\d+)\s+(?P<name>chatty-\d|victim)\s+(?P<status>[a-z]+)"
                 r"(?: \([a-z_]+\))?\s+(?P<priority>\d+)\s+(?P<tokens>[\d,]+)\s+(?P<cost>[\d.]+)\s+(?P<llm>\d+)")


def rows(screen: str) -> list[dict[str, str]]:
    """The process rows on a screen of ``top``, top to bottom."""
    return [m.groupdict() for m in map(ROW.match, screen.splitlines()) if m]


class Tmux:
    """One tmux server of the test's own (its socket in the test's folder), one window."""

    def __init__(self, folder: Path) -> None:
        self.socket = str(folder / "tmux.sock")

    def run(self, *args: str) -> str:
        return subprocess.run(["tmux", "-S", self.socket, *args], check=True, capture_output=True, text=True,
                              timeout=30).stdout

    def start(self, command: list[str], env: dict[str, str]) -> None:
        # The size of a terminal a person might have; COLUMNS and LINES from the test's own
        # environment would override it for rich.
        settings = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
        line = f"env -u COLUMNS -u LINES {settings} {shlex.join(command)}; echo top exited with status $?"
        self.run("new-session", "-d", "-s", "top", "-x", "150", "-y", "36", line)
        self.run("set-option", "-t", "top", "remain-on-exit", "on")  # to read how it exited

    def keys(self, *keys: str) -> None:
        for key in keys:  # one at a time, as fingers press them
            self.run("send-keys", "-t", "top", key)
            time.sleep(0.1)

    def screen(self) -> str:
        return self.run("capture-pane", "-p", "-t", "top")

    def wait_for(self, what: str, ok: Callable[[str], bool], timeout: float = 15.0) -> str:
        deadline = time.monotonic() + timeout
        while True:
            screen = self.screen()
            if ok(screen):
                return screen
            if time.monotonic() > deadline:
                raise AssertionError(f"waited {timeout} s for {what}; the screen shows:\n{screen}")
            time.sleep(0.2)

    def exit_status(self, timeout: float = 10.0) -> int:
        """The exit status of the program in the window, once it has exited (the shell says it)."""
        said = re.compile(r"top exited with status (\d+)|Pane is dead \(status (\d+)")  # the shell's, or tmux's
        screen = self.wait_for("the program to exit", lambda s: said.search(s) is not None, timeout)
        found = said.search(screen)
        assert found is not None
        return int(found.group(1) or found.group(2))

    def close(self) -> None:
        subprocess.run(["tmux", "-S", self.socket, "kill-server"], capture_output=True, timeout=30)


@pytest.fixture
def tmux(tmp_path: Path) -> Iterator[Tmux]:
    if shutil.which("tmux") is None and not apt_install("tmux"):
        pytest.skip("tmux is not installed and cannot be installed here (apt-get needs root): the top tests "
                    "drive a real terminal under tmux")
    terminal = Tmux(tmp_path)
    try:
        yield terminal
    finally:
        terminal.close()


class KernelHost:
    """``tests.top_host`` in an OS process of its own: the kernel ``top`` watches."""

    def __init__(self, db: Path) -> None:
        self.db = db
        self.proc = subprocess.Popen([sys.executable, "-m", "tests.top_host", str(db)], cwd=ROOT, text=True,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     env={**os.environ, "PYTHONPATH": str(ROOT)})
        assert self.proc.stdout is not None
        assert self.proc.stdout.readline().strip() == "started"

    def line(self, timeout: float = 20.0) -> dict[str, object]:
        """The next process the host reports ended."""
        assert self.proc.stdout is not None
        got: list[str] = []
        reader = threading.Thread(target=lambda: got.append(self.proc.stdout.readline()))  # type: ignore[union-attr]
        reader.start()
        reader.join(timeout)
        assert got and got[0], f"the kernel host reported nothing in {timeout} s: {self.proc.stderr}"
        return dict(json.loads(got[0]))

    def finish(self) -> list[dict[str, object]]:
        """Let the chatty agents end; what every remaining process ended with."""
        Path(f"{self.db}.done").touch()
        out, err = self.proc.communicate(timeout=30)
        assert self.proc.returncode == 0, err
        return [json.loads(line) for line in out.splitlines() if line.strip()]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.communicate(timeout=10)  # and its pipes closed


@pytest.fixture
def host(tmp_path: Path) -> Iterator[KernelHost]:
    running = KernelHost(tmp_path / "state.db")
    try:
        yield running
    finally:
        running.stop()


def top_command(db: Path) -> tuple[list[str], dict[str, str]]:
    return [sys.executable, "-m", "ringzero.cli", "top", "--db", str(db), "--interval", "0.3"], \
        {"PYTHONPATH": str(ROOT), "TERM": "xterm-256color"}


@pytest.mark.timeout(120)
def test_top_in_a_terminal_sorts_selects_and_kills_a_process_of_another_os_process(
        tmux: Tmux, host: KernelHost) -> None:
    tmux.start(*top_command(host.db))
    screen = tmux.wait_for("the four processes, live", lambda s: len(rows(s)) == 4 and "1 live kernel" in s)
    assert [r["name"] for r in rows(screen)] == ["chatty-1", "chatty-2", "chatty-3", "victim"]  # by pid
    assert "sleep" in screen or "llm" in screen  # the syscall each is in now

    tmux.keys("s")  # pid -> tokens, biggest first
    screen = tmux.wait_for("the rows sorted by tokens", lambda s: "sort: tokens ↓" in s
                           and [r["name"] for r in rows(s)] == ["chatty-3", "chatty-2", "chatty-1", "victim"])
    tokens = [int(r["tokens"].replace(",", "")) for r in rows(screen)]
    assert tokens == sorted(tokens, reverse=True) and tokens[0] > tokens[2] > 0 == tokens[3]

    tmux.keys("Down", "Down", "Down", "Down")  # the first press selects the first row
    screen = tmux.wait_for("victim selected", lambda s: any(r["name"] == "victim" and r["selected"] for r in rows(s)))
    assert [r["name"] for r in rows(screen) if r["selected"]] == ["victim"]
    victim = next(int(r["pid"]) for r in rows(screen) if r["name"] == "victim")

    tmux.keys("k")
    tmux.wait_for("the kill to be asked about", lambda s: f"kill pid {victim} (victim)? y to confirm" in s)
    tmux.keys("y")
    # Killed in the other OS process's kernel: it reports the end of its process.
    ended = host.line()
    assert ended == {"pid": victim, "name": "victim", "status": "killed", "stop_reason": "killed", "result": None}
    screen = tmux.wait_for("the kill done", lambda s: f"kill pid {victim}: done" in s and any(
        r["name"] == "victim" and r["status"] == "killed" for r in rows(s)))
    assert all(r["status"] != "killed" for r in rows(screen) if r["name"] != "victim")

    others = host.finish()  # the rest went on, and end as they should
    assert sorted((o["name"], o["status"]) for o in others) == [
        ("chatty-1", "exited"), ("chatty-2", "exited"), ("chatty-3", "exited")]
    assert all(isinstance(o["result"], int) and o["result"] > 0 for o in others)
    tmux.wait_for("the ended processes", lambda s: sum(r["status"] == "exited" for r in rows(s)) == 3)
    tmux.keys("q")
    assert tmux.exit_status() == 0


@pytest.mark.timeout(120)
def test_top_filters_and_pauses_and_resumes_a_process_through_the_store(tmux: Tmux, host: KernelHost) -> None:
    tmux.start(*top_command(host.db))
    tmux.wait_for("the four processes", lambda s: len(rows(s)) == 4 and "1 live kernel" in s)
    tmux.keys("/", "c", "h", "a", "t", "t", "y", "-", "2", "Enter")
    screen = tmux.wait_for("only chatty-2", lambda s: [r["name"] for r in rows(s)] == ["chatty-2"])
    assert "filter: chatty-2" in screen and "1 shown" in screen
    target = int(rows(screen)[0]["pid"])

    tmux.keys("Down", "p")
    tmux.wait_for("the pause done", lambda s: f"pause pid {target}: done" in s
                  and rows(s) and rows(s)[0]["status"] == "paused")

    async def stored() -> tuple[bool, int]:
        store = SqliteCheckpointer(host.db)
        try:
            record = await KernelStore(store).load_process(target)
            assert record is not None
            return record.paused, int(record.spent.get("llm_calls") or 0)  # type: ignore[arg-type]
        finally:
            await store.aclose()

    paused, calls = asyncio.run(stored())
    assert paused
    time.sleep(1.0)  # paused at its next syscall: it makes no more LLM calls
    assert asyncio.run(stored()) == (True, calls)

    tmux.keys("r")
    screen = tmux.wait_for("the resume done and calls again", lambda s: f"resume pid {target}: done" in s
                           and rows(s) and int(rows(s)[0]["llm"]) > calls)
    assert rows(screen)[0]["status"] != "paused"

    tmux.keys("/", "Escape")  # the filter cleared: all four again
    tmux.wait_for("all four again", lambda s: len(rows(s)) == 4 and "filter: none" in s)
    tmux.keys("r")  # chatty-2 stays selected as the rows move; it is not paused now
    tmux.wait_for("resume refused", lambda s: f"pid {target} (chatty-2) is not paused" in s)
    tmux.keys("q")
    assert tmux.exit_status() == 0


async def test_top_once_reads_a_postgresql_store_with_the_live_syscall_and_the_gate(postgres_dsn: str) -> None:
    dsn = fresh_database(postgres_dsn)

    async def thinker(ctx: Context) -> str:
        await ctx.llm("think")
        await ctx.sleep(30)
        return "done"

    provider = ScriptedProvider(lambda request: "thought about it", latency=0.01)
    async with Kernel(llm=provider, checkpointer=dsn, monitor_interval=0.2) as kernel:
        handle = await kernel.spawn(thinker, name="thinker")
        await asyncio.sleep(0.6)
        out = await asyncio.to_thread(ringzero_cli, "top", "--db", dsn, "--once", cwd=ROOT)
        assert out.returncode == 0, out.stderr
        line = next(line for line in out.stdout.splitlines() if "thinker" in line)
        assert re.search(rf"\b{handle.pid}\s+thinker\s+waiting\s+10\s+\d+\s+[\d.]+\s+1\s+[\d.]+\s+sleep \d", line), \
            out.stdout
        text = " ".join(out.stdout.split())  # the header wraps at the pipe's width
        assert "1 processes (1 waiting) · 1 live kernel(s)" in text
        assert re.search(r"gate default \(.+\): 0 waiting · 0 in flight · .* 1 calls, 0 rate-limited", text), text
        await handle.kill()


async def test_an_idle_kernel_writes_nothing_and_a_closed_one_is_not_shown_live() -> None:
    store = MemoryCheckpointer()

    async def napper(ctx: Context) -> None:
        await ctx.sleep(0.5)

    kernel = Kernel(checkpointer=store, monitor_interval=0.1)
    await kernel.start()
    await asyncio.sleep(0.3)
    assert await read_activity(store) == []  # no process: no row
    handle = await kernel.spawn(napper, name="napper")
    await asyncio.sleep(0.25)
    (row,) = await read_activity(store)
    assert row.fresh() and row.processes[handle.pid]["syscall"] == "sleep"
    assert row.processes[handle.pid]["status"] == "waiting"
    assert 0 < row.processes[handle.pid]["wake_at"] - time.time() < 0.5  # its timer, set at the spawn
    await handle.wait()
    await asyncio.sleep(0.25)
    (row,) = await read_activity(store)
    assert row.processes == {} and row.fresh()  # the last row says it has nothing live
    written = row.at
    await asyncio.sleep(0.3)
    assert (await read_activity(store))[0].at == written  # and idle, it writes nothing more
    await kernel.aclose()
    (row,) = await read_activity(store)
    assert row.closed and not row.fresh()
    assert not (await read_activity(store))[0].fresh(now=row.at)


async def test_a_command_goes_only_to_the_kernel_that_runs_the_process(tmp_path: Path) -> None:
    db = tmp_path / "state.db"

    async def waiter(ctx: Context) -> None:
        await ctx.sleep(30)

    async with Kernel(checkpointer=db, monitor_interval=0.1) as first, \
            Kernel(checkpointer=db, monitor_interval=0.1) as second:
        mine = await first.spawn(waiter, name="first's")
        theirs = await second.spawn(waiter, name="second's")
        command = await send_command(first.checkpointer, theirs.pid, "kill")
        nobody = await send_command(first.checkpointer, 999, "pause")
        await _until_ended(theirs)
        assert theirs.status.value == "killed" and mine.status.value == "waiting"
        await asyncio.sleep(0.3)
        outcome = await command_outcome(first.checkpointer, command)
        assert outcome is not None and outcome["state"] == "done" and outcome["kernel"] == second.monitor.id  # type: ignore[union-attr]
        assert await command_outcome(first.checkpointer, nobody) is None  # no kernel runs pid 999
        view = TopView("test")
        await _follow(first.checkpointer, {nobody: (999, "pause", time.monotonic() - 60)}, view)
        assert view.message.startswith("pause pid 999: no live kernel took it")
        snapshot = await read_snapshot(first.checkpointer)
        assert {r.name: r.live for r in snapshot.rows} == {"first's": True, "second's": False}
        with pytest.raises(InvalidArgument, match="a command is one of pause, resume, kill, send, wake, not 'stop'"):
            await send_command(first.checkpointer, mine.pid, "stop")
        await mine.kill()


async def _until_ended(handle: object) -> None:
    for _ in range(100):
        if handle.status.terminal:  # type: ignore[attr-defined]
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"{handle} did not end")


def test_keys_are_read_as_a_terminal_sends_them() -> None:
    assert parse_keys("\x1b[A\x1b[Bk\r/ab\x7f\x1b") == ["up", "down", "k", "enter", "/", "a", "b", "backspace",
                                                        "escape"]
    assert parse_keys("\x1b[15~q") == ["q"]  # a function key is skipped, not typed


def test_a_monitor_interval_must_be_a_positive_number_of_seconds() -> None:
    for bad in (0, -1.0, True, "1", float("inf")):
        with pytest.raises(InvalidArgument, match="monitor_interval is a positive number of seconds"):
            Kernel(checkpointer=MemoryCheckpointer(), monitor_interval=bad)  # type: ignore[arg-type]


async def test_top_once_prints_every_process_whatever_the_pipe_height(tmp_path: Path) -> None:
    db = tmp_path / "state.db"

    async def quick(ctx: Context, n: int) -> int:
        return n

    async with Kernel(checkpointer=db, monitor_interval=None) as kernel:
        for n in range(40):
            await (await kernel.spawn(quick, n, name=f"quick-{n:02d}")).wait()
    out = await asyncio.to_thread(ringzero_cli, "top", "--db", str(db), "--once", "--sort", "name", cwd=tmp_path,
                                  env={"LINES": "20"})
    assert out.returncode == 0, out.stderr
    names = re.findall(r"quick-\d\d", out.stdout)
    assert names == [f"quick-{n:02d}" for n in range(40)] and "more" not in out.stdout
    assert "40 processes (40 exited) · 0 live kernel(s)" in " ".join(out.stdout.split())


async def test_top_shows_host_tools_still_running_past_their_run_s_wall_limit(tmp_path: Path) -> None:
    """Issue 44: a sync host tool that ignores its run's wall limit keeps a thread of the tool
    pool; top says so, per kernel, until it returns."""
    import threading

    from ringzero import ExecLimits
    from ringzero.providers.executors import MontyExecutor

    release = threading.Event()

    def hangs(x: int) -> int:
        release.wait(30)
        return x

    async def agent(ctx: Context) -> str:
        result = await ctx.exec("hangs(1)", tools={"hangs": hangs}, limits=ExecLimits(wall_seconds=0.3))
        await ctx.sleep(30)
        return result.error.type if result.error else "returned"

    db = tmp_path / "state.db"
    try:
        async with Kernel(checkpointer=db, executor=MontyExecutor(max_workers=1), monitor_interval=0.2) as kernel:
            handle = await kernel.spawn(agent, name="agent")
            await asyncio.sleep(2.0)
            out = await asyncio.to_thread(ringzero_cli, "top", "--db", str(db), "--once", cwd=tmp_path)
            await handle.kill()
    finally:
        release.set()
    assert out.returncode == 0, out.stderr
    text = " ".join(out.stdout.split())
    assert re.search(r"host tools \(.+\): 1 running in \d+ threads · 1 past their run's wall limit", text), text


async def test_top_counts_the_sessions_a_process_holds_open(tmp_path: Path) -> None:
    """A process's sessions that hold an interpreter (``ctx.session()``) show in its row."""
    from ringzero.providers.executors import MontyExecutor

    async def repl(ctx: Context) -> str:
        first, second = ctx.session(), ctx.session()
        await first.exec("x = 1")
        await second.exec("y = 2")
        await ctx.sleep(30)
        return "done"

    db = tmp_path / "state.db"
    async with Kernel(checkpointer=db, executor=MontyExecutor(max_workers=2), monitor_interval=0.2) as kernel:
        handle = await kernel.spawn(repl, name="repl")
        await asyncio.sleep(0.8)
        out = await asyncio.to_thread(ringzero_cli, "top", "--db", str(db), "--once", cwd=tmp_path)
        await handle.kill()
    assert out.returncode == 0, out.stderr
    line = next(line for line in out.stdout.splitlines() if "repl" in line)
    assert re.search(rf"\b{handle.pid}\s+repl\s+waiting\s+10\s+\d+\s+[\d.]+\s+0\s+[\d.]+\s+2\s+sleep \d", line), \
        out.stdout
