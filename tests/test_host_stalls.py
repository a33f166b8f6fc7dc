"""Issue 52, rows 2, 3, 6 and 7: what the code sends, and the tools it calls, never stall the
host. Each attack runs while a bystander (another agent's quick runs on the same executor, and
a 5 ms-sleep probe of the event loop) keeps its pace: the probe never wakes 100 ms late."""

from __future__ import annotations

import asyncio
import os
import re
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from ringzero.core.contract.protocols import Executor
from ringzero.core.contract.types import ExecLimits, ExecResult
from tests import cpu_tools
from tests.heartbeat import bystander

MAX_STALL = 0.1
LIMITS = ExecLimits(wall_seconds=20.0)
SHOWN = ("try:\n    {call}\n    out = 'no error'\nexcept Exception as e:\n"
         "    out = [type(e).__name__, str(e)[:120]]\nout")


def take(data: object) -> int:
    return len(data)  # type: ignore[arg-type]


async def paced(sandbox: Executor, code: str, tools: dict[str, Callable[..., object]] | None = None,
                limits: ExecLimits = LIMITS) -> ExecResult:
    async with bystander(sandbox) as pace:
        result = await sandbox.run(code, tools=tools or {}, limits=limits)
    assert pace.runs > 0 and pace.wrong == [], "the bystander's runs did not complete"
    assert pace.longest_stall < MAX_STALL, f"the event loop stalled {pace.longest_stall * 1000:.0f} ms"
    return result


@pytest.mark.parametrize("items", ["0.5 + i", "2 ** 40 + i", "i"], ids=["floats", "large ints", "small ints"])
@pytest.mark.parametrize("sandbox", ["monty", "process"], indirect=True)
async def test_2_a_call_of_half_a_million_numbers_is_refused_without_a_stall(sandbox: Executor, items: str) -> None:
    """A number used to count as one byte in the size floor: the whole list was checked for
    depth and made JSON on the loop before it was refused (0.7 to 2.5 s)."""
    result = await paced(sandbox, SHOWN.format(call=f"take([{items} for i in range(500_000)])"), {"take": take})
    assert result.value is not None and result.value[0] == "ValueError", result
    assert "limit" in result.value[1]


FORGE = ("import os, stat, struct, time\n"
         "def part(data):\n    return struct.pack('!I', len(data)) + data\n"
         "ZEROS = b'[' + b','.join([b'0'] * 1_500_000) + b']'\n"
         "FRAME = {frame}\n"
         "for fd in range(3, 64):\n"
         "    try:\n        ok = stat.S_ISSOCK(os.fstat(fd).st_mode)\n    except OSError:\n        ok = False\n"
         "    if ok:\n        os.write(fd, FRAME)\n"
         "time.sleep(3)\n")
"""Code that writes ``FRAME`` (built from ``ZEROS``, 3 MiB of JSON: one and a half million
zeros) on its channel to the host, as a sandbox that breaks the protocol would."""


@pytest.mark.parametrize(("frame", "outcome"), [
    ("part(b'{\"op\":\"call\",\"name\":\"take\",\"args\":[' + ZEROS + b'],\"kwargs\":{}}')", "SandboxProtocolError"),
    ("part(b'{\"op\":\"call\",\"name\":\"take\",\"data\":[%d]}' % (len(ZEROS) + 5)) + part(b'[' + ZEROS + b',{}]')",
     "refused"),
    ("part(b'{\"op\":\"done\",\"error\":null,\"data\":[%d,0]}' % len(ZEROS)) + part(ZEROS) + part(b'')",
     "OutputLimitExceeded"),
], ids=["a 3 MiB call message", "a 3 MiB call's data", "a 3 MiB final value"])
@pytest.mark.parametrize("sandbox", ["process"], indirect=True)
async def test_2_a_frame_of_a_million_zeros_is_judged_before_it_is_parsed(sandbox: Executor, frame: str,
                                                                          outcome: str) -> None:
    """The process sandbox's host parsed every frame whole, and walked it for depth, on the
    loop (0.9 to 2.2 s for 1.5 M zeros). Now a message is capped small, and data (a call's
    arguments, the value) is refused by its length before anything parses it."""
    result = await paced(sandbox, FORGE.format(frame=frame), {"take": take}, ExecLimits(wall_seconds=2.0))
    if outcome == "refused":  # the call is refused; the code, asleep, never reads the reply: its wall ends it
        assert [c.error.split(":")[0] for c in result.tool_calls if c.error] == ["ValueError"], result
        assert result.error is not None and result.error.type == "TimeoutError", result
    else:
        assert result.error is not None and result.error.type == outcome and result.error.origin == "executor", result


@pytest.mark.parametrize("sandbox", ["monty", "process"], indirect=True)
async def test_2_numbers_that_fit_the_limits_cross_without_a_stall(sandbox: Executor) -> None:
    """Within the limits, a value is parsed (a bounded cost), walked a piece at a time and
    made JSON once: 200,000 numbers, 400 KB of JSON, as a call's argument and the final value."""
    result = await paced(sandbox, "x = [i % 10 for i in range(200_000)]\n[take(x), x][1]", {"take": take})
    assert result.error is None and len(result.value) == 200_000, result.error
    assert [c.result for c in result.tool_calls] == [200_000]


def host_rss() -> int:
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmRSS:"))


