"""The ringzero command: --version, demo, ps and resume, run as a user runs them."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import ringzero
from ringzero.checkpointers import SqliteCheckpointer
from ringzero.core.contract.store import KernelStore
from tests.test_durable import crash_host_midrun

ROOT = Path(__file__).resolve().parent.parent


def ringzero_cli(*args: str, cwd: Path, env: dict[str, str] | None = None,
                 timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ringzero.cli", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})})


def test_version_prints_the_package_version(tmp_path: Path) -> None:
    out = ringzero_cli("--version", cwd=tmp_path)
    assert out.returncode == 0 and out.stdout.strip() == f"ringzero {ringzero.__version__}"


@pytest.mark.slow
def test_demo_runs_every_scenario_with_zero_failed_llm_calls(tmp_path: Path) -> None:
    out = ringzero_cli("demo", cwd=tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "failed calls 0" in out.stdout
    for expected in ("pause pid", "resume pid", "kill pid", "report with 4 sections",
                     "ConnectionError: the upstream data source went away", "budget_llm_calls",
                     "answer: {'north': 620000, 'south': 627500, 'east': 625000, 'west': 622500}",
                     "answer: {'pieces_asked': 8, 'errors': 1539} (the file has 1539 ERROR lines)",
                     # progress as it happens: each model call of the agents, said as it is answered
                     "· model call 1: the model writes Python that calls sales_table() inside the Monty sandbox",
                     "· model call 3: ask_llm from the sandbox: count the errors in a piece of 2,500 lines",
                     # the crash: SIGKILL, resume, an approval from another OS process, counted at the model
                     "host killed with SIGKILL after", "waits for a message: ringzero send",
                     "0 recorded model call(s) made again, 0 payment(s) charged twice (5 payments of 5)",
                     "every agent finished: True"):
        assert expected in " ".join(out.stdout.split()), expected
    for event in ("pause pid ", "kill pid ", "resume pid "):  # a log (no terminal) tells the timeline once
        assert out.stdout.count(event) == 1, out.stdout
    listing = ringzero_cli("ps", "--db", ".ringzero/demo/state.db", cwd=tmp_path)
    assert listing.returncode == 0
    for name in ("writer", "researcher", "analyst", "batch-labeler", "runaway", "flaky", "capped"):
        assert name in listing.stdout


def test_ps_on_a_missing_database_says_so(tmp_path: Path) -> None:
    out = ringzero_cli("ps", "--db", "nowhere.db", cwd=tmp_path)
    assert out.returncode == 1 and "no state database at nowhere.db" in out.stderr and out.stdout == "", out


@pytest.mark.timeout(120)
async def test_resume_finishes_a_process_whose_host_was_killed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import asyncio

    log = tmp_path / "calls.log"
    log.touch()
    monkeypatch.setenv("RINGZERO_TEST_LOG", str(log))
    db = tmp_path / "state.db"
    pid = await asyncio.to_thread(crash_host_midrun, db, 12, log)
    store = SqliteCheckpointer(db)
    recorded = len(await KernelStore(store).journal(pid))
    await store.aclose()
    out = await asyncio.to_thread(ringzero_cli, "resume", "--db", str(db), "--kernel", "tests.programs:make_kernel",
                                  cwd=tmp_path, env={"RINGZERO_TEST_LOG": str(log)})
    assert out.returncode == 0, out.stdout + out.stderr
    assert "resumed 1 process(es)" in out.stdout and f"pid {pid} worker" in out.stdout
    store = SqliteCheckpointer(db)
    record = await KernelStore(store).load_process(pid)
    journaled = len(await KernelStore(store).journal(pid))
    await store.aclose()
    # The summary says what was served from the journal and what was new: every recorded call
    # replayed, the rest of the journal made live by the resume.
    summary = " ".join(out.stdout.split())
    assert 0 < recorded < journaled
    assert f"{recorded} recorded syscall(s) replayed from the journal" in summary, summary
    assert f"{journaled - recorded} made live" in summary
    assert f"(replayed {recorded}, made live {journaled - recorded})" in summary
    assert record is not None and record.status.value == "exited" and len(record.result) == 12  # type: ignore[arg-type]


def test_resume_with_a_bad_kernel_factory_names_it(tmp_path: Path) -> None:
    (tmp_path / "state.db").touch()
    out = ringzero_cli("resume", "--db", "state.db", "--kernel", "no_such_module:make", cwd=tmp_path)
    assert out.returncode == 1 and "cannot import --kernel 'no_such_module:make'" in out.stderr and not out.stdout


def test_doctor_reports_each_executor_as_probed(tmp_path: Path) -> None:
    out = ringzero_cli("doctor", cwd=tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "MontyExecutor" in out.stdout and "ProcessExecutor" in out.stdout and "MicrosandboxExecutor" in out.stdout
    assert "cannot boot microVMs here" in out.stdout or "host ready" in out.stdout
    monty_row = next(line for line in out.stdout.splitlines() if "MontyExecutor" in line)
    assert "works" in monty_row
    assert "workers' second wall:" in out.stdout


async def _in_a_slow_tool(ctx: ringzero.Context, gate: str) -> str:
    return str(await ctx.tool("slow", gate))


async def test_a_process_paused_mid_syscall_is_paused_in_ps_as_in_top(tmp_path: Path) -> None:
    """Paused while its tool runs, it stops at the next syscall boundary; ``kernel.ps()`` and
    ``ringzero ps`` (another OS process, reading the store) say paused at once, as ``top`` does."""
    import asyncio

    from ringzero.core.contract.types import ProcessStatus

    release = asyncio.Event()
    started = asyncio.Event()

    async def slow(gate: str) -> str:
        started.set()
        await release.wait()
        return gate

    db = tmp_path / "state.db"
    async with ringzero.Kernel(checkpointer=SqliteCheckpointer(db), tools={"slow": slow}) as kernel:
        handle = await kernel.spawn(_in_a_slow_tool, "done")
        await asyncio.wait_for(started.wait(), 10)
        await handle.pause()
        [row] = await kernel.ps()
        assert row.status is ProcessStatus.PAUSED and handle.syscall_now == "tool", (row, handle.syscall_now)
        await kernel.flush()
        listing = await asyncio.to_thread(ringzero_cli, "ps", "--db", str(db), cwd=tmp_path)
        assert listing.returncode == 0 and "paused" in listing.stdout and "running" not in listing.stdout, \
            listing.stdout
        release.set()
        await handle.resume()
        assert await handle.wait(timeout=10) == "done"


async def test_ringzero_postgres_start_prints_a_dsn_a_checkpointer_uses_and_stop_stops_it(tmp_path: Path) -> None:
    """One command for a PostgreSQL server: ``--db "$(ringzero postgres start)"`` is a store."""
    import shutil
    import tempfile

    from ringzero.checkpointers.postgres import PostgresCheckpointer
    from ringzero.core.contract.types import Checkpoint
    from ringzero.local_postgres import server_programs
    from tests.debian import apt_install

    if server_programs() is None and not apt_install("postgresql"):
        pytest.skip("PostgreSQL's server programs are not installed and cannot be installed here (apt-get "
                    "needs root)")
    folder = tempfile.mkdtemp(prefix="ringzero-pg-cli-")  # where the postgres user can reach it, as root
    try:
        started = ringzero_cli("postgres", "start", "--dir", folder, cwd=tmp_path, timeout=120)
        assert started.returncode == 0, started.stdout + started.stderr
        dsn = started.stdout.strip()
        assert re.fullmatch(r"postgresql://postgres@127\.0\.0\.1:\d+/postgres\?passfile=/\S+/pgpass", dsn), \
            started.stdout
        assert (Path(folder) / "password").read_text().strip() not in dsn  # the password is in no command line
        assert "ringzero postgres stop" in started.stderr
        again = ringzero_cli("postgres", "start", "--dir", folder, cwd=tmp_path, timeout=120)
        assert again.stdout.strip() == dsn, "a second start is the same server"
        store = PostgresCheckpointer(dsn)
        await store.put(Checkpoint("t", "", "c1", b"payload"))
        found = await store.get("t")
        await store.aclose()
        assert found is not None and found.payload == b"payload"
        assert ringzero_cli("postgres", "status", "--dir", folder, cwd=tmp_path).stdout.split() == [dsn, "running"]
        assert ringzero_cli("postgres", "stop", "--dir", folder, cwd=tmp_path, timeout=120).returncode == 0
        assert ringzero_cli("postgres", "status", "--dir", folder, cwd=tmp_path).stdout.split() == [dsn, "stopped"]
    finally:
        ringzero_cli("postgres", "stop", "--dir", folder, cwd=tmp_path, timeout=120)
        shutil.rmtree(folder, ignore_errors=True)


def test_ringzero_postgres_without_the_server_programs_says_what_to_install(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from ringzero import cli, local_postgres

    monkeypatch.setattr(local_postgres, "server_programs", lambda: None)
    assert cli.main(["postgres", "start", "--dir", "unused"]) == 1
    printed = capsys.readouterr()
    said = " ".join(printed.err.split())
    assert printed.out == "", "an error where a script reads the DSN"
    assert "PostgreSQL's server programs (initdb, pg_ctl) are not on this machine" in said
    assert "apt-get install postgresql" in said and "brew install postgresql" in said


ERRORS = {
    "ps of a missing store": (["ps", "--db", "nowhere.db"], "no state database at nowhere.db"),
    "send of a message that is not JSON": (["send", "--db", "{db}", "1", "{{approved}}"], "must be JSON"),
    "show of an unknown pid": (["show", "--db", "{db}", "99"], "99"),
    "postgres status of a folder with no server": (["postgres", "status", "--dir", "{tmp}/none"],
                                                   "no PostgreSQL server was made in"),
    "postgres stop of a folder with no server": (["postgres", "stop", "--dir", "{tmp}/none"],
                                                 "no PostgreSQL server was made in"),
    "an unknown store scheme": (["ps", "--db", "mysql://db/x"], "no checkpointer is installed for mysql://"),
}


@pytest.mark.parametrize("case", list(ERRORS))
def test_every_command_s_error_goes_to_stderr_with_a_non_zero_exit(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                                   monkeypatch: pytest.MonkeyPatch, case: str) -> None:
    """Errors were printed on stdout, where a script reads its answer (``--db "$(ringzero
    postgres start)"`` took the error for a DSN), and ``postgres status`` of a folder with no
    server printed a DSN it made up. Now stdout holds nothing but answers."""
    from ringzero import local_postgres
    from ringzero.checkpointers import SqliteCheckpointer
    from ringzero.cli import main

    if "postgres" in case and local_postgres.server_programs() is None:
        monkeypatch.setattr(local_postgres, "server_programs", lambda: tmp_path)  # the folder is what is judged
    db = tmp_path / "state.db"

    async def make() -> None:
        async with ringzero.Kernel(checkpointer=SqliteCheckpointer(db)):
            pass

    asyncio.run(make())
    monkeypatch.chdir(tmp_path)
    command, says = ERRORS[case]
    code = main([part.format(db=db, tmp=tmp_path) for part in command])
    printed = capsys.readouterr()
    assert code == 1 and printed.out == "", printed
    assert "error:" in printed.err and says in " ".join(printed.err.split()), printed.err


async def test_ctrl_c_on_serve_with_schedules_stops_it_without_a_traceback(tmp_path: Path) -> None:
    """``serve`` firing a schedule printed a traceback on Ctrl-C; now it says it stopped, on
    stderr, with exit status 130, after the firings it made."""
    import signal

    from tests import schedule_programs

    db, log = tmp_path / "state.db", tmp_path / "stamps.log"
    log.touch()
    async with schedule_programs.make_kernel(db) as kernel:
        await kernel.schedule(schedule_programs.stamp, name="stamps", every=0.5)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "RINGZERO_TEST_LOG": str(log)}
    # Ctrl-C as a terminal sends it: to a process that has SIGINT's default action. One started
    # from a background job (``make test &``) inherits SIGINT ignored, and keeps ignoring it.
    serving = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "ringzero.cli", "serve", "--db", str(db), "--kernel",
        "tests.schedule_programs:make_kernel", cwd=tmp_path, env=env, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        for _ in range(200):
            if log.read_text():
                break
            await asyncio.sleep(0.05)
        serving.send_signal(signal.SIGINT)
        out, err = await asyncio.wait_for(serving.communicate(), 30)
    finally:
        if serving.returncode is None:
            serving.kill()
            await serving.wait()
    assert log.read_text(), "the schedule never fired"
    assert serving.returncode == 130 and "Traceback" not in err.decode(), err.decode()
    assert "stopped (Ctrl-C)" in err.decode() and "firing 1 schedule(s)" in out.decode()
