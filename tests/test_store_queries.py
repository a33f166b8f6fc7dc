"""Stores answer queries, not scans (issue 13): memory search and namespaces through an index,
``list`` in one statement, LangGraph writes without a read first, per-run deletes by index, and
an older SQLite file's memories moved into the index."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, closing, contextmanager
from pathlib import Path
from typing import Any

from langgraph.checkpoint.base import empty_checkpoint

from ringzero import Kernel
from ringzero.adapters.langgraph import KernelSaver
from ringzero.checkpointers import SqliteCheckpointer
from ringzero.checkpointers.sqlite.schema import SCHEMA_1
from ringzero.compat.checkpointer import cp
from ringzero.core.contract.protocols import Checkpointer
from ringzero.core.contract.types import PendingWrite
from ringzero.core.support.memory import MemoryStore


@contextmanager
def counting_reads(checkpointer: Checkpointer) -> Iterator[dict[str, int]]:
    """Count the ``get``/``list`` calls made on this (real) checkpointer while inside."""
    counts = {"get": 0, "list": 0}
    originals: dict[str, Callable[..., Any]] = {name: getattr(checkpointer, name) for name in counts}

    def counted(name: str) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            counts[name] += 1
            return originals[name](*args, **kwargs)
        return call

    for name in counts:
        setattr(checkpointer, name, counted(name))
    try:
        yield counts
    finally:
        for name in counts:
            delattr(checkpointer, name)


async def remember(ctx: Any, topic: str) -> None:
    await ctx.memory.remember(topic, f"notes about {topic}")


async def test_memory_search_and_namespaces_do_not_read_the_process_records(checkpointer: Checkpointer) -> None:
    async with Kernel(checkpointer=checkpointer) as kernel:
        for i in range(40):
            await (await kernel.spawn(remember, f"topic{i}", name=f"agent{i % 4}")).wait()
        await kernel.memory.put("team", "deadline", "ship the release on Friday")
        await kernel.memory.put("team", "colour", "the logo is teal")
        with counting_reads(checkpointer) as reads:
            names = await kernel.memory.namespaces()
            found = await kernel.memory.search("team", "when do we ship")
            listed = await kernel.memory.items("team")
    assert names == ["agent0", "agent1", "agent2", "agent3", "team"]
    assert [m.key for m in found] == ["deadline"] and found[0].score is not None and found[0].score > 0
    assert sorted(m.key for m in listed) == ["colour", "deadline"]
    assert reads == {"get": 0, "list": 0}, "memory went through the checkpoint records instead of its index"


@asynccontextmanager
async def sql_trace(store: SqliteCheckpointer) -> AsyncIterator[list[str]]:
    """Every statement the store's connection runs while inside (expanded, with its values)."""
    db = store.writer.db
    assert db is not None
    statements: list[str] = []
    await db.call(lambda conn: conn.set_trace_callback(statements.append))  # on the waiting thread
    try:
        yield statements
    finally:
        await db.call(lambda conn: conn.set_trace_callback(None))


async def test_a_sqlite_list_is_one_statement_however_many_checkpoints(tmp_path: Path) -> None:
    store = SqliteCheckpointer(tmp_path / "s.db")
    for i in range(40):
        await store.put(cp("t", f"{i:03d}", step=i))
        await store.put_writes("t", "", f"{i:03d}", [PendingWrite("task", "c", f"{i}".encode(), "", 0)])
    async with sql_trace(store) as statements:
        listed = [c async for c in store.list("t")]
    assert [c.id for c in listed] == [f"{i:03d}" for i in reversed(range(40))]
    assert [c.writes[0].value for c in listed] == [f"{i}".encode() for i in reversed(range(40))]
    assert len([s for s in statements if s.lstrip().upper().startswith("SELECT")]) == 1, statements
    await store.aclose()


async def test_langgraph_writes_are_stored_without_reading_the_checkpoint(checkpointer: Checkpointer) -> None:
    saver = KernelSaver(checkpointer)
    config = await saver.aput({"configurable": {"thread_id": "t", "checkpoint_ns": ""}}, empty_checkpoint(), {}, {})
    with counting_reads(checkpointer) as reads:
        await saver.aput_writes(config, [("answer", "first"), ("__error__", "boom")], "task-1")
        await saver.aput_writes(config, [("answer", "retried"), ("__error__", "boom again")], "task-1")
    assert reads == {"get": 0, "list": 0}
    stored = await saver.aget_tuple(config)
    assert stored is not None
    # LangGraph's rule: an ordinary write is kept as first recorded, a special channel replaced.
    assert sorted(stored.pending_writes or []) == [("task-1", "__error__", "boom again"),
                                                   ("task-1", "answer", "first")]
    await saver.aclose()


async def test_deleting_a_langgraph_run_is_served_by_the_run_id_index(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    store = SqliteCheckpointer(path)
    for i in range(30):
        await store.put(cp(f"thread{i % 3}", f"{i:03d}", run_id=f"run{i % 5}"))
    saver = KernelSaver(store)
    async with sql_trace(store) as statements:
        await saver.adelete_for_runs(["run2"])
    assert sorted([c.metadata["run_id"] async for c in store.list()]) == sorted(
        f"run{i % 5}" for i in range(30) if i % 5 != 2)
    lookups = [s for s in statements if s.lstrip().upper().startswith("SELECT") and "run2" in s]
    assert lookups, statements
    with closing(sqlite3.connect(path)) as conn, conn:  # closed, not only committed
        plan = " ".join(str(row) for row in conn.execute("EXPLAIN QUERY PLAN " + lookups[0]))
    assert "checkpoints_run_id" in plan, plan
    await saver.aclose()
    await store.aclose()


async def test_an_older_sqlite_files_memories_move_into_the_index(tmp_path: Path) -> None:
    """A file written by ringzero's schema 1 kept memories as checkpoint records (newest record
    of a key wins, a tombstone for a forgotten key); opening it moves them into the index."""
    path = tmp_path / "old.db"
    with closing(sqlite3.connect(path)) as conn, conn:  # closed, not only committed
        conn.executescript(SCHEMA_1)
        conn.execute("PRAGMA user_version=1")

        def record(key: str, record_id: str, body: dict[str, Any]) -> None:
            conn.execute("INSERT INTO checkpoints VALUES (?, ?, ?, NULL, ?, '{}')",
                         ("ringzero-memory:agent", key, record_id, json.dumps(body).encode()))

        record("food", "001", {"value": "ramen", "created_at": 1.0, "updated_at": 1.0})
        record("food", "002", {"value": "udon noodles", "created_at": 1.0, "updated_at": 2.0})
        record("pet", "001", {"value": "a cat", "created_at": 1.5, "updated_at": 1.5})
        record("pet", "002", {"deleted": True})
        conn.execute("INSERT INTO checkpoints VALUES ('kept', '', '1', NULL, x'00', '{}')")
    store = SqliteCheckpointer(path)
    memory = MemoryStore(store)
    assert [(m.key, m.value, m.created_at) for m in await memory.items("agent")] == [("food", "udon noodles", 1.0)]
    assert [m.key for m in await memory.search("agent", "noodles")] == ["food"]
    assert [c.thread_id async for c in store.list()] == ["kept"]  # the old records are gone, the rest kept
    await store.aclose()
    with closing(sqlite3.connect(path)) as conn, conn:  # closed, not only committed
        assert conn.execute("PRAGMA user_version").fetchone()[0] == 2