@pytest.mark.parametrize("sandbox", ["monty", "process"], indirect=True)
async def test_3_a_cpu_bound_result_is_judged_in_its_worker(sandbox: Executor) -> None:
    """Fifteen million items were unpickled on the host before any size check: +689 MB and a
    1 to 1.8 s stall. The worker now makes the result JSON and refuses it against the run's
    limit; the host receives one refusal."""
    before = host_rss()
    result = await paced(sandbox, SHOWN.format(call="numbers(15_000_000)"), {"numbers": cpu_tools.numbers},
                         ExecLimits(wall_seconds=30))
    assert result.value is not None and result.value[0] == "ValueError" and "limit" in result.value[1], result
    assert host_rss() - before < 100 << 20, f"the host grew {(host_rss() - before) >> 20} MB"


async def test_3_a_worker_whose_caller_gave_up_is_killed_and_replaced() -> None:
    """Two slow calls whose runs timed out held both workers for their whole length: every
    other agent's cpu_bound call then timed out too."""
    from ringzero.providers.executors import MontyExecutor

    executor = MontyExecutor(max_workers=3)
    try:
        slow = await asyncio.gather(*(executor.run("spin(60)", tools={"spin": cpu_tools.spin},
                                                   limits=ExecLimits(wall_seconds=1.0)) for _ in range(2)))
        assert [r.error.type if r.error else None for r in slow] == ["TimeoutError"] * 2, slow
        quick = await executor.run("where_am_i()", tools={"where_am_i": cpu_tools.where_am_i},
                                   limits=ExecLimits(wall_seconds=10.0))
        assert quick.error is None and isinstance(quick.value, int), quick
        assert executor.tool_pool.workers.replaced == 2
        spinning = [pid for pid in _children() if _state(pid) == "R"]
        assert spinning == [], f"killed workers still run: {spinning}"
    finally:
        await executor.aclose()


def _children() -> list[int]:
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == os.getpid() or int(fields[1]) in _forkservers():
            found.append(int(pid))
    return found


def _forkservers() -> set[int]:
    import multiprocessing.forkserver

    server = multiprocessing.forkserver._forkserver._forkserver_pid  # type: ignore[attr-defined]
    return {server} if server else set()


def _state(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "gone"


@pytest.mark.parametrize("sandbox", ["monty", "process"], indirect=True)
async def test_3_a_worker_that_dies_fails_its_call_and_the_next_call_gets_a_fresh_one(sandbox: Executor) -> None:
    """A worker killed mid-call (a segfault, the OOM killer) broke the pool: every later
    cpu_bound call failed with BrokenProcessPool until the host restarted."""
    code = SHOWN.format(call="crash()") + "\n[out, where_am_i()]"
    result = await paced(sandbox, code, {"crash": cpu_tools.crash, "where_am_i": cpu_tools.where_am_i},
                         ExecLimits(wall_seconds=30))
    assert result.error is None, result
    crashed, pid = result.value
    assert "ToolCrashed" in str(crashed) and "killed by signal 9" in str(crashed), crashed
    assert isinstance(pid, int) and pid != os.getpid()


async def test_6_one_agent_gathering_slow_tools_leaves_another_its_share() -> None:
    """One agent gathering eight slow sync tools held all eight threads of the shared pool, and
    another agent's instant tool waited 5.5 s behind them."""
    from ringzero import Kernel
    from ringzero.checkpointers import MemoryCheckpointer

    release = threading.Event()
    started: list[int] = []

    def slow(i: int) -> int:
        started.append(i)
        release.wait(20)
        return i

    def instant() -> str:
        return "now"

    async def hog(ctx: object) -> list[int]:
        return await asyncio.gather(*(ctx.tool(slow, i) for i in range(8)))  # type: ignore[attr-defined]

    async def other(ctx: object) -> float:
        while len(started) < 8:
            await asyncio.sleep(0.01)
        begun = time.monotonic()
        assert await ctx.tool(instant) == "now"  # type: ignore[attr-defined]
        return time.monotonic() - begun

    try:
        async with Kernel(checkpointer=MemoryCheckpointer()) as kernel:
            hogging = await kernel.spawn(hog, name="hog")
            waited = await (await kernel.spawn(other, name="other")).wait()
            release.set()
            assert await hogging.wait() == list(range(8))
    finally:
        release.set()
    assert waited < MAX_STALL, f"the instant tool waited {waited:.2f} s behind another agent's slow ones"


async def test_7_a_tool_that_holds_the_gil_is_named_with_the_advice(tmp_path: Path,
                                                                    caplog: pytest.LogCaptureFixture) -> None:
    """An undeclared tool holding the GIL still stops the host (only @cpu_bound avoids that),
    but it no longer does so unseen: the stall is logged and ``ringzero top`` names the tool."""
    from ringzero import Kernel
    from ringzero.providers.executors import MontyExecutor
    from tests.test_cli import ringzero_cli

    async def agent(ctx: object) -> object:
        out = await ctx.exec("holds_the_gil(60_000_000)", tools={"holds_the_gil": cpu_tools.holds_the_gil},  # type: ignore[attr-defined]
                             limits=ExecLimits(wall_seconds=30))
        return out.value

    db = tmp_path / "state.db"
    with caplog.at_level("WARNING", logger="ringzero.tools"):
        async with Kernel(checkpointer=db, executor=MontyExecutor(max_workers=1), monitor_interval=0.2) as kernel:
            assert await (await kernel.spawn(agent)).wait() == sum(range(60_000_000))
            await asyncio.sleep(0.5)  # a monitor tick writes the kernel's row
            out = await asyncio.to_thread(ringzero_cli, "top", "--db", str(db), "--once", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    text = " ".join(out.stdout.split())
    assert re.search(r"holds_the_gil held the event loop \d+\.\d\d s \(1 stall\(s\)\): declare it "
                     r"@ringzero.cpu_bound", text), text
    assert "holds_the_gil held the event loop" in caplog.text and "@ringzero.cpu_bound" in caplog.text
