"""Group commit: the writes of one turn of the loop committed in one transaction.

A ``Pending`` is one writer's statements waiting for the next commit; ``write`` commits a batch
of them on a connection (one autocommit statement for one row, else one transaction, and a
savepoint per writer only once a write of the batch failed), and ``settle`` wakes each writer on
its own loop. The same functions commit on the loop's thread and on the waiting thread.
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
from collections.abc import Sequence
from contextlib import suppress
from pathlib import Path
from typing import Any

from ringzero.checkpointers.sqlite.log import Entry, fold_statements

__all__ = ["Fold", "Pending", "Turns", "busy", "identity", "settle", "write"]


class Pending:
    """One writer's statements waiting for the next group commit, and how it ended."""

    __slots__ = ("changed", "error", "future", "statements")

    def __init__(self, statements: Sequence[tuple[str, Sequence[Any]]], future: asyncio.Future[None] | None) -> None:
        self.statements = statements
        self.future = future
        """Done once the statements are committed (or failed: ``error``); None for a write
        committed at once, which nobody waits for."""
        self.error: BaseException | None = None
        self.changed = 0
        """Rows the statements inserted, replaced or deleted (what a claim reads)."""

    def fail(self, error: BaseException | None, *, unless_failed: bool = False) -> None:
        """It failed with ``error``, where there is one (``unless_failed``: only where no error is
        set yet)."""
        if error is not None and (not unless_failed or self.error is None):
            self.error = error

    def wait_for_commit(self) -> asyncio.Future[None]:
        """Its ``future``, made now on the running loop: someone waits for the commit."""
        self.future = asyncio.get_running_loop().create_future()
        return self.future


class Fold(Pending):
    """A fold of the append log: the rows it takes from the line, to put back if it fails, and
    whether its end was seen to."""

    __slots__ = ("entries", "seen")

    def __init__(self, entries: list[Entry], name: str, seq: int) -> None:
        super().__init__(fold_statements(entries, name, seq), None)
        self.entries = entries
        self.seen = False

    def see_to(self) -> bool:
        """Mark its end as seen to; whether it was already."""
        seen, self.seen = self.seen, True
        return seen


def write(conn: sqlite3.Connection, batch: Sequence[Pending]) -> bool:
    """Run ``batch`` as one transaction on ``conn`` and commit; whether it committed. Raises
    SQLite's "locked" error, touching nothing, when another connection holds the write lock
    (longer than ``conn``'s busy timeout); any other error goes to the writes it hit.

    One write of one row is one autocommit statement, SQLite's cheapest transaction. Several
    run in one transaction with no savepoints; if one fails, that is rolled back and the batch
    runs again with a savepoint per writer (``_write_each_alone``)."""
    if len(batch) == 1:
        statements = [(sql, rows) for sql, rows in batch[0].statements if rows]
        if len(statements) == 1 and len(statements[0][1]) == 1:
            sql, rows = statements[0]
            try:
                batch[0].changed = conn.execute(sql, rows[0]).rowcount
            except Exception as exc:
                if busy(exc):
                    raise
                batch[0].error = exc
                return False
            return True
    conn.execute("BEGIN IMMEDIATE")
    try:
        for item in batch:
            item.changed = _run(conn, item)
    except sqlite3.Error as exc:
        if len(batch) == 1:
            return _failed(conn, batch, exc)
        conn.execute("ROLLBACK")
        return _write_each_alone(conn, batch)
    except BaseException as exc:
        return _failed(conn, batch, exc)
    return _commit(conn, batch)


def _write_each_alone(conn: sqlite3.Connection, batch: Sequence[Pending]) -> bool:
    """``_write`` once a write of ``batch`` failed: the batch in one transaction again, each
    writer in a savepoint of its own, so that a bad write fails alone."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        for item in batch:
            conn.execute("SAVEPOINT item")
            try:
                item.changed = _run(conn, item)
            except sqlite3.Error as exc:
                conn.execute("ROLLBACK TO item")
                item.changed, item.error = 0, exc
            conn.execute("RELEASE item")
    except BaseException as exc:
        return _failed(conn, batch, exc)
    return _commit(conn, batch)


def _run(conn: sqlite3.Connection, item: Pending) -> int:
    """Run one writer's statements in the open transaction; the rows they changed."""
    changed = 0
    for sql, rows in item.statements:
        if len(rows) == 1:
            changed += conn.execute(sql, rows[0]).rowcount
        elif rows:
            changed += conn.executemany(sql, rows).rowcount
    return changed


def _commit(conn: sqlite3.Connection, batch: Sequence[Pending]) -> bool:
    try:
        conn.execute("COMMIT")
    except BaseException as exc:
        return _failed(conn, batch, exc)
    return True


def _failed(conn: sqlite3.Connection, batch: Sequence[Pending], exc: BaseException) -> bool:
    """Roll back the open transaction and give ``exc`` to each write of ``batch`` without an
    error of its own; False (nothing committed)."""
    if conn.in_transaction:
        conn.execute("ROLLBACK")
    for item in batch:
        item.error = item.error or exc
    return False



def busy(exc: BaseException) -> bool:
    """Whether ``exc`` is SQLite saying another connection holds the lock (worth waiting for)."""
    return isinstance(exc, sqlite3.OperationalError) and ("locked" in str(exc) or "busy" in str(exc))


def settle(batch: Sequence[Pending]) -> None:
    """Wake each item's writer, on its own loop (the batch may hold writes from several)."""
    try:
        here: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
    except RuntimeError:  # on the waiting thread
        here = None
    for item in batch:
        future = item.future
        if future is None:
            continue
        loop = future.get_loop()
        if loop is here:
            if not future.done():
                future.set_result(None)
        else:
            with suppress(RuntimeError):  # a loop that closed has no writer left to wake
                loop.call_soon_threadsafe(_wake, future)


def _wake(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def identity(path: Path) -> tuple[int, int] | None:
    """(device, inode) of the file at ``path``; None where there is none."""
    try:
        found = os.stat(path)
    except FileNotFoundError:
        return None
    return found.st_dev, found.st_ino


class Turns:
    """Who may commit at once in this turn of the loop. The first task to write in a turn does
    (most writes come alone, and a turn's wait for company would cost each of them the turn),
    and so may that task's next writes before it yields (nobody else has run meanwhile). Any
    other task writing in the same turn yields once instead, so that the writes of the turn's
    other tasks join its batch: one commit for them all. The mark is cleared by a callback,
    which asyncio runs in the next turn."""

    __slots__ = ("_loop", "_taker")

    def __init__(self) -> None:
        self._taker: object = _FREE
        self._loop: asyncio.AbstractEventLoop | None = None

    def first(self, loop: asyncio.AbstractEventLoop) -> bool:
        """Whether the running task may commit at once. A mark left by another loop (one that
        stopped before its next turn cleared it) does not count."""
        task = asyncio.current_task(loop)
        if self._taker is _FREE or self._loop is not loop:
            self._taker, self._loop = task, loop
            loop.call_soon(self._clear)
            return True
        return self._taker is task and task is not None

    def _clear(self) -> None:
        self._taker = _FREE


_FREE = object()
