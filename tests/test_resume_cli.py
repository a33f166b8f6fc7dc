"""``ringzero resume``, ``serve`` and ``send`` as a user runs them: a script without a main
guard, a factory with the wrong signature, messages to a process in another host or in none."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
import textwrap
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from ringzero import Kernel, ProcessNotFound, ProcessStateError
from ringzero.checkpointers import SqliteCheckpointer
from ringzero.core.contract.store import KernelStore
from tests.hosts import stop_host
from tests.test_natural_kills import cli, start_host

ROOT = Path(__file__).resolve().parent.parent

SCRIPT = textwrap.dedent('''\
    import asyncio
    from ringzero import Kernel
    from ringzero.checkpointers import SqliteCheckpointer
    from ringzero.testing import ScriptedProvider

    async def agent(ctx):
        reply = await ctx.llm("hello")
        return reply.content

    def make_kernel(db):
        return Kernel(checkpointer=SqliteCheckpointer(db), llm=ScriptedProvider(lambda request: "hi"))

    async def main():
        async with make_kernel("state.db") as kernel:
            process = await kernel.spawn(agent)
            print(await process.wait())

    asyncio.run(main())
''')


def run(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *args], cwd=cwd, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})


async def process_count(db: Path) -> int:
    store = SqliteCheckpointer(db)
    try:
        return len(await KernelStore(store).load_processes())
    finally:
        await store.aclose()


async def read_process(db: str) -> tuple[Any, list[Any]]:
    store = SqliteCheckpointer(db)
    try:
        record = await KernelStore(store).load_process(1)
        assert record is not None
        return record, await KernelStore(store).mail(1)
    finally:
        await store.aclose()


@pytest.mark.parametrize("opened", ["async with", "spawn first"])
async def test_resume_refuses_a_script_without_a_main_guard_and_starts_nothing(tmp_path: Path, opened: str) -> None:
    by_hand = '    kernel = make_kernel("state.db")  # never started by hand\n    if True:\n'
    script = SCRIPT if opened == "async with" else \
        SCRIPT.replace('    async with make_kernel("state.db") as kernel:\n', by_hand)
    assert script != SCRIPT or opened == "async with"
    (tmp_path / "ex2.py").write_text(script)
    first = await asyncio.to_thread(run, "ex2.py", cwd=tmp_path)
    assert first.returncode == 0 and first.stdout.strip() == "hi", first.stderr
    out = await asyncio.to_thread(run, "-m", "ringzero.cli", "resume", "--db", "state.db", "--kernel",
                                  "ex2:make_kernel", cwd=tmp_path)
    text = " ".join(out.stderr.split())
    assert out.returncode == 1, out.stdout + out.stderr
    assert "a Kernel was started while ringzero imported module 'ex2' to resume its processes" in text
    assert 'under `if __name__ == "__main__":`' in text
    assert await process_count(tmp_path / "state.db") == 1, "the import started no second agent"


async def test_resume_runs_a_guarded_script_s_factory(tmp_path: Path) -> None:
    guarded = SCRIPT.replace("asyncio.run(main())", 'if __name__ == "__main__":\n    asyncio.run(main())')
    (tmp_path / "ex2.py").write_text(guarded)
    assert (await asyncio.to_thread(run, "ex2.py", cwd=tmp_path)).returncode == 0
    out = await asyncio.to_thread(run, "-m", "ringzero.cli", "resume", "--db", "state.db", "--kernel",
                                  "ex2:make_kernel", cwd=tmp_path)
    assert out.returncode == 0 and "found 0 unfinished process(es)" in out.stdout, out.stdout + out.stderr


def test_a_kernel_factory_with_the_wrong_signature_is_told_the_right_one(tmp_path: Path) -> None:
    (tmp_path / "factories.py").write_text("def no_db():\n    pass\n\ndef not_a_kernel(db):\n    return 42\n\n"
                                           "def raises(db):\n    raise KeyError('OPENAI_API_KEY')\n")
    (tmp_path / "state.db").touch()
    for name, says in (("no_db", "cannot be called with the database"), ("not_a_kernel", "returned int")):
        out = run("-m", "ringzero.cli", "resume", "--db", "state.db", "--kernel", f"factories:{name}", cwd=tmp_path)
        text = " ".join(out.stderr.split())
        assert out.returncode == 1 and says in text and "def make_kernel(db):" in text, out.stdout + out.stderr
    for command in ("resume", "serve"):
        out = run("-m", "ringzero.cli", command, "--db", "state.db", "--kernel", "factories:raises", cwd=tmp_path)
        assert out.returncode == 1 and "Traceback" not in out.stdout + out.stderr, out.stdout + out.stderr
        assert "--kernel 'factories:raises' raised KeyError: 'OPENAI_API_KEY'" in " ".join(out.stderr.split())
    helped = run("-m", "ringzero.cli", "resume", "--help", cwd=tmp_path)
    assert "def make_kernel(db): return Kernel(checkpointer=SqliteCheckpointer(db)" in " ".join(helped.stdout.split())


async def test_send_reaches_a_process_that_another_os_process_hosts(tmp_path: Path) -> None:
    db, log = str(tmp_path / "state.db"), tmp_path / "calls.log"
    log.touch()
    host = await asyncio.to_thread(start_host, db, "approval", log)
    try:
        assert host.stdout is not None and await asyncio.to_thread(host.stdout.readline) == "done\n"  # it waits
        sent = await asyncio.to_thread(cli, "send", "--db", db, "1", '{"approved": true}', log=log)
        assert sent.returncode == 0 and "sent to pid 1" in sent.stdout, sent.stdout + sent.stderr
        for _ in range(200):  # the host's own kernel finishes it
            record, mail = await read_process(db)
            if record.status.terminal:
                break
            await asyncio.sleep(0.05)
    finally:
        stop_host(host)
    assert record.status.value == "exited", record
    assert record.result == {"draft": "answer to draft the announcement", "published": "published 32 chars"}
    assert len(mail) == 1, "delivered once, by the host, not also stored by the sender"


async def test_send_to_a_process_in_no_host_is_kept_for_its_resume(tmp_path: Path) -> None:
    db, log = str(tmp_path / "state.db"), tmp_path / "calls.log"
    log.touch()
    host = await asyncio.to_thread(start_host, db, "approval", log)
    assert host.stdout is not None and await asyncio.to_thread(host.stdout.readline) == "done\n"
    stop_host(host)  # the host dies while its process waits for a person
    waiting = await asyncio.to_thread(cli, "resume", "--db", db, "--kernel", "tests.natural_programs:make_kernel",
                                      log=log)
    assert waiting.returncode == 0, waiting.stdout + waiting.stderr
    text = " ".join(waiting.stdout.split())
    assert "1 waiting for a message" in text and f"pid 1 waits for a message: ringzero send --db {db} 1" in text
    async with Kernel(checkpointer=SqliteCheckpointer(db)) as kernel:
        await kernel.send(1, {"approved": True})
        with pytest.raises(ProcessNotFound):
            await kernel.send(99, "hello")
    done = await asyncio.to_thread(cli, "resume", "--db", db, "--kernel", "tests.natural_programs:make_kernel",
                                   log=log)
    assert done.returncode == 0 and "1 finished" in done.stdout, done.stdout
    async with Kernel(checkpointer=SqliteCheckpointer(db)) as kernel:
        with pytest.raises(ProcessStateError, match="pid 1 has exited; it receives no messages"):
            await kernel.send(1, "too late")
    assert [line.split()[0] for line in log.read_text().splitlines()] == ["llm", "publish"]


async def test_serve_resumes_a_waiting_process_when_its_message_arrives(tmp_path: Path) -> None:
    db, log = str(tmp_path / "state.db"), tmp_path / "calls.log"
    log.touch()
    host = await asyncio.to_thread(start_host, db, "approval", log)
    assert host.stdout is not None and await asyncio.to_thread(host.stdout.readline) == "done\n"
    stop_host(host)
    async with serving(db, log) as (server, said):
        assert "found 1 unfinished process(es)" in said, said
        sent = await asyncio.to_thread(cli, "send", "--db", db, "1", json.dumps({"approved": True}), log=log)
        assert sent.returncode == 0, sent.stdout + sent.stderr
        assert await asyncio.to_thread(server.wait, 60) == 0
        rest = " ".join(server.stdout.read().split())  # type: ignore[union-attr]
    assert "pid 1: exited" in rest and "every process has ended" in rest, rest
    assert [line.split()[0] for line in log.read_text().splitlines()] == ["llm", "publish"]


def start_server(db: str, log: Path) -> tuple[subprocess.Popen[str], str]:
    """``ringzero serve`` on ``db``, and what it said until it began to watch the store."""
    server = subprocess.Popen([sys.executable, "-m", "ringzero.cli", "serve", "--db", db, "--kernel",
                               "tests.natural_programs:make_kernel"], cwd=ROOT, text=True, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT,
                              env={**os.environ, "PYTHONPATH": str(ROOT), "RINGZERO_TEST_LOG": str(log)})
    assert server.stdout is not None
    said: list[str] = []
    give_up = time.monotonic() + 60
    while not any("serving:" in line for line in said) and server.poll() is None \
            and time.monotonic() < give_up:
        said.append(server.stdout.readline())
    return server, " ".join(" ".join(said).split())


@contextlib.asynccontextmanager
async def serving(db: str, log: Path) -> AsyncIterator[tuple[subprocess.Popen[str], str]]:
    server, said = await asyncio.to_thread(start_server, db, log)
    try:
        yield server, said
    finally:
        stop_host(server)


def test_send_refuses_a_message_that_is_not_json(tmp_path: Path) -> None:
    (tmp_path / "state.db").touch()
    out = run("-m", "ringzero.cli", "send", "--db", "state.db", "1", "{approved}", cwd=tmp_path)
    assert out.returncode == 1 and "the message must be JSON" in " ".join(out.stderr.split()), out.stderr


async def test_serve_resumes_a_paused_process_when_top_asks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from ringzero.core.support.monitor import command_outcome, send_command
    from tests import natural_programs

    db, log = str(tmp_path / "state.db"), tmp_path / "calls.log"
    log.touch()
    monkeypatch.setenv("RINGZERO_TEST_LOG", str(log))
    async with natural_programs.make_kernel(db) as kernel:  # the host: it pauses the agent, then dies
        handle = await kernel.spawn(natural_programs.notes_loop)
        await handle.pause()
        while handle.status.value != "paused":
            await asyncio.sleep(0.01)
    async with serving(db, log) as (server, said):
        assert "pid 1 is paused: resume it with ringzero top" in said, said
        store = SqliteCheckpointer(db)
        try:
            command = await send_command(store, 1, "resume")  # what top's `r` leaves
            assert await asyncio.to_thread(server.wait, 60) == 0
            outcome = await command_outcome(store, command)
        finally:
            await store.aclose()
        rest = server.stdout.read()  # type: ignore[union-attr]
    assert outcome is not None and outcome["state"] == "done", outcome
    assert "pid 1: exited" in " ".join(rest.split()), rest
    record, _ = await read_process(db)
    assert record.status.value == "exited" and len(record.result) == 6


async def test_a_handle_reaches_a_process_that_waits_in_the_store_and_waits_for_its_end(tmp_path: Path) -> None:
    db, log = str(tmp_path / "state.db"), tmp_path / "calls.log"
    log.touch()
    host = await asyncio.to_thread(start_host, db, "approval", log)
    assert host.stdout is not None and await asyncio.to_thread(host.stdout.readline) == "done\n"
    await asyncio.sleep(0.3)  # its way to waiting is written a loop turn after it happens
    stop_host(host)
    async with Kernel(checkpointer=SqliteCheckpointer(db)) as kernel:
        handle = await kernel.handle(1)  # what `ringzero ps` lists as waiting
        assert handle.elsewhere and handle.status.value == "waiting" and handle.name == "approval"
        assert handle.state == {"draft": "answer to draft the announcement"}
        with pytest.raises(ProcessStateError, match="cannot kill pid 1 from here: no kernel of this OS process"):
            await handle.kill()
        await handle.send({"approved": True})
        resumed = asyncio.ensure_future(asyncio.to_thread(
            cli, "resume", "--db", db, "--kernel", "tests.natural_programs:make_kernel", log=log))
        assert await handle.wait(timeout=60) == {"draft": "answer to draft the announcement",
                                                 "published": "published 32 chars"}
        assert (await resumed).returncode == 0


def test_the_resume_summary_does_not_say_an_in_doubt_call_was_raised_where_a_model_was_told() -> None:
    """Under a tool node's ``in_doubt="report"`` the model is told, nothing is raised: the
    summary said "raised as ToolInDoubt in the program" of every in-doubt call left to it."""
    from rich.console import Console

    from ringzero.resuming import Ends, StoreCounts, _report

    console = Console(record=True, width=400)
    _report(console, [], Ends({}, {}, {}, {}), StoreCounts(syscalls=3, in_doubt_raised=1), 2, db="state.db",
            kernel_spec=None)
    said = " ".join(console.export_text().split())
    assert "1 call(s) in doubt: 0 run again" in said and "1 left to the program (raised as ToolInDoubt, or told " \
        "to the model where a tool node has in_doubt=\"report\")" in said, said
