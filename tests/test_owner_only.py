"""Issue 58: only the owner gets in. On a machine others share, another local user (here
``nobody``, through ``setpriv``) cannot read the default store, open an MCP session over HTTP
without the token, or connect to the local PostgreSQL without the password; with the token or
the password, each works. Everything runs in a folder every user may traverse (0755, as a
project folder is), so that what keeps the other user out is ringzero's modes, not pytest's."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

import ringzero
from tests.test_cli import ROOT
from tests.test_mcp_server import mcp_over_http

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None,
                                reason="acting as another user (setpriv to nobody) needs root")

NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--"]


def as_nobody(*command: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*NOBODY, *command], capture_output=True, text=True, timeout=60,
                          env=env if env is not None else {"PATH": "/usr/bin:/bin"}, cwd="/")


def python_for_nobody() -> str:
    """An interpreter the other user may run (this one may live under a 0700 home)."""
    for candidate in (sys.executable, "/usr/bin/python3"):
        if as_nobody(candidate, "-c", "pass").returncode == 0:
            return candidate
    pytest.skip("no Python interpreter on this host that another user may run")


@pytest.fixture
def shared_folder() -> Iterator[Path]:
    """A folder under /tmp every user may traverse, as a project folder is."""
    folder = Path(tempfile.mkdtemp(prefix="ringzero-shared-"))
    folder.chmod(0o755)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


APP = """
import asyncio, os, signal
from ringzero import Kernel

async def approval(ctx):
    ctx.state["asked"] = True
    await ctx.checkpoint()
    message = await ctx.recv()
    return message["approved"]

def make_kernel(db):
    return Kernel()

async def crash():
    async with Kernel() as kernel:
        await kernel.spawn(approval, name="approval")
        while not os.path.exists(".ringzero/state.db-wal"):
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.3)
        os.kill(os.getpid(), signal.SIGKILL)  # the host dies with the process waiting

async def recover():
    async with Kernel() as kernel:
        [handle] = await kernel.recover()
        await handle.send({"approved": True})
        print(await handle.wait())
"""


def run_app(folder: Path, call: str) -> subprocess.CompletedProcess[str]:
    script = f"import asyncio, os, app\nos.umask(0o022)\nasyncio.run(app.{call}())"
    return subprocess.run([sys.executable, "-c", script], cwd=folder, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": f"{folder}{os.pathsep}{ROOT}"})


def test_the_default_store_is_the_owner_s_alone_after_a_crash_and_a_recovery(shared_folder: Path) -> None:
    """Under umask 022 the default ``.ringzero/`` was 0755 and its database 0644: any local user
    could read every prompt and tool argument. Now every folder ringzero makes there is 0700 and
    every file 0600: the database, its WAL and shared memory, the append logs a crash leaves."""
    (shared_folder / "app.py").write_text(APP)
    crashed = run_app(shared_folder, "crash")
    assert crashed.returncode == -9, crashed.stderr
    recovered = run_app(shared_folder, "recover")
    assert recovered.returncode == 0 and recovered.stdout.strip() == "True", recovered.stderr
    state = shared_folder / ".ringzero"
    found = {str(p.relative_to(state)): stat.S_IMODE(p.stat().st_mode) for p in (state, *state.rglob("*"))}
    assert any(name.startswith("state.db") for name in found), found
    wrong = {name: oct(mode) for name, mode in found.items()
             if mode != (0o700 if (state / name).is_dir() else 0o600)}
    assert wrong == {}, wrong
    read = as_nobody("cat", str(state / "state.db"))
    assert read.returncode != 0 and "Permission denied" in read.stderr, read
    assert subprocess.run(["cat", str(state / "state.db")], capture_output=True).returncode == 0


def test_doctor_warns_of_a_store_others_can_read(shared_folder: Path) -> None:
    """A store the user points at keeps the user's modes; ``ringzero doctor`` says when other
    users can read it."""
    from ringzero.doctor import store_warnings

    store = shared_folder / "state.db"
    store.write_bytes(b"")
    store.chmod(0o644)
    assert [w.split(" is ")[0] for w in store_warnings([store])] == [str(store)]
    store.chmod(0o600)
    assert store_warnings([store]) == []


INITIALIZE = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
    "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "probe", "version": "1"}}})
POST = """
import sys, urllib.request, urllib.error
request = urllib.request.Request(sys.argv[1], data=sys.argv[2].encode(), method="POST", headers={
    "content-type": "application/json", "accept": "application/json, text/event-stream", **(
        {"authorization": "Bearer " + sys.argv[3]} if len(sys.argv) > 3 else {})})
try:
    with urllib.request.urlopen(request, timeout=20) as answer:
        print(answer.status, answer.headers.get("mcp-session-id") is not None, answer.read().decode())
except urllib.error.HTTPError as error:
    print(error.code, False, error.read().decode())
