"""SqliteCheckpointer: the embedded default, one SQLite file through aiosqlite.

WAL mode, so readers never block the writer and a record whose ``put`` returned survives
the host process being killed (``synchronous=NORMAL`` is durable against a process crash;
pass ``synchronous="FULL"`` to survive power loss as well). Concurrent writes are grouped
into one transaction (group commit) without giving that up: each ``put`` still returns only
once its own record is committed. Several kernels in separate
processes may share one file: SQLite serialises their writes and ``busy_timeout`` makes
them wait for each other instead of failing. The schema carries its version in
``PRAGMA user_version``; a file of another schema, or not SQLite at all, is refused with
its path in the error and left untouched.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import threading
import time
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal

import aiosqlite

from ringzero.checkpointers._filters import list_query, pushable, selected
from ringzero.checkpointers.sqlite_memory import MEMORY_SCHEMA, SqliteMemoryIndex, move_record_memories
from ringzero.core.errors import CheckpointerError, Closed
from ringzero.core.protocols import CheckpointerCapabilities
from ringzero.core.types import JSON, Checkpoint, PendingWrite

__all__ = ["SqliteCheckpointer"]

SCHEMA_VERSION = 2
_SCHEMA = """
CREATE TABLE IF NOT EXISTS checkpoints (
    thread_id TEXT NOT NULL,
    namespace TEXT NOT NULL,
    id TEXT NOT NULL,
    parent_id TEXT,
    payload BLOB NOT NULL,
    metadata TEXT NOT NULL,
    PRIMARY KEY (thread_id, namespace, id)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS writes (
    thread_id TEXT NOT NULL,
    namespace TEXT NOT NULL,
    checkpoint_id TEXT NOT NULL,
    task_id TEXT NOT NULL,
    idx INTEGER NOT NULL,
    channel TEXT NOT NULL,
    value BLOB NOT NULL,
    task_path TEXT NOT NULL DEFAULT '',
    PRIMARY KEY (thread_id, namespace, checkpoint_id, task_id, idx)
) WITHOUT ROWID;
"""
_SCHEMA_2 = """
CREATE INDEX IF NOT EXISTS checkpoints_run_id ON checkpoints (json_extract(metadata, '$.run_id'))
    WHERE json_extract(metadata, '$.run_id') IS NOT NULL;
""" + MEMORY_SCHEMA
_MIGRATIONS = {0: _SCHEMA + _SCHEMA_2, 1: _SCHEMA_2}
"""What brings a file of each older version to SCHEMA_VERSION (0: a new file)."""

_WRITES = ("(SELECT json_group_array(json_array(w.task_id, w.channel, hex(w.value), w.task_path, w.idx)) "
           "FROM writes w WHERE w.thread_id=c.thread_id AND w.namespace=c.namespace AND w.checkpoint_id=c.id)")
_SELECT = f"SELECT c.thread_id, c.namespace, c.id, c.parent_id, c.payload, c.metadata, {_WRITES} FROM checkpoints c"
"""A checkpoint with its writes, in one statement (the writes as JSON, their values in hex)."""


class _Pending:
    """One writer's statements waiting for the next group commit, and how it ended."""

    __slots__ = ("changed", "error", "statements")

    def __init__(self, statements: Sequence[tuple[str, Sequence[Any]]]) -> None:
        self.statements = statements
        self.error: BaseException | None = None
        self.changed = 0
        """Rows the statements inserted, replaced or deleted (what a claim reads)."""


class SqliteCheckpointer:
    """Durable checkpoints in one SQLite file."""

    capabilities = CheckpointerCapabilities(durable=True, multi_process=True, delete_checkpoints=True, claims=True)

    def __init__(
        self,
        path: str | Path = ".ringzero/state.db",
        *,
        synchronous: Literal["NORMAL", "FULL"] = "NORMAL",
        busy_timeout: float = 30.0,
    ) -> None:
        self.path = Path(path)
        self._synchronous = synchronous
        self._busy_ms = int(busy_timeout * 1000)
        self._db: aiosqlite.Connection | None = None
        self._closed = False
        self._opening = asyncio.Lock()
        self._pending: list[_Pending] = []
        self._pending_lock = threading.Lock()
        self.commits = 0
        """Transactions committed: fewer than writes when concurrent writes were grouped."""

    def __repr__(self) -> str:
        return f"SqliteCheckpointer({str(self.path)!r})"

    @contextmanager
    def _errors(self, doing: str) -> Iterator[None]:
        try:
            yield
        except sqlite3.Error as exc:
            raise CheckpointerError(f"SQLite file {self.path}: {doing} failed: {exc}") from exc

    async def _conn(self) -> aiosqlite.Connection:
        if self._db is not None:
            return self._db
        if self._closed:
            raise Closed(f"{self!r} is closed; open a new SqliteCheckpointer on the same file to go on")
        async with self._opening:
            if self._db is None:
                self._db = await self._open()
        return self._db

    async def _open(self) -> aiosqlite.Connection:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self._errors("opening"):
            pending = aiosqlite.connect(self.path, isolation_level=None)
            pending.daemon = True  # a kernel nobody closed must not keep the interpreter alive
            db = await pending
        try:
            with self._errors("opening"):
                await db.execute(f"PRAGMA busy_timeout={self._busy_ms}")
                await db._execute(self._check_and_migrate, db._conn)  # type: ignore[no-untyped-call]
            with self._errors("preparing"):  # only now that the file is known to be ours
                await self._enable_wal(db)
                await db.execute(f"PRAGMA synchronous={self._synchronous}")
        except BaseException:
            await db.close()
            raise
        return db

    async def _transaction(self, db: aiosqlite.Connection, statements: Sequence[tuple[str, Sequence[Any]]]) -> _Pending:
        """Commit ``(sql, rows)`` pairs atomically, grouped with whatever else is waiting.

        The statements join a shared list, and a job goes onto aiosqlite's thread, which runs
        jobs one at a time in order. The first job to run commits everything waiting in one
        transaction (a savepoint per writer, so that one bad write fails alone); later jobs
        find their writes already done. When this returns, the write is committed, whichever
        event loop it came from.
        """
        item = _Pending(statements)
        with self._pending_lock:
            self._pending.append(item)
        await db._execute(self._commit_pending, db._conn)  # type: ignore[no-untyped-call]  # aiosqlite 0.21
        if item.error is not None:
            raise item.error
        return item

    def _commit_pending(self, conn: sqlite3.Connection) -> None:
        with self._pending_lock:
            batch, self._pending = self._pending, []
        if not batch:
            return  # an earlier job committed ours
        try:
            conn.execute("BEGIN IMMEDIATE")
            for item in batch:
                conn.execute("SAVEPOINT item")
                try:
                    for sql, rows in item.statements:
                        item.changed += conn.executemany(sql, rows).rowcount
                except sqlite3.Error as exc:
                    conn.execute("ROLLBACK TO item")
                    item.error = exc
                conn.execute("RELEASE item")
            conn.execute("COMMIT")
            self.commits += 1
        except BaseException as exc:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            for item in batch:
                item.error = item.error or exc

    async def _enable_wal(self, db: aiosqlite.Connection) -> None:
        """Switch to WAL. Two processes opening a new file at once can make SQLite answer
        "locked" at once, without waiting, so this retries for up to the busy timeout."""
        deadline = time.monotonic() + self._busy_ms / 1000
        while True:
            try:
                await db.execute("PRAGMA journal_mode=WAL")
                return
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) or time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.01)

    def _check_and_migrate(self, conn: sqlite3.Connection) -> None:
        """On aiosqlite's thread, in one write transaction: refuse a file that is not ours or is
        newer, create the schema in a new one. Another process opening the same new file waits
        for this transaction, then finds the schema complete (a crash leaves version 0, no tables)."""
        conn.execute("BEGIN IMMEDIATE")
        try:
            version = int(conn.execute("PRAGMA user_version").fetchone()[0])
            tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
            if version == 0 and tables:
                raise CheckpointerError(
                    f"{self.path} is an SQLite file of another program (tables: {', '.join(sorted(tables))}); "
                    "ringzero will not write to it")
            if version > SCHEMA_VERSION:
                raise CheckpointerError(
                    f"{self.path} has ringzero schema version {version}, newer than this ringzero "
                    f"({SCHEMA_VERSION}); upgrade ringzero to open it")
            if version < SCHEMA_VERSION:
                for statement in filter(str.strip, _MIGRATIONS[version].split(";")):
                    conn.execute(statement)
                if version == 1:
                    move_record_memories(conn)
                conn.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")

    async def put(self, checkpoint: Checkpoint) -> None:
        db = await self._conn()
        row = (checkpoint.thread_id, checkpoint.namespace, checkpoint.id, checkpoint.parent_id,
               checkpoint.payload, json.dumps(dict(checkpoint.metadata)))
        with self._errors("put"):
            await self._transaction(db, [("INSERT OR REPLACE INTO checkpoints VALUES (?, ?, ?, ?, ?, ?)", [row])])

    async def claim(self, checkpoint: Checkpoint) -> bool:
        db = await self._conn()
        row = (checkpoint.thread_id, checkpoint.namespace, checkpoint.id, checkpoint.parent_id,
               checkpoint.payload, json.dumps(dict(checkpoint.metadata)))
        with self._errors("claim"):
            done = await self._transaction(db, [("INSERT OR IGNORE INTO checkpoints VALUES (?, ?, ?, ?, ?, ?)", [row])])
        return done.changed == 1

    async def put_writes(
        self, thread_id: str, namespace: str, checkpoint_id: str, writes: Sequence[PendingWrite]
    ) -> None:
        db = await self._conn()
        rows = [(thread_id, namespace, checkpoint_id, w.task_id, w.idx, w.channel, w.value, w.task_path)
                for w in writes]
        with self._errors("put_writes"):  # a special (negative idx) write replaces, others are kept first
            await self._transaction(db, [
                ("INSERT OR REPLACE INTO writes VALUES (?, ?, ?, ?, ?, ?, ?, ?)", [r for r in rows if r[4] < 0]),
                ("INSERT OR IGNORE INTO writes VALUES (?, ?, ?, ?, ?, ?, ?, ?)", [r for r in rows if r[4] >= 0])])

    async def get(self, thread_id: str, namespace: str = "", checkpoint_id: str | None = None) -> Checkpoint | None:
        db = await self._conn()
        with self._errors("get"):
            if checkpoint_id is None:
                rows = await db.execute_fetchall(
                    f"{_SELECT} WHERE thread_id=? AND namespace=? ORDER BY id DESC LIMIT 1", (thread_id, namespace))
            else:
                rows = await db.execute_fetchall(
                    f"{_SELECT} WHERE thread_id=? AND namespace=? AND id=?", (thread_id, namespace, checkpoint_id))
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
        db = await self._conn()
        pushed = [(f"json_extract(c.metadata, '$.{key}')=?", value) for key, value in pushable(filter)]
        sql, params = list_query(_SELECT, "?", thread_id, namespace, before, pushed)
        if limit is not None and not filter:
            sql += f" LIMIT {int(limit)}"
        with self._errors("list"):
            rows = list(await db.execute_fetchall(sql, params))
        for row in selected(rows, lambda r: json.loads(r[5]), filter, limit):
            yield _checkpoint(row)

    def memory_index(self) -> SqliteMemoryIndex:
        """Long-term memory in this file, searched through its FTS5 index (``ringzero.core.memory``)."""
        return SqliteMemoryIndex(self)

    async def delete_thread(self, thread_id: str) -> None:
        db = await self._conn()
        with self._errors("delete_thread"):
            await self._transaction(db, [("DELETE FROM checkpoints WHERE thread_id=?", [(thread_id,)]),
                                         ("DELETE FROM writes WHERE thread_id=?", [(thread_id,)])])

    async def delete_checkpoints(self, thread_id: str, namespace: str, ids: Sequence[str]) -> None:
        db = await self._conn()
        rows = [(thread_id, namespace, cid) for cid in ids]
        with self._errors("delete_checkpoints"):
            await self._transaction(db, [
                ("DELETE FROM checkpoints WHERE thread_id=? AND namespace=? AND id=?", rows),
                ("DELETE FROM writes WHERE thread_id=? AND namespace=? AND checkpoint_id=?", rows)])

    async def write(self, statements: Sequence[tuple[str, Sequence[Any]]]) -> int:
        """Run ``(sql, rows)`` statements in one transaction (grouped with other writers); the
        number of rows they changed. For the file's other tables (long-term memory)."""
        db = await self._conn()
        with self._errors("writing"):
            return (await self._transaction(db, statements)).changed

    async def read(self, sql: str, params: Sequence[Any]) -> Sequence[Any]:
        """The rows of one query, for the file's other tables."""
        db = await self._conn()
        with self._errors("reading"):
            return list(await db.execute_fetchall(sql, params))

    async def aclose(self) -> None:
        """Close the connection; a later call raises ``Closed``."""
        self._closed = True
        if self._db is not None:
            db, self._db = self._db, None
            await db.close()


def _checkpoint(row: Any) -> Checkpoint:
    thread_id, namespace, cid, parent_id, payload, metadata, writes = row
    return Checkpoint(
        thread_id=thread_id, namespace=namespace, id=cid, parent_id=parent_id, payload=bytes(payload),
        metadata=json.loads(metadata),
        writes=tuple(PendingWrite(t, c, bytes.fromhex(v), p, i) for t, c, v, p, i in json.loads(writes)))
