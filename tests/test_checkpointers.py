"""The built-in checkpointers pass the Checkpointer conformance kit; SQLite's own guarantees."""

from __future__ import annotations

import asyncio
import re
import sqlite3
from contextlib import closing
from pathlib import Path

import pytest

from ringzero.checkpointers import SqliteCheckpointer
from ringzero.compat.checkpointer import CheckpointerConformance, cp
from ringzero.core.contract.errors import CheckpointerError, Closed
from ringzero.core.contract.types import Checkpoint


async def test_a_closed_sqlite_checkpointer_refuses_instead_of_reopening(tmp_path: Path) -> None:
    store = SqliteCheckpointer(tmp_path / "s.db")
    await store.put(cp("t", "1"))
    await store.aclose()
    with pytest.raises(Closed, match="is closed"):
        await store.get("t")
    with pytest.raises(Closed):
        await store.put(cp("t", "2"))
    await store.aclose()  # closing twice is fine
    again = SqliteCheckpointer(tmp_path / "s.db")
    got = await again.get("t")
    assert got is not None and got.payload == b"1"  # nothing was written after the close
    await again.aclose()


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
    with closing(sqlite3.connect(path)) as conn, conn:  # closed, not only committed
        conn.execute("CREATE TABLE customers (id INTEGER)")
    store = SqliteCheckpointer(path)
    with pytest.raises(CheckpointerError, match=r"another program.*customers"):
        await store.put(cp("t", "1"))
    with closing(sqlite3.connect(path)) as conn, conn:  # closed, not only committed
        tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master")]
    assert tables == ["customers"]


async def test_sqlite_refuses_a_newer_schema_version(tmp_path: Path) -> None:
    path = tmp_path / "future.db"
    with closing(sqlite3.connect(path)) as conn, conn:  # closed, not only committed
        conn.execute("PRAGMA user_version=99")
    with pytest.raises(CheckpointerError, match="schema version 99"):
        await SqliteCheckpointer(path).get("t")


class TestBuiltinCheckpointers(CheckpointerConformance):
    """The kit, with the ``checkpointer`` fixture from conftest.py: memory and SQLite."""


@pytest.mark.parametrize("alongside", ["alone", "with another writer in the same commit"])
async def test_sqlite_put_many_stores_all_or_none(tmp_path: Path, alongside: str) -> None:
    store = SqliteCheckpointer(tmp_path / "s.db")
    await store.put(cp("open", "1"))  # open, so that nothing below waits before it writes
    bad = Checkpoint("t", "", "2", {"not": "bytes"})  # type: ignore[arg-type]
    others = []
    if alongside != "alone":  # started in the same turn, so that both join one group commit
        others.append(asyncio.ensure_future(store.put(cp("other", "1"))))
    with pytest.raises(CheckpointerError, match="put_many"):
        await store.put_many([cp("t", "1"), bad, cp("t", "3")])
    await asyncio.gather(*others)
    assert [c.id async for c in store.list("t")] == []  # not the rows before or after the bad one
    if others:
        assert await store.get("other") is not None  # the other writer's commit went through
    await store.put_many([cp("t", "1"), cp("t", "3")])
    assert [c.id async for c in store.list("t")] == ["3", "1"]
    await store.aclose()