"""


async def test_an_mcp_session_over_http_needs_the_token(shared_folder: Path) -> None:
    """Any local process that POSTed ``initialize`` to 127.0.0.1 got a session, and with it the
    host's tools and code runs; ``serverInfo.version`` was the MCP library's. Now the server
    needs its bearer token, generated at its first start and kept owner-only."""
    python = python_for_nobody()
    state = shared_folder / ".ringzero" / "mcp"
    async with mcp_over_http("--state-dir", str(state), cwd=shared_folder) as server:
        kept = state / "mcp-token"
        token = kept.read_text()
        assert stat.S_IMODE(kept.stat().st_mode) == 0o600 and stat.S_IMODE(state.stat().st_mode) == 0o700
        assert as_nobody("cat", str(kept)).returncode != 0
        refused = await asyncio.to_thread(as_nobody, python, "-c", POST, server.url, INITIALIZE)
        wrong = await asyncio.to_thread(as_nobody, python, "-c", POST, server.url, INITIALIZE, "not-the-token")
        allowed = await asyncio.to_thread(as_nobody, python, "-c", POST, server.url, INITIALIZE, token)
    stderr = server.stderr
    assert refused.stdout.startswith("401 False"), (refused, stderr)
    assert wrong.stdout.startswith("401 False"), wrong
    assert allowed.stdout.startswith("200 True"), (allowed, stderr)
    assert f'"version":"{ringzero.__version__}"' in allowed.stdout.replace(" ", ""), allowed.stdout
    assert token in stderr.decode(), "the generated token is printed once, at the start that made it"


def test_the_local_postgresql_needs_its_password(shared_folder: Path) -> None:
    """``ringzero postgres start`` initialised the server with ``trust``: any local user could
    connect as the superuser. Now it has a password, kept owner-only in its folder and carried
    by the DSN it prints."""
    from ringzero.local_postgres import LocalPostgres, server_programs
    from tests.postgres import server_or_skip

    server_or_skip().remove()  # PostgreSQL installed if need be
    programs = server_programs()
    assert programs is not None
    psql = shutil.which("psql") or str(programs / "psql")
    server = LocalPostgres(shared_folder / "pg")
    try:
        dsn = server.start()
        bare = f"postgresql://postgres@127.0.0.1:{server.port}/postgres"
        without = as_nobody(psql, bare, "-c", "select 41 + 1")
        through_the_dsn = as_nobody(psql, dsn, "-c", "select 41 + 1")  # its pass file is the owner's alone
        password = server.password_file.read_text().strip()
        with_it = as_nobody(psql, bare, "-tA", "-c", "select 41 + 1",
                            env={"PATH": "/usr/bin:/bin", "PGPASSWORD": password})
        modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in server.folder.iterdir() if p.is_file()}
        folder = stat.S_IMODE(server.folder.stat().st_mode)
    finally:
        server.remove()
    assert without.returncode != 0 and "password" in without.stderr, without
    assert through_the_dsn.returncode != 0 and "password" in through_the_dsn.stderr, through_the_dsn
    assert with_it.returncode == 0 and with_it.stdout.strip() == "42", with_it
    assert password not in dsn
    expected = 0o711 if os.geteuid() == 0 else 0o700  # root's: the postgres user passes through to its data
    assert folder == expected and set(modes.values()) == {0o600} and {"password", "pgpass"} <= set(modes), (
        folder, modes)


def test_a_root_start_with_the_default_folder_works(shared_folder: Path) -> None:
    """As root, ``ringzero postgres start`` with the default ``.ringzero/postgres`` failed: the
    server's user could not reach its password file or data through root's 0700 folders. Now
    root's folders there are 0711 (pass through, no listing), the data the server user's alone."""
    from ringzero.local_postgres import LocalPostgres
    from tests.postgres import server_or_skip

    server_or_skip().remove()  # PostgreSQL installed if need be
    started = subprocess.run([sys.executable, "-m", "ringzero.cli", "postgres", "start"], cwd=shared_folder,
                             env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=180)
    server = LocalPostgres(shared_folder / ".ringzero" / "postgres")
    try:
        assert started.returncode == 0, started.stderr
        import psycopg

        with psycopg.connect(started.stdout.strip(), autocommit=True) as conn:
            assert conn.execute("select 41 + 1").fetchone() == (42,)
        modes = {p.name: (stat.S_IMODE(p.stat().st_mode), p.owner())
                 for p in (shared_folder / ".ringzero", server.folder, server.data)}
    finally:
        server.remove()
    assert modes == {".ringzero": (0o711, "root"), "postgres": (0o711, "root"), "data": (0o700, "postgres")}, modes


def test_root_changes_nothing_the_postgres_user_could_link_elsewhere(shared_folder: Path) -> None:
    """Root's start made ``log`` owner-only and gave it to the ``postgres`` user following links:
    that user (or anyone with the superuser's password) linked it to a root file and got it.
    Now root changes nothing there but what it just made, by descriptor."""
    from ringzero.local_postgres import LocalPostgres, NoPostgres
    from tests.postgres import server_or_skip

    server_or_skip().remove()
    server = LocalPostgres(shared_folder / "pg")
    targets = [shared_folder / "root-file-1", shared_folder / "root-file-2"]
    try:
        server.start()
        server.stop()
        for target in targets:
            target.write_text("root's\n")
            target.chmod(0o644)
        (server.folder / "log").unlink(missing_ok=True)
        (server.folder / "log").symlink_to(targets[0])  # where the log was, in a folder the server's user owned
        log = server.data / "log"  # where the server's user writes it now
        log.unlink(missing_ok=True)
        planted = subprocess.run(["runuser", "-u", "postgres", "--", "ln", "-s", str(targets[1]), str(log)],
                                 capture_output=True, text=True, timeout=30)
        assert planted.returncode == 0, planted.stderr
        with contextlib.suppress(NoPostgres):  # the server's user broke its own log: its server may not start
            server.start()
    finally:
        server.remove()
    found = [(stat.S_IMODE(t.stat().st_mode), t.owner(), t.read_text()) for t in targets]
    assert found == [(0o644, "root", "root's\n")] * 2, found
