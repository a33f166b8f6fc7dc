"""Long-term memory in a SqliteCheckpointer's file: a table, and an FTS5 index over its words.

Each memory is a row of ``memories``; its words (``ringzero.core.support.ranking.words``) are a row of
the FTS5 table ``memory_words`` with the same rowid, beside a token naming its namespace, so a
search in one namespace is one FTS5 query (``scope:<token> AND words:(w1 OR w2 ...)``) ranked
by FTS5's own BM25. Writes go through the checkpointer's group commit, so a memory and its
index row are written in one transaction.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
from collections.abc import Sequence
from typing import Any, Protocol

from ringzero.core.contract.types import JSON
from ringzero.core.support.memory import RECORD_PREFIX, Memory, memory_from_row, newest_memories

__all__ = ["MEMORY_SCHEMA", "Database", "SqliteMemoryIndex", "move_record_memories"]


class Database(Protocol):
    """What the index asks of the checkpointer whose file it lives in (``SqliteCheckpointer``)."""

    async def write(self, statements: Sequence[tuple[str, Sequence[Any]]]) -> int:
        """Run ``statements`` in one transaction; the rows they changed."""

    async def read(self, sql: str, params: Sequence[Any]) -> Sequence[Any]:
        """The rows ``sql`` returns."""

MEMORY_SCHEMA = """
CREATE TABLE IF NOT EXISTS memories (
    rowid INTEGER PRIMARY KEY,
    namespace TEXT NOT NULL,
    key TEXT NOT NULL,
    value TEXT NOT NULL,
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL,
    UNIQUE (namespace, key)
);
CREATE VIRTUAL TABLE IF NOT EXISTS memory_words USING fts5(scope, words, tokenize='unicode61');
"""

_COLUMNS = "m.namespace, m.key, m.value, m.created_at, m.updated_at"
_UPSERT = ("INSERT INTO memories (namespace, key, value, created_at, updated_at) VALUES (?, ?, ?, ?, ?) "
           "ON CONFLICT (namespace, key) DO UPDATE SET value=excluded.value, updated_at=excluded.updated_at")
_UNINDEX = "DELETE FROM memory_words WHERE rowid=(SELECT rowid FROM memories WHERE namespace=? AND key=?)"
_INDEX = "INSERT INTO memory_words (rowid, scope, words) SELECT rowid, ?, ? FROM memories WHERE namespace=? AND key=?"


def _scope(namespace: str) -> str:
    """One FTS5 token that stands for the namespace (any string: dots, spaces, quotes)."""
    return "n" + hashlib.sha1(namespace.encode()).hexdigest()[:24]


def _below(namespace: str, prefix: bool) -> tuple[str, list[Any]]:
    """The SQL condition (on ``m.namespace``) for ``namespace``, or it and those below it."""
    if not prefix:
        return "m.namespace=?", [namespace]
    if not namespace:
        return "1", []
    return "(m.namespace=? OR (m.namespace>? AND m.namespace<?))", [namespace, namespace + ".", namespace + "/"]


class SqliteMemoryIndex:
    """A ``MemoryIndex`` in a SqliteCheckpointer's file."""

    def __init__(self, checkpointer: Database) -> None:
        self.checkpointer = checkpointer

    async def put(self, namespace: str, key: str, value: JSON, indexed_words: str, now: float) -> Memory:
        await self.checkpointer.write([
            (_UPSERT, [(namespace, key, json.dumps(value), now, now)]),
            (_UNINDEX, [(namespace, key)]),
            (_INDEX, [(_scope(namespace), indexed_words, namespace, key)]),
        ])
        stored = await self.get(namespace, key)
        assert stored is not None
        return stored

    async def get(self, namespace: str, key: str) -> Memory | None:
        rows = await self.checkpointer.read(f"SELECT {_COLUMNS} FROM memories m WHERE namespace=? AND key=?",
                                            (namespace, key))
        return memory_from_row(rows[0]) if rows else None

    async def delete(self, namespace: str, key: str) -> bool:
        changed = await self.checkpointer.write([
            (_UNINDEX, [(namespace, key)]),
            ("DELETE FROM memories WHERE namespace=? AND key=?", [(namespace, key)]),
        ])
        return changed > 0

    async def items(self, namespace: str, *, prefix: bool = False) -> list[Memory]:
        where, params = _below(namespace, prefix)
        rows = await self.checkpointer.read(
            f"SELECT {_COLUMNS} FROM memories m WHERE {where} ORDER BY updated_at DESC, rowid DESC", params)
        return [memory_from_row(row) for row in rows]

    async def namespaces(self) -> list[str]:
        return [row[0] for row in await self.checkpointer.read("SELECT DISTINCT namespace FROM memories "
                                                               "ORDER BY namespace", ())]

    async def search(self, namespace: str, query_words: Sequence[str], limit: int | None, *,
                     prefix: bool = False) -> list[Memory]:
        if not query_words:
            return []
        wanted = "words:(" + " OR ".join(f'"{w}"' for w in query_words) + ")"
        where, params = _below(namespace, prefix) if prefix else ("1", [])
        if not prefix:
            wanted = f"scope:{_scope(namespace)} AND {wanted}"
        rows = await self.checkpointer.read(
            f"SELECT {_COLUMNS}, -bm25(memory_words, 0.0, 1.0) AS score FROM memory_words "
            f"JOIN memories m ON m.rowid = memory_words.rowid WHERE memory_words MATCH ? AND {where} "
            f"ORDER BY score DESC, m.rowid LIMIT ?", [wanted, *params, -1 if limit is None else limit])
        return [memory_from_row(row, row[5]) for row in rows]


def move_record_memories(conn: sqlite3.Connection) -> None:
    """Move the memories an older ringzero kept as checkpoint records into the memory table
    (inside the migration's transaction: all of them move, or none)."""
    bounds = (RECORD_PREFIX, RECORD_PREFIX[:-1] + ";")
    rows = conn.execute("SELECT thread_id, namespace, id, payload FROM checkpoints WHERE thread_id>=? AND "
                        "thread_id<?", bounds).fetchall()
    for memory in newest_memories((t, k, i, bytes(p)) for t, k, i, p in rows):
        conn.execute(_UPSERT, (memory.namespace, memory.key, json.dumps(memory.value), memory.created_at,
                               memory.updated_at))
        conn.execute(_INDEX, (_scope(memory.namespace), memory.indexed_words, memory.namespace, memory.key))
    conn.execute("DELETE FROM checkpoints WHERE thread_id>=? AND thread_id<?", bounds)
