"""The Checkpointer protocol on the built-in backends, and SQLite's refusals."""

from __future__ import annotations

import re
import sqlite3
from pathlib import Path

import pytest

from ringzero.checkpointers import SqliteCheckpointer
from ringzero.core.errors import CheckpointerError
from ringzero.core.protocols import Checkpointer
from ringzero.core.types import Checkpoint, PendingWrite


def cp(thread: str, cid: str, ns: str = "", **meta: object) -> Checkpoint:
    return Checkpoint(thread_id=thread, namespace=ns, id=cid, payload=cid.encode(), metadata=meta)  # type: ignore[arg-type]


async def test_get_returns_the_latest_or_the_named_checkpoint(checkpointer: Checkpointer) -> None:
    assert await checkpointer.get("t") is None
    for cid in ("001", "003", "002"):
        await checkpointer.put(cp("t", cid))
    latest = await checkpointer.get("t")
    assert latest is not None and latest.id == "003" and latest.payload == b"003"
    named = await checkpointer.get("t", "", "002")
    assert named is not None and named.payload == b"002"
    assert await checkpointer.get("t", "other-namespace") is None


async def test_put_replaces_a_checkpoint_with_the_same_address(checkpointer: Checkpointer) -> None:
    await checkpointer.put(cp("t", "1", step=1))
    await checkpointer.put(Checkpoint("t", "", "1", b"new", metadata={"step": 2}))
    got = await checkpointer.get("t", "", "1")
    assert got is not None and got.payload == b"new" and got.metadata == {"step": 2}


async def test_list_is_newest_first_with_filter_before_and_limit(checkpointer: Checkpointer) -> None:
    for i in range(1, 6):
        await checkpointer.put(cp("t", f"{i:03d}", source="loop" if i % 2 else "input"))
    await checkpointer.put(cp("u", "009"))
    ids = [c.id async for c in checkpointer.list("t")]
    assert ids == ["005", "004", "003", "002", "001"]
    assert [c.id async for c in checkpointer.list("t", filter={"source": "loop"})] == ["005", "003", "001"]
    assert [c.id async for c in checkpointer.list("t", before="004", limit=2)] == ["003", "002"]
    assert [c.id async for c in checkpointer.list(filter={"source": "loop"}, limit=1)] == ["005"]
    assert len([c async for c in checkpointer.list()]) == 6


async def test_writes_come_back_with_their_checkpoint(checkpointer: Checkpointer) -> None:
    await checkpointer.put(cp("t", "1"))
    writes = [PendingWrite("task-a", "messages", b"hello", "", 0), PendingWrite("task-a", "count", b"1", "", 1)]
    await checkpointer.put_writes("t", "", "1", writes)
    await checkpointer.put_writes("t", "", "1", [PendingWrite("task-a", "count", b"2", "", 1)])
    got = await checkpointer.get("t")
    assert got is not None
    assert sorted((w.channel, w.value) for w in got.writes) == [("count", b"2"), ("messages", b"hello")]


async def test_delete_thread_removes_only_that_thread(checkpointer: Checkpointer) -> None:
    await checkpointer.put(cp("t", "1"))
    await checkpointer.put(cp("t", "1", ns="sub"))
    await checkpointer.put_writes("t", "", "1", [PendingWrite("x", "c", b"v")])
    await checkpointer.put(cp("keep", "1"))
    await checkpointer.delete_thread("t")
    assert await checkpointer.get("t") is None and await checkpointer.get("t", "sub") is None
    assert await checkpointer.get("keep") is not None


async def test_sqlite_records_survive_reopening(tmp_path: Path) -> None:
    first = SqliteCheckpointer(tmp_path / "s.db")
    await first.put(cp("t", "1"))
    await first.aclose()
    second = SqliteCheckpointer(tmp_path / "s.db")
    got = await second.get("t")
    assert got is not None and got.payload == b"1"
    await second.aclose()


async def test_sqlite_refuses_a_file_that_is_not_a_database_and_leaves_it_alone(tmp_path: Path) -> None:
    path = tmp_path / "notes.db"
    path.write_bytes(b"these are my notes, not a database" * 100)
    store = SqliteCheckpointer(path)
    with pytest.raises(CheckpointerError, match=re.escape(str(path))):
        await store.get("t")
    assert path.read_bytes().startswith(b"these are my notes")


async def test_sqlite_refuses_another_programs_database(tmp_path: Path) -> None:
    path = tmp_path / "app.db"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE customers (id INTEGER)")
    store = SqliteCheckpointer(path)
    with pytest.raises(CheckpointerError, match=r"another program.*customers"):
        await store.put(cp("t", "1"))
    with sqlite3.connect(path) as conn:
        tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master")]
    assert tables == ["customers"]


async def test_sqlite_refuses_a_newer_schema_version(tmp_path: Path) -> None:
    path = tmp_path / "future.db"
    with sqlite3.connect(path) as conn:
        conn.execute("PRAGMA user_version=99")
    with pytest.raises(CheckpointerError, match="schema version 99"):
        await SqliteCheckpointer(path).get("t")


async def test_delete_checkpoints_removes_exactly_those_with_their_writes(checkpointer: Checkpointer) -> None:
    assert checkpointer.capabilities.delete_checkpoints
    for cid in ("1", "2", "3"):
        await checkpointer.put(cp("t", cid))
        await checkpointer.put_writes("t", "", cid, [PendingWrite("task", "c", cid.encode())])
    await checkpointer.delete_checkpoints("t", "", ["1", "3"])
    assert [c.id async for c in checkpointer.list("t")] == ["2"]
    kept = await checkpointer.get("t", "", "2")
    assert kept is not None and [w.value for w in kept.writes] == [b"2"]
    await checkpointer.put(cp("t", "1"))  # a re-used id starts with no stale writes
    again = await checkpointer.get("t", "", "1")
    assert again is not None and again.writes == ()
