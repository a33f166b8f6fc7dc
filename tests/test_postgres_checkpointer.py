"""PostgresCheckpointer specifics: clear errors for an unreachable server, a kernel on it."""

from __future__ import annotations

import socket

import pytest

from ringzero import Context, Kernel
from ringzero.checkpointers import PostgresCheckpointer
from ringzero.core.contract.errors import CheckpointerError
from tests.postgres import fresh_database


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])  # nothing listens once the socket is closed


async def test_an_unreachable_server_is_named_and_its_password_is_not() -> None:
    store = PostgresCheckpointer(f"postgresql://agent:hunter2@127.0.0.1:{closed_port()}/agents", connect_timeout=2)
    with pytest.raises(CheckpointerError) as caught:
        await store.get("t")
    message = str(caught.value)
    assert "127.0.0.1" in message and "agents" in message and "hunter2" not in message


async def double(ctx: Context, x: int) -> int:
    await ctx.checkpoint()
    return x * 2


async def test_a_kernel_runs_and_records_its_processes_in_postgres(postgres_dsn: str) -> None:
    dsn = fresh_database(postgres_dsn)
    async with Kernel(checkpointer=PostgresCheckpointer(dsn)) as kernel:
        assert await (await kernel.spawn(double, 21)).wait() == 42
    async with Kernel(checkpointer=PostgresCheckpointer(dsn)) as other:  # another host, same store
        [row] = await other.ps(all=True)
        assert row.name == "double" and row.status.value == "exited"


async def test_a_database_with_a_newer_schema_is_refused_and_left_alone(postgres_dsn: str) -> None:
    import psycopg

    dsn = fresh_database(postgres_dsn)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE ringzero_schema (version INTEGER NOT NULL)")
        conn.execute("INSERT INTO ringzero_schema VALUES (99)")
    store = PostgresCheckpointer(dsn)
    with pytest.raises(CheckpointerError, match="schema version 99"):
        await store.get("t")
    with psycopg.connect(dsn, autocommit=True) as conn:
        tables = {r[0] for r in conn.execute("SELECT tablename FROM pg_tables WHERE schemaname='public'")}
    assert tables == {"ringzero_schema"}  # nothing was created in a database from the future
