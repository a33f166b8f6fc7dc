"""Recovery as a new user meets it: a program in a script, `ringzero resume` without the
kernel it needs, `ringzero ps` straight after a crash. A recovery step never turns
recoverable work into a failure, and says what it could not do."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

import pytest

from ringzero.checkpointers import SqliteCheckpointer
from ringzero.core.contract.store import KernelStore
from tests.hosts import kill_host_when

RINGZERO = Path(sys.executable).parent / "ringzero"
"""The installed console script, run as a user runs it (its sys.path does not hold the cwd)."""

APP = '''
import asyncio
import os
import sys
import time
from pathlib import Path

from ringzero import Context, Kernel, idempotent
from ringzero.checkpointers import SqliteCheckpointer
from ringzero.testing import ScriptedProvider

LOG = Path(os.environ["APP_LOG"])


def log(line: str) -> None:
    with LOG.open("a") as f:
        f.write(line + "\\n")
        f.flush()
        os.fsync(f.fileno())


def answer(request) -> str:
    time.sleep(0.03)  # a model takes a while: the host is killed between calls
    log(f"llm {request.messages[-1].content}")
    return f"answer to {request.messages[-1].content}"


@idempotent  # a pure function: a call in flight at the kill runs again
def square(i: int) -> int:
    log(f"tool {i}")
    return i * i


async def agent(ctx: Context, rounds: int) -> list:
    out = []
    for i in range(rounds):
        reply = await ctx.llm(f"step {i}")
        out.append([reply.content, await ctx.tool("square", i)])
    return out


def make_kernel(db) -> Kernel:
    return Kernel(checkpointer=SqliteCheckpointer(db), llm=ScriptedProvider(answer), tools={"square": square})


async def main() -> None:
    async with make_kernel(Path(sys.argv[1])) as kernel:
        process = await kernel.spawn(agent, 12, name="agent")
        print(process.pid, flush=True)
        await process.wait()


if __name__ == "__main__":
    asyncio.run(main())
'''


def run_cli(*args: str, cwd: Path, log: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run([str(RINGZERO), *args], cwd=cwd, capture_output=True, text=True, timeout=60,
                          env={**env, "APP_LOG": str(log), "COLUMNS": "200"})


def crash_script(app_dir: Path, db: Path, log: Path, after_lines: int) -> int:
    """Run app.py as a script (`python app.py`), kill -9 it once ``after_lines`` calls are logged."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    host = subprocess.Popen([sys.executable, "app.py", str(db)], cwd=app_dir, stdout=subprocess.PIPE, text=True,
                            env={**env, "APP_LOG": str(log)})
    assert host.stdout is not None
    pid = int(host.stdout.readline())
    assert kill_host_when(host, lambda: len(log.read_text().splitlines()) >= after_lines) == -signal.SIGKILL
    return pid


async def load(db: Path, pid: int) -> tuple[str, object, list[str]]:
    store = SqliteCheckpointer(db)
    try:
        kernel_store = KernelStore(store)
        record = await kernel_store.load_process(pid)
        assert record is not None
        return record.status.value, record.result, [e.kind for e in await kernel_store.journal(pid)]
    finally:
        await store.aclose()


