"""Long-term memory in a PostgresCheckpointer's database: a table with a ``tsvector`` column
and a GIN index on it (PostgreSQL's full-text search, the ``simple`` configuration over
ringzero's own words), so a search reads only the rows that hold a word of the query, ranked
by ``ts_rank``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, Protocol

from ringzero.core.contract.types import JSON
from ringzero.core.support.memory import RECORD_PREFIX, Memory, memory_from_row, newest_memories

__all__ = ["MEMORY_SCHEMA", "Database", "PostgresMemoryIndex", "move_record_memories"]


class Database(Protocol):
    """What the index asks of the checkpointer it lives in (``PostgresCheckpointer``)."""

    async def read(self, sql: str, params: Sequence[Any], doing: str = "reading") -> Sequence[Any]:
        """The rows ``sql`` returns (a statement that writes and returns rows included)."""

MEMORY_SCHEMA = """
CREATE TABLE IF NOT EXISTS ringzero_memories (
    namespace TEXT NOT NULL,
    key TEXT NOT NULL,
    value TEXT NOT NULL,
    created_at DOUBLE PRECISION NOT NULL,
    updated_at DOUBLE PRECISION NOT NULL,
    words TSVECTOR NOT NULL,
    PRIMARY KEY (namespace, key)
);
CREATE INDEX IF NOT EXISTS ringzero_memories_words ON ringzero_memories USING GIN (words)
"""

_COLUMNS = "namespace, key, value, created_at, updated_at"
_UPSERT = ("INSERT INTO ringzero_memories VALUES (%s, %s, %s, %s, %s, to_tsvector('simple', %s)) "
           "ON CONFLICT (namespace, key) DO UPDATE SET value=EXCLUDED.value, updated_at=EXCLUDED.updated_at, "
           "words=EXCLUDED.words")


def _below(namespace: str, prefix: bool) -> tuple[str, list[Any]]:
    """The SQL condition for ``namespace``, or it and those below it."""
    if not prefix:
        return "namespace=%s", [namespace]
    if not namespace:
        return "TRUE", []
    return "(namespace=%s OR starts_with(namespace, %s))", [namespace, namespace + "."]


class PostgresMemoryIndex:
    """A ``MemoryIndex`` in a PostgresCheckpointer's database."""

    def __init__(self, checkpointer: Database) -> None:
        self.checkpointer = checkpointer

    async def put(self, namespace: str, key: str, value: JSON, indexed_words: str, now: float) -> Memory:
        rows = await self.checkpointer.read(
            f"{_UPSERT} RETURNING {_COLUMNS}", (namespace, key, json.dumps(value), now, now, indexed_words))
        return memory_from_row(rows[0])

    async def get(self, namespace: str, key: str) -> Memory | None:
        rows = await self.checkpointer.read(
            f"SELECT {_COLUMNS} FROM ringzero_memories WHERE namespace=%s AND key=%s", (namespace, key))
        return memory_from_row(rows[0]) if rows else None

    async def delete(self, namespace: str, key: str) -> bool:
        rows = await self.checkpointer.read(
            "DELETE FROM ringzero_memories WHERE namespace=%s AND key=%s RETURNING key", (namespace, key))
        return bool(rows)

    async def items(self, namespace: str, *, prefix: bool = False) -> list[Memory]:
        where, params = _below(namespace, prefix)
        rows = await self.checkpointer.read(
            f"SELECT {_COLUMNS} FROM ringzero_memories WHERE {where} ORDER BY updated_at DESC, key", params)
        return [memory_from_row(row) for row in rows]

    async def namespaces(self) -> list[str]:
        rows = await self.checkpointer.read("SELECT DISTINCT namespace FROM ringzero_memories ORDER BY namespace", ())
        return [row[0] for row in rows]

    async def search(self, namespace: str, query_words: Sequence[str], limit: int | None, *,
                     prefix: bool = False) -> list[Memory]:
        if not query_words:
            return []
        where, params = _below(namespace, prefix)
        rows = await self.checkpointer.read(
            f"SELECT {_COLUMNS}, ts_rank(words, query) AS score FROM ringzero_memories, "
            f"to_tsquery('simple', %s) AS query WHERE words @@ query AND {where} "
            "ORDER BY score DESC, namespace, key LIMIT %s",
            [" | ".join(query_words), *params, limit])
        return [memory_from_row(row, float(row[5])) for row in rows]


async def move_record_memories(conn: Any) -> None:
    """Move the memories an older ringzero kept as checkpoint records into the memory table
    (inside the migration's transaction: all of them move, or none)."""
    bounds = (RECORD_PREFIX, RECORD_PREFIX[:-1] + ";")
    cursor = await conn.execute("SELECT thread_id, namespace, id, payload FROM ringzero_checkpoints "
                                "WHERE thread_id>=%s AND thread_id<%s", bounds)
    rows = await cursor.fetchall()
    for memory in newest_memories((t, k, i, bytes(p)) for t, k, i, p in rows):
        await conn.execute(_UPSERT, (memory.namespace, memory.key, json.dumps(memory.value), memory.created_at,
                                     memory.updated_at, memory.indexed_words))
    await conn.execute("DELETE FROM ringzero_checkpoints WHERE thread_id>=%s AND thread_id<%s", bounds)
