"""The SQLite file's schema: its tables, their migrations, and how a checkpoint is a row.

The schema carries its version in ``PRAGMA user_version``; a file of another schema, or not
SQLite at all, is refused with its path in the error and left untouched.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ringzero.checkpointers.sqlite.log import FOLDED_SCHEMA, Row
from ringzero.checkpointers.sqlite.memory import MEMORY_SCHEMA, move_record_memories
from ringzero.core.contract.errors import CheckpointerError
from ringzero.core.contract.types import Checkpoint, PendingWrite, json_encoder

__all__ = ["SCHEMA_VERSION", "SELECT", "check_and_migrate", "checkpoint_of", "checkpoint_row", "write_rows"]

SCHEMA_VERSION = 2
"""The schema this ringzero writes; a file of a newer one is refused."""
PAGE_SIZE = 8192
"""Bytes a page of a file ringzero creates (SQLite's default is 4,096; a file made before keeps
its own). The tables are WITHOUT ROWID b-trees, whose rows keep at most about a quarter of a
page in the page and spill the rest to overflow pages of their own: with 4 KiB pages, a row of
1 to 4 KiB (a chat message, a pending write, a checkpoint with its input) took a whole 4 KiB
overflow page for its last kilobyte or two. With 8 KiB pages such rows stay in their pages: a
LangGraph chat's file is half the size (``benchmarks/chat_history.py``)."""
SCHEMA_1 = """
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
SCHEMA_2_ADDS = """
CREATE INDEX IF NOT EXISTS checkpoints_run_id ON checkpoints (json_extract(metadata, '$.run_id'))
    WHERE json_extract(metadata, '$.run_id') IS NOT NULL;
""" + MEMORY_SCHEMA
_MIGRATIONS = {0: SCHEMA_1 + SCHEMA_2_ADDS, 1: SCHEMA_2_ADDS}
"""What brings a file of each older version to SCHEMA_VERSION (0: a new file)."""

_WRITES = ("(SELECT json_group_array(json_array(w.task_id, w.channel, hex(w.value), w.task_path, w.idx)) "
           "FROM writes w WHERE w.thread_id=c.thread_id AND w.namespace=c.namespace AND w.checkpoint_id=c.id)")
SELECT = f"SELECT c.thread_id, c.namespace, c.id, c.parent_id, c.payload, c.metadata, {_WRITES} FROM checkpoints c"
"""A checkpoint with its writes, in one statement (the writes as JSON, their values in hex)."""


_metadata_json = json_encoder()
"""Metadata as compact JSON, through the C encoder directly (``json_encoder``): a microsecond
less than ``json.dumps`` for each of the rows a process writes at every step."""


def checkpoint_row(checkpoint: Checkpoint) -> Row:
    """``checkpoint`` as a row of the ``checkpoints`` table."""
    metadata = checkpoint.metadata
    return (checkpoint.thread_id, checkpoint.namespace, checkpoint.id, checkpoint.parent_id, checkpoint.payload,
            _metadata_json(metadata if type(metadata) is dict else dict(metadata)) if metadata else "{}")


def write_rows(thread_id: str, namespace: str, checkpoint_id: str, writes: Sequence[PendingWrite]) -> list[Row]:
    """``writes`` as rows of the ``writes`` table."""
    return [(thread_id, namespace, checkpoint_id, w.task_id, w.idx, w.channel, w.value, w.task_path) for w in writes]


def check_and_migrate(conn: sqlite3.Connection, path: Path) -> None:
    """On the file's waiting thread, in one write transaction: refuse a file that is not ours or is
    newer, create the schema in a new one. Another process opening the same new file waits
    for this transaction, then finds the schema complete (a crash leaves version 0, no tables)."""
    conn.execute(f"PRAGMA page_size={PAGE_SIZE}")  # takes effect in a new file only (no page written yet)
    conn.execute("BEGIN IMMEDIATE")
    try:
        version = int(conn.execute("PRAGMA user_version").fetchone()[0])
        tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        if version == 0 and tables:
            raise CheckpointerError(
                f"{path} is an SQLite file of another program (tables: {', '.join(sorted(tables))}); "
                "ringzero will not write to it")
        if version > SCHEMA_VERSION:
            raise CheckpointerError(
                f"{path} has ringzero schema version {version}, newer than this ringzero "
                f"({SCHEMA_VERSION}); upgrade ringzero to open it")
        if version < SCHEMA_VERSION:
            for statement in filter(str.strip, _MIGRATIONS[version].split(";")):
                conn.execute(statement)
            if version == 1:
                move_record_memories(conn)
            conn.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
        conn.execute(FOLDED_SCHEMA)  # added within version 2: older ringzero ignores it
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")


def checkpoint_of(row: Any) -> Checkpoint:
    """The checkpoint of a row ``SELECT`` read."""
    thread_id, namespace, cid, parent_id, payload, metadata, writes = row
    return Checkpoint(
        thread_id=thread_id, namespace=namespace, id=cid, parent_id=parent_id, payload=bytes(payload),
        metadata=json.loads(metadata),
        writes=tuple(PendingWrite(t, c, bytes.fromhex(v), p, i) for t, c, v, p, i in json.loads(writes)))
