"""A real PostgreSQL server for the tests, on 127.0.0.1, started (and if need be installed) here.

Set RINGZERO_TEST_POSTGRES_DSN to use a server that is already running instead.
"""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.debian import apt_install


def _bindir() -> str | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    return os.path.dirname(found[-1]) if found else None


def _install() -> str | None:
    """Install Debian's postgresql package when it is missing and we may (root, apt)."""
    return _bindir() if apt_install("postgresql") else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _as_postgres(args: list[str]) -> list[str]:
    return ["runuser", "-u", "postgres", "--", *args] if os.geteuid() == 0 else args


class PostgresServer:
    """One PostgreSQL server of the tests' own: its data folder, its port, started and stopped here."""

    def __init__(self, bindir: str) -> None:
        self.bindir = bindir
        # Not under pytest's 0700 temp root: the server runs as the postgres user, who must reach it.
        self.data = Path(tempfile.mkdtemp(prefix="ringzero-pg-"))
        if os.geteuid() == 0:
            shutil.chown(self.data, "postgres", "postgres")
        self.port = _free_port()
        self.dsn = f"postgresql://postgres@127.0.0.1:{self.port}/postgres"
        subprocess.run(_as_postgres([f"{bindir}/initdb", "-D", str(self.data), "-A", "trust", "-U", "postgres"]),
                       check=True, capture_output=True, timeout=120)

    def start(self) -> None:
        options = f"-p {self.port} -k {self.data} -c listen_addresses=127.0.0.1 -c fsync=on"
        subprocess.run(_as_postgres([f"{self.bindir}/pg_ctl", "-D", str(self.data), "-o", options, "-w", "-l",
                                     str(self.data / "log"), "start"]), check=True, capture_output=True, timeout=120)

    def stop(self, mode: str = "immediate") -> None:
        """``immediate`` is a crash (no shutdown checkpoint); ``fast`` is an operator's restart."""
        subprocess.run(_as_postgres([f"{self.bindir}/pg_ctl", "-D", str(self.data), "-m", mode, "-w", "stop"]),
                       capture_output=True, timeout=60)

    def remove(self) -> None:
        self.stop()
        shutil.rmtree(self.data, ignore_errors=True)


def server_or_skip() -> PostgresServer:
    """A new, stopped server (PostgreSQL installed from Debian's packages if need be)."""
    bindir = _bindir() or _install()
    if bindir is None:
        pytest.skip("PostgreSQL is not installed and cannot be installed here (apt-get needs root); "
                    "set RINGZERO_TEST_POSTGRES_DSN to a running server")
    return PostgresServer(bindir)


@pytest.fixture(scope="session")
def postgres_dsn() -> Iterator[str]:
    """The DSN of a server to create test databases in."""
    existing = os.environ.get("RINGZERO_TEST_POSTGRES_DSN")
    if existing:
        yield existing
        return
    server = server_or_skip()
    server.start()
    try:
        yield server.dsn
    finally:
        server.remove()


def fresh_database(admin_dsn: str) -> str:
    """Create an empty database and return its DSN."""
    import psycopg

    name = f"t_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    return admin_dsn.rsplit("/", 1)[0] + "/" + name
