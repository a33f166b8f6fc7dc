"""A real PostgreSQL server for the tests, on 127.0.0.1, started (and if need be installed) here.

Set RINGZERO_TEST_POSTGRES_DSN to use a server that is already running instead.
"""

from __future__ import annotations

import os
import tempfile
import urllib.parse
import uuid
from collections.abc import Iterator

import pytest

from ringzero.local_postgres import LocalPostgres, server_programs
from tests.debian import apt_install


class PostgresServer(LocalPostgres):
    """One PostgreSQL server of the tests' own (ringzero's ``LocalPostgres``), in a folder of its
    own under the system's temp folder: not under pytest's 0700 temp root, since the server runs
    as the postgres user, who must reach it."""

    def __init__(self) -> None:
        super().__init__(tempfile.mkdtemp(prefix="ringzero-pg-"))
        self.create()  # made, not started: the tests start it


def server_or_skip() -> PostgresServer:
    """A new, stopped server (PostgreSQL installed from Debian's packages if need be)."""
    if server_programs() is None and not apt_install("postgresql"):
        pytest.skip("PostgreSQL is not installed and cannot be installed here (apt-get needs root); "
                    "set RINGZERO_TEST_POSTGRES_DSN to a running server")
    return PostgresServer()


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
    return database_dsn(admin_dsn, name)


def database_dsn(dsn: str, name: str) -> str:
    """``dsn`` with its database changed to ``name`` (its query, a pass file, kept)."""
    parts = urllib.parse.urlsplit(dsn)
    return urllib.parse.urlunsplit(parts._replace(path="/" + name))


def database_of(dsn: str) -> str:
    return urllib.parse.urlsplit(dsn).path.lstrip("/")
