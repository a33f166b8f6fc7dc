"""SqliteCheckpointer: the embedded default, one SQLite file through aiosqlite.

WAL mode, so readers never block the writer and a record whose ``put`` returned survives
the host process being killed (``synchronous=NORMAL`` is durable against a process crash;
pass ``synchronous="FULL"`` to survive power loss as well). Several kernels in separate
processes may share one file: SQLite serialises their writes and ``busy_timeout`` makes
them wait for each other instead of failing. The schema carries its version in
``PRAGMA user_version``; a file of another schema, or not SQLite at all, is refused with
its path in the error and left untouched.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal

import aiosqlite

from ringzero.checkpointers._filters import matches
from ringzero.core.errors import CheckpointerError
from ringzero.core.protocols import CheckpointerCapabilities
from ringzero.core.types import JSON, Checkpoint, PendingWrite

__all__ = ["SqliteCheckpointer"]

SCHEMA_VERSION = 1
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


class SqliteCheckpointer:
    """Durable checkpoints in one SQLite file."""

    capabilities = CheckpointerCapabilities(durable=True, multi_process=True, delete_checkpoints=True)

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
        self._opening = asyncio.Lock()

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
                await db.execute("PRAGMA journal_mode=WAL")
                await db.execute(f"PRAGMA synchronous={self._synchronous}")
        except BaseException:
            await db.close()
            raise
        return db

    @staticmethod
    async def _transaction(db: aiosqlite.Connection, statements: list[tuple[str, list[Any]]]) -> None:
        """Run ``(sql, rows)`` pairs as one transaction, as a single job on aiosqlite's thread.

        One job cannot interleave with another coroutine's statements on the shared
        connection (separate BEGIN/COMMIT awaits could), whichever event loop they come from.
        """
        def work(conn: sqlite3.Connection) -> None:
            conn.execute("BEGIN IMMEDIATE")
            try:
                for sql, rows in statements:
                    if rows:
                        conn.executemany(sql, rows)
                    else:  # DDL and PRAGMA: executemany takes only DML on older Pythons
                        conn.execute(sql)
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")

        await db._execute(work, db._conn)  # type: ignore[no-untyped-call]  # aiosqlite 0.21's job queue (pinned)

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
            if version < SCHEMA_VERSION:  # migrations from older versions go here, in order
                for statement in filter(str.strip, _SCHEMA.split(";")):
                    conn.execute(statement)
                conn.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")

    async def put(self, checkpoint: Checkpoint) -> None:
        db = await self._conn()
        with self._errors("put"):
            await db.execute(
                "INSERT OR REPLACE INTO checkpoints VALUES (?, ?, ?, ?, ?, ?)",
                (checkpoint.thread_id, checkpoint.namespace, checkpoint.id, checkpoint.parent_id,
                 checkpoint.payload, json.dumps(dict(checkpoint.metadata))),
            )

    async def put_writes(
        self, thread_id: str, namespace: str, checkpoint_id: str, writes: Sequence[PendingWrite]
    ) -> None:
        db = await self._conn()
        rows = [
            (thread_id, namespace, checkpoint_id, w.task_id, w.idx, w.channel, w.value, w.task_path) for w in writes
        ]
        with self._errors("put_writes"):
            await self._transaction(db, [("INSERT OR REPLACE INTO writes VALUES (?, ?, ?, ?, ?, ?, ?, ?)", rows)])

    async def get(self, thread_id: str, namespace: str = "", checkpoint_id: str | None = None) -> Checkpoint | None:
        db = await self._conn()
        with self._errors("get"):
            if checkpoint_id is None:
                rows = await db.execute_fetchall(
                    "SELECT * FROM checkpoints WHERE thread_id=? AND namespace=? ORDER BY id DESC LIMIT 1",
                    (thread_id, namespace),
                )
            else:
                rows = await db.execute_fetchall(
                    "SELECT * FROM checkpoints WHERE thread_id=? AND namespace=? AND id=?",
                    (thread_id, namespace, checkpoint_id),
                )
            rows = list(rows)
            return None if not rows else await self._with_writes(db, rows[0])

    async def _with_writes(self, db: aiosqlite.Connection, row: Any) -> Checkpoint:
        thread_id, namespace, cid, parent_id, payload, metadata = row
        writes = await db.execute_fetchall(
            "SELECT task_id, channel, value, task_path, idx FROM writes "
            "WHERE thread_id=? AND namespace=? AND checkpoint_id=? ORDER BY task_id, idx",
            (thread_id, namespace, cid),
        )
        return Checkpoint(
            thread_id=thread_id, namespace=namespace, id=cid, parent_id=parent_id, payload=bytes(payload),
            metadata=json.loads(metadata), writes=tuple(PendingWrite(*w) for w in writes),
        )

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
        where, params = [], []
        for column, value in (("thread_id", thread_id), ("namespace", namespace)):
            if value is not None:
                where.append(f"{column}=?")
                params.append(value)
        if before is not None:
            where.append("id<?")
            params.append(before)
        sql = "SELECT * FROM checkpoints" + (" WHERE " + " AND ".join(where) if where else "")
        sql += " ORDER BY id DESC, thread_id DESC, namespace DESC"
        if limit is not None and not filter:
            sql += f" LIMIT {int(limit)}"
        with self._errors("list"):
            rows = await db.execute_fetchall(sql, params)
            found = 0
            for row in rows:
                if filter and not matches(json.loads(row[5]), filter):
                    continue
                yield await self._with_writes(db, row)
                found += 1
                if limit is not None and found >= limit:
                    return

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

    async def aclose(self) -> None:
        """Close the connection; a later call opens it again."""
        if self._db is not None:
            db, self._db = self._db, None
            await db.close()