@pytest.mark.timeout(180)
async def test_a_script_program_survives_a_resume_without_its_kernel_then_finishes_with_it(tmp_path: Path) -> None:
    (tmp_path / "app.py").write_text(APP)
    db, log = tmp_path / "state.db", tmp_path / "calls.log"
    log.touch()
    pid = await asyncio.to_thread(crash_script, tmp_path, db, log, 9)
    before = log.read_text().splitlines()
    assert 9 <= len(before) < 24, "the host was killed mid-run"
    status, _, kinds = await load(db, pid)
    assert status in ("running", "waiting", "ready")
    assert kinds.count("llm") >= 4
    store = SqliteCheckpointer(db)
    [record] = await KernelStore(store).load_processes()
    await store.aclose()
    assert record.program == "app:agent", "a script's program is journaled by the name it is imported by"

    # Straight after the crash, `ps` shows what the process had spent (read from its journal).
    listing = await asyncio.to_thread(run_cli, "ps", "--db", str(db), cwd=tmp_path, log=log)
    assert listing.returncode == 0, listing.stdout + listing.stderr
    header = next(line for line in listing.stdout.splitlines() if "┃ pid" in line)
    row = next(line for line in listing.stdout.splitlines() if "│ agent" in line)
    cells = dict(zip([c.strip() for c in header.split("┃")], [c.strip() for c in row.split("│")], strict=True))
    assert cells["status"] == "running" and cells["llm"] == str(kinds.count("llm")), listing.stdout
    assert int(cells["tokens"]) > 0 and cells["steps"] == str(len(kinds)), listing.stdout

    # Without --kernel: no provider and no tools. Replayed calls need neither; the first live one
    # does, so the process is left unfinished, the command says why and exits non-zero.
    for _ in range(2):
        out = await asyncio.to_thread(run_cli, "resume", "--db", str(db), cwd=tmp_path, log=log)
        assert out.returncode == 1, out.stdout + out.stderr
        # Its first live call is a model call or a tool call, depending on where the kill landed.
        missing = ("no LLM provider named 'default'", "no tool named 'square'")
        assert "not resumed" in out.stdout and any(m in out.stdout for m in missing), out.stdout
        assert "No --kernel was given" in out.stdout
        status, _, _ = await load(db, pid)
        assert status not in ("exited", "failed", "killed"), "a resume without what it needs must not end it"
    assert log.read_text().splitlines() == before, "nothing recorded was made again"

    # With the user's kernel, from the script's folder: `app` imports from the cwd.
    out = await asyncio.to_thread(run_cli, "resume", "--db", str(db), "--kernel", "app:make_kernel",
                                  cwd=tmp_path, log=log)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "resumed 1 process(es): 1 finished, 0 failed" in out.stdout
    status, result, _ = await load(db, pid)
    assert status == "exited" and isinstance(result, list) and len(result) == 12
    # Every call the journal held at the kill is made once; the one the kill cut off between its
    # answer and its record (if any) may be made once more: the journal cannot know it happened.
    calls = log.read_text().splitlines()
    everything = [line for i in range(12) for line in (f"llm step {i}", f"tool {i}")]
    recorded = everything[:sum(kind in ("llm", "tool") for kind in kinds)]
    assert before[:len(recorded)] == recorded and len(before) <= len(recorded) + 1
    assert sorted(set(calls)) == sorted(everything)
    assert all(calls.count(call) == 1 for call in recorded), "a recorded call was made again"
    assert sum(calls.count(call) - 1 for call in everything) <= len(before) - len(recorded)


def test_a_program_no_other_process_can_import_is_warned_about(tmp_path: Path) -> None:
    code = ("import asyncio, warnings\n"
            "from ringzero import Kernel\n"
            "from ringzero.checkpointers import MemoryCheckpointer\n"
            "async def agent(ctx):\n    return 1\n"
            "async def main():\n"
            "    async with Kernel(checkpointer=MemoryCheckpointer()) as k:\n"
            "        with warnings.catch_warnings(record=True) as seen:\n"
            "            warnings.simplefilter('always')\n"
            "            await (await k.spawn(agent)).wait()\n"
            "            await (await k.spawn(agent)).wait()\n"
            "        print([str(w.message) for w in seen])\n"
            "asyncio.run(main())\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.count("no other Python process can import it") == 1, out.stdout  # once per program


class Opaque:
    def __repr__(self) -> str:
        return "<opaque>"


@pytest.mark.parametrize(("value", "named"), [
    ({1, 2}, "ctx.state['bad'] is a set"),
    (datetime(2026, 1, 1, tzinfo=timezone.utc), "ctx.state['bad'] is a datetime"),
    (b"raw", "ctx.state['bad'] is a bytes"),
    (float("nan"), "ctx.state['bad'] is nan"),
    ({"deep": [1, Opaque()]}, "ctx.state['bad']['deep'][1] is a Opaque"),
    ((1, 2), "ctx.state['bad'] is a tuple"),
    ({1: "one"}, "ctx.state['bad'] has the key 1, a int"),
])
@pytest.mark.parametrize("checkpoints", [False, True], ids=["at-exit", "at-checkpoint"])
async def test_state_that_would_not_come_back_fails_the_process_cleanly(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, value: object, named: str, checkpoints: bool,
) -> None:
    from ringzero import Context, Kernel, ProcessFailed

    async def program(ctx: Context) -> str:
        ctx.state["good"] = [1, "two"]
        ctx.state["bad"] = value
        if checkpoints:
            await ctx.checkpoint()
        return "returned"

    async def bystander(ctx: Context) -> int:
        await ctx.sleep(0.05)
        return 7

    db = tmp_path / "state.db"
    async with Kernel(checkpointer=SqliteCheckpointer(db)) as kernel:
        other = await kernel.spawn(bystander)
        handle = await kernel.spawn(program)
        with pytest.raises(ProcessFailed) as failed:
            await handle.wait()
        assert failed.value.error is not None and failed.value.error["type"] == "NotSerializable"
        assert named in failed.value.error["message"]
        assert await other.wait() == 7, "the kernel and its other processes carry on"
        pid = handle.pid
    status, _, _ = await load(db, pid)
    assert status == "failed", "the store agrees with memory"
    store = SqliteCheckpointer(db)
    record = await KernelStore(store).load_process(pid)
    await store.aclose()
    assert record is not None and record.state["good"] == [1, "two"], "the rest of the state is kept"
    assert "never retrieved" not in caplog.text
