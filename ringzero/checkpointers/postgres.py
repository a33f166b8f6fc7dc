"""PostgresCheckpointer: checkpoints in PostgreSQL (psycopg 3, async, pooled), for kernels on
several machines sharing one store.

    store = PostgresCheckpointer("postgresql://user:secret@db.internal:5432/agents")

The schema carries its version in ``ringzero_schema``; a database with a newer version is
refused. A record is durable when ``put`` returns (each write commits). Errors name the
server and database, never the password.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from ringzero.checkpointers._filters import list_query, pushable, selected
from ringzero.core.contract.errors import CheckpointerError, Closed, MissingExtra
from ringzero.core.contract.protocols import CheckpointerCapabilities
from ringzero.core.contract.types import JSON, Checkpoint, PendingWrite

try:
    import psycopg
    from psycopg.conninfo import conninfo_to_dict
    from psycopg_pool import AsyncConnectionPool, PoolTimeout
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise MissingExtra("PostgresCheckpointer", "postgres") from exc

from ringzero.checkpointers.postgres_memory import MEMORY_SCHEMA, PostgresMemoryIndex, move_record_memories

__all__ = ["PostgresCheckpointer"]

SCHEMA_VERSION = 2
_SCHEMA = """
CREATE TABLE IF NOT EXISTS ringzero_schema (version INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS ringzero_checkpoints (
    thread_id TEXT NOT NULL,
    namespace TEXT NOT NULL,
    id TEXT NOT NULL,
    parent_id TEXT,
    payload BYTEA NOT NULL,
    metadata JSONB NOT NULL,
    PRIMARY KEY (thread_id, namespace, id)
);
CREATE TABLE IF NOT EXISTS ringzero_writes (
    thread_id TEXT NOT NULL,
    namespace TEXT NOT NULL,
    checkpoint_id TEXT NOT NULL,
    task_id TEXT NOT NULL,
    idx INTEGER NOT NULL,
    channel TEXT NOT NULL,
    value BYTEA NOT NULL,
    task_path TEXT NOT NULL DEFAULT '',
    PRIMARY KEY (thread_id, namespace, checkpoint_id, task_id, idx)
)
"""
_SCHEMA_2 = """
CREATE INDEX IF NOT EXISTS ringzero_checkpoints_run_id ON ringzero_checkpoints ((metadata->>'run_id'))
    WHERE metadata ? 'run_id';
""" + MEMORY_SCHEMA
_MIGRATIONS = {0: _SCHEMA.split(";", 1)[1] + ";" + _SCHEMA_2, 1: _SCHEMA_2}
"""What brings a database of each older version to SCHEMA_VERSION (0: a new one)."""

_WRITES = ("(SELECT coalesce(json_agg(json_build_array(w.task_id, w.channel, encode(w.value, 'hex'), w.task_path, "
           "w.idx)), '[]') FROM ringzero_writes w WHERE w.thread_id=c.thread_id AND w.namespace=c.namespace "
           "AND w.checkpoint_id=c.id)")
_SELECT = ("SELECT c.thread_id, c.namespace, c.id, c.parent_id, c.payload, c.metadata, "
           f"{_WRITES} FROM ringzero_checkpoints c")
"""A checkpoint with its writes, in one statement (the writes as JSON, their values in hex)."""


class PostgresCheckpointer:
    """Durable checkpoints shared by kernels on any number of machines."""

    capabilities = CheckpointerCapabilities(durable=True, multi_process=True, delete_checkpoints=True, claims=True,
                                          put_many=True)

    def __init__(self, dsn: str, *, min_connections: int = 1, max_connections: int = 8,
                 connect_timeout: float = 10.0) -> None:
        self.dsn = dsn
        self._min, self._max, self._timeout = min_connections, max_connections, connect_timeout
        self._pool: AsyncConnectionPool[Any] | None = None
        self._stale = False
        """A connection failed (the server restarted, a backend was killed): the pool is replaced."""
        self._opening: asyncio.Lock | None = None
        self._attempts = 0
        self._closing: set[asyncio.Task[None]] = set()
        """Replaced pools, closing (``aclose`` waits for them)."""
        self._failed: CheckpointerError | None = None
        """Why the last attempt to open a pool failed (see ``_get_pool``)."""
        self._closed = False

    @property
    def where(self) -> str:
        """The server and database, for messages: never the password."""
        try:
            info = conninfo_to_dict(self.dsn)
        except psycopg.ProgrammingError:
            return "an unparsable PostgreSQL DSN"
        return f"postgresql://{info.get('user', '')}@{info.get('host', 'localhost')}:{info.get('port', 5432)}/" \
               f"{info.get('dbname', '')}"

    def __repr__(self) -> str:
        return f"PostgresCheckpointer({self.where!r})"

    @contextmanager
    def _errors(self, doing: str, pool: AsyncConnectionPool[Any] | None = None) -> Iterator[None]:
        """psycopg's errors as ``CheckpointerError``; a failed connection of ``pool`` (the one in
        use) has it replaced at the next call (``_open_pool``)."""
        try:
            yield
        except (psycopg.Error, PoolTimeout) as exc:
            if pool is not None and pool is self._pool and isinstance(exc, (psycopg.OperationalError, PoolTimeout)):
                self._stale = True
            raise CheckpointerError(f"PostgreSQL at {self.where}: {doing} failed: {exc}") from exc

    async def _get_pool(self) -> AsyncConnectionPool[Any]:
        if self._closed:
            raise Closed(f"the PostgresCheckpointer for {self.where} is closed; open a new one to go on")
        if self._pool is not None and not self._stale:
            return self._pool
        if self._opening is None:
            self._opening = asyncio.Lock()
        attempts = self._attempts
        async with self._opening:  # one pool at a time, however many tasks ask at once
            if self._pool is not None and not self._stale:
                return self._pool
            if self._attempts != attempts and self._failed is not None:
                # An attempt made while this caller waited failed: while the server is down,
                # everyone waiting learns it from that one attempt, not from one each.
                raise CheckpointerError(str(self._failed)) from self._failed.__cause__
            self._attempts += 1
            try:
                self._pool = await self._open_pool()
            except CheckpointerError as exc:
                self._failed = exc
                raise
            self._failed, self._stale = None, False
            return self._pool

    async def _open_pool(self) -> AsyncConnectionPool[Any]:
        """Open a pool, in place of one whose connections failed. A pool left to heal itself
        retries with a growing backoff and hands out its dead idle connections one by one, so a
        server back after a restart would stay unreachable for a while; a new pool reaches it at
        once. One plain connection comes first: it fails at once, with the server's own words,
        where the server is down (a pool would retry until its timeout), and it migrates."""
        old, self._pool = self._pool, None
        if old is not None:  # closed aside: its workers may be mid-connect; one lent out closes on return
            closing = asyncio.get_running_loop().create_task(old.close())
            self._closing.add(closing)
            closing.add_done_callback(self._closing.discard)
        with self._errors("connecting"):
            async with await psycopg.AsyncConnection.connect(self.dsn, autocommit=True,
                                                             connect_timeout=int(self._timeout)) as conn:
                await self._check_and_migrate(conn)
            pool: AsyncConnectionPool[Any] = AsyncConnectionPool(
                self.dsn, min_size=self._min, max_size=self._max, open=False, timeout=self._timeout,
                kwargs={"autocommit": True, "connect_timeout": int(self._timeout)})
            try:
                await pool.open(wait=True, timeout=self._timeout)
            except BaseException:
                await pool.close()
                raise
        return pool

    async def _check_and_migrate(self, conn: Any) -> None:
        async with conn.transaction():
            await conn.execute("SELECT pg_advisory_xact_lock(7403120)")  # one migrator at a time
            await conn.execute(_SCHEMA.split(";")[0])
            row = await (await conn.execute("SELECT max(version) FROM ringzero_schema")).fetchone()
            version = row[0] or 0
            if version > SCHEMA_VERSION:
                raise CheckpointerError(f"PostgreSQL at {self.where} has ringzero schema version {version}, newer "
                                        f"than this ringzero ({SCHEMA_VERSION}); upgrade ringzero to use it")
            if version < SCHEMA_VERSION:
                for statement in filter(str.strip, _MIGRATIONS[version].split(";")):
                    await conn.execute(statement)
                if version == 1:
                    await move_record_memories(conn)
                await conn.execute("DELETE FROM ringzero_schema")
                await conn.execute("INSERT INTO ringzero_schema VALUES (%s)", (SCHEMA_VERSION,))

    async def put(self, checkpoint: Checkpoint) -> None:
        pool = await self._get_pool()
        with self._errors("put", pool):
            async with pool.connection() as conn:
                await conn.execute(_PUT, _row(checkpoint))

    async def put_many(self, checkpoints: Sequence[Checkpoint]) -> None:
        """Store each, in order, in one transaction: one round trip's worth of waiting, not one each."""
        pool = await self._get_pool()
        with self._errors("put_many", pool):
            async with pool.connection() as conn, conn.transaction(), conn.cursor() as cur:
                await cur.executemany(_PUT, [_row(cp) for cp in checkpoints])

    async def claim(self, checkpoint: Checkpoint) -> bool:
        pool = await self._get_pool()
        with self._errors("claim", pool):
            async with pool.connection() as conn:
                cursor = await conn.execute(
                    "INSERT INTO ringzero_checkpoints VALUES (%s, %s, %s, %s, %s, %s) "
                    "ON CONFLICT (thread_id, namespace, id) DO NOTHING", _row(checkpoint))
                return bool(cursor.rowcount == 1)

    async def put_writes(
        self, thread_id: str, namespace: str, checkpoint_id: str, writes: Sequence[PendingWrite]
    ) -> None:
        pool = await self._get_pool()
        rows = [(thread_id, namespace, checkpoint_id, w.task_id, w.idx, w.channel, w.value, w.task_path)
                for w in writes]
        special, ordinary = [r for r in rows if r[4] < 0], [r for r in rows if r[4] >= 0]
        with self._errors("put_writes", pool):  # a special (negative idx) write replaces, others are kept first
            async with pool.connection() as conn, conn.transaction(), conn.cursor() as cur:
                if special:
                    await cur.executemany(
                        "INSERT INTO ringzero_writes VALUES (%s, %s, %s, %s, %s, %s, %s, %s) "
                        "ON CONFLICT (thread_id, namespace, checkpoint_id, task_id, idx) DO UPDATE SET "
                        "channel = EXCLUDED.channel, value = EXCLUDED.value, task_path = EXCLUDED.task_path",
                        special)
                if ordinary:
                    await cur.executemany("INSERT INTO ringzero_writes VALUES (%s, %s, %s, %s, %s, %s, %s, %s) "
                                          "ON CONFLICT DO NOTHING", ordinary)

    async def get(self, thread_id: str, namespace: str = "", checkpoint_id: str | None = None) -> Checkpoint | None:
        if checkpoint_id is None:
            rows = await self.read(f"{_SELECT} WHERE thread_id=%s AND namespace=%s ORDER BY id DESC LIMIT 1",
                                   (thread_id, namespace), "get")
        else:
            rows = await self.read(f"{_SELECT} WHERE thread_id=%s AND namespace=%s AND id=%s",
                                   (thread_id, namespace, checkpoint_id), "get")
        return next((_checkpoint(row) for row in rows), None)

    async def list(
        self,
        thread_id: str | None = None,
        namespace: str | None = None,
        *,
        filter: Mapping[str, JSON] | None = None,
        before: str | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[Checkpoint]:
        # JSONB containment narrows what the server returns; a plain key's text is compared where an
        # index can serve it (run_id: LangGraph's delete_for_runs); exact equality is checked after.
        prefilter = [("c.metadata @> %s::jsonb", json.dumps(dict(filter)))] if filter else []
        prefilter += [(f"c.metadata ? '{key}' AND c.metadata->>'{key}' = %s", value)
                      for key, value in pushable(filter) if isinstance(value, str)]
        sql, params = list_query(_SELECT, "%s", thread_id, namespace, before, prefilter)
        if limit is not None and not filter:
            sql += f" LIMIT {int(limit)}"
        rows = await self.read(sql, params, "list")
        for row in selected(rows, lambda r: r[5], filter, limit):
            yield _checkpoint(row)

    async def read(self, sql: str, params: Sequence[Any], doing: str = "reading") -> Sequence[Any]:
        """The rows of one statement (it commits: a write with RETURNING reads here too)."""
        pool = await self._get_pool()
        with self._errors(doing, pool):
            async with pool.connection() as conn:
                cursor = await conn.execute(sql, params)
                return list(await cursor.fetchall()) if cursor.description is not None else []

    def memory_index(self) -> PostgresMemoryIndex:
        """Long-term memory in this database, searched through its full-text index
        (``ringzero.core.support.memory``)."""
        return PostgresMemoryIndex(self)

    async def delete_thread(self, thread_id: str) -> None:
        pool = await self._get_pool()
        with self._errors("delete_thread", pool):
            async with pool.connection() as conn, conn.transaction():
                await conn.execute("DELETE FROM ringzero_checkpoints WHERE thread_id=%s", (thread_id,))
                await conn.execute("DELETE FROM ringzero_writes WHERE thread_id=%s", (thread_id,))

    async def delete_checkpoints(self, thread_id: str, namespace: str, ids: Sequence[str]) -> None:
        pool = await self._get_pool()
        with self._errors("delete_checkpoints", pool):
            async with pool.connection() as conn, conn.transaction():
                await conn.execute("DELETE FROM ringzero_checkpoints WHERE thread_id=%s AND namespace=%s "
                                   "AND id = ANY(%s)", (thread_id, namespace, list(ids)))
                await conn.execute("DELETE FROM ringzero_writes WHERE thread_id=%s AND namespace=%s "
                                   "AND checkpoint_id = ANY(%s)", (thread_id, namespace, list(ids)))

    async def aclose(self) -> None:
        """Close the pool; a later call raises ``Closed``."""
        self._closed = True
        if self._pool is not None:
            pool, self._pool = self._pool, None
            await pool.close()
        if self._closing:
            await asyncio.gather(*self._closing)


def _checkpoint(row: Any) -> Checkpoint:
    thread_id, namespace, cid, parent_id, payload, metadata, writes = row
    return Checkpoint(thread_id=thread_id, namespace=namespace, id=cid, parent_id=parent_id, payload=bytes(payload),
                      metadata=metadata,
                      writes=tuple(PendingWrite(t, c, bytes.fromhex(v), p, i) for t, c, v, p, i in writes))


_PUT = ("INSERT INTO ringzero_checkpoints VALUES (%s, %s, %s, %s, %s, %s) "
        "ON CONFLICT (thread_id, namespace, id) DO UPDATE SET parent_id = EXCLUDED.parent_id, "
        "payload = EXCLUDED.payload, metadata = EXCLUDED.metadata")


def _row(checkpoint: Checkpoint) -> tuple[Any, ...]:
    """``checkpoint`` as the parameters of one ``ringzero_checkpoints`` row."""
    return (checkpoint.thread_id, checkpoint.namespace, checkpoint.id, checkpoint.parent_id, checkpoint.payload,
            json.dumps(dict(checkpoint.metadata)))
