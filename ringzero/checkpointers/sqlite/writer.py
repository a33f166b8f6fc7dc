"""The writer: one file's connections, and the line of writes waiting for their commit.

Writes commit on the caller's thread through a plain ``sqlite3`` connection (the fast path),
which never waits for SQLite's lock; when another connection holds it, the waiting writes go to
the waiting thread (``thread``), in order, and every write follows them there until the line is
empty. WAL checkpoints run on a thread of their own (``wal``).
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ringzero.checkpointers.sqlite.commit import Pending, Turns, busy, identity, settle, write
from ringzero.checkpointers.sqlite.log import PUT_CHECKPOINT, Row
from ringzero.checkpointers.sqlite.schema import check_and_migrate
from ringzero.checkpointers.sqlite.thread import WaitingThread
from ringzero.checkpointers.sqlite.wal import WalCheckpoints
from ringzero.core.contract.errors import CheckpointerError

__all__ = ["Writer"]


class Writer:
    """Commits batches of writes to one file, at once where it can, else in line."""

    def __init__(self, path: Path, *, busy_ms: int, synchronous: str) -> None:
        self.path = path
        self._busy_ms = busy_ms
        self._synchronous = synchronous
        self.db: WaitingThread | None = None
        """The waiting thread, once the file is open."""
        self._fast: sqlite3.Connection | None = None
        """The caller-thread connection; None until opened, and with ``synchronous="FULL"``."""
        self._fast_lock = threading.Lock()
        self._pending: list[Pending] = []
        self._pending_lock = threading.Lock()
        self.slow = 0
        """Writes on their way through the waiting thread: while any are, every write goes that way."""
        self._handoffs: set[asyncio.Task[None]] = set()
        self._draining = False
        """The job that commits writes on the waiting thread is running (``drain_soon``)."""
        self.wal = WalCheckpoints(path, busy_ms)
        self.turns = Turns()
        self.identity: tuple[int, int] | None = None
        """The file opened (``file_gone``)."""
        self.commits = 0
        """Transactions committed: fewer than writes when concurrent writes were grouped."""

    # ------------------------------------------------------------------ opening and closing
    async def open(self) -> WaitingThread:
        """Check and migrate the schema, switch to WAL, open the fast path. Raises
        ``CheckpointerError`` (``opening`` for a file that is not ours, ``preparing`` after)."""
        db = WaitingThread(self.path, busy_ms=self._busy_ms)
        try:
            with self.errors("opening"):
                await db.call(check_and_migrate, self.path)
            with self.errors("preparing"):  # only now that the file is known to be ours
                self.identity = identity(self.path)
                await self._enable_wal(db)
                await db.execute(f"PRAGMA synchronous={self._synchronous}")
                if self._synchronous == "NORMAL":
                    self._fast = self._open_fast()
        except BaseException:
            self._close_fast()
            await db.close()
            raise
        self.db = db
        return db

    def errors(self, doing: str) -> _Errors:
        """A context in which SQLite's errors become ``CheckpointerError`` naming the file."""
        return _Errors(self.path, doing)

    def _open_fast(self) -> sqlite3.Connection:
        """The caller-thread connection. Its first statement reads the schema, which waits while
        another instance opening the same new file switches it to WAL: that wait is allowed
        here, in the opening; the writes after never wait (``busy_timeout=0``, set last)."""
        fast = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False,
                               timeout=self._busy_ms / 1000)
        try:
            fast.execute("PRAGMA synchronous=NORMAL")
            fast.execute("PRAGMA wal_autocheckpoint=0")  # WalCheckpoints does it, off the loop
            fast.execute("PRAGMA busy_timeout=0")  # never wait on the loop: hand off instead
        except BaseException:
            fast.close()
            raise
        return fast

    async def _enable_wal(self, db: WaitingThread) -> None:
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

    @property
    def has_fast_path(self) -> bool:
        return self._fast is not None

    async def drain_all(self) -> None:
        """Commit every write still waiting, on the waiting thread, and wait for the drain job."""
        assert self.db is not None
        with self._pending_lock:
            self.slow += 1  # what is still waiting goes through the waiting thread
        try:
            await self.db.call(self.drain)
            while self._handoffs:
                await asyncio.gather(*self._handoffs, return_exceptions=True)
        finally:
            with self._pending_lock:
                self.slow -= 1

    async def close(self, *, for_good: bool = True) -> None:
        """Close the connections; ``for_good=False`` (an open that failed half-way) leaves the
        WAL checkpoints usable for the next open."""
        db, self.db = self.db, None
        self._close_fast()
        if for_good:
            self.wal.close()
        if db is not None:
            await db.close()

    def _close_fast(self) -> None:
        with self._fast_lock:
            fast, self._fast = self._fast, None
        if fast is not None:
            fast.close()

    # ------------------------------------------------------------------ committing
    def commits_now(self, loop: asyncio.AbstractEventLoop) -> bool:
        """Whether a write may commit at once, on this thread: the fast path is open, no write
        waits on the waiting thread, and this turn's commit at once is the caller's (``Turns``)."""
        return self._fast is not None and not self.slow and self.turns.first(loop)

    def write_here(self, batch: Sequence[Pending]) -> bool:
        """Commit ``batch`` on the caller's thread; False, with nothing written, where another
        connection holds the write lock (the batch must go through the waiting thread)."""
        with self._fast_lock:
            if self._fast is None or self.wal.restarting:
                return False
            try:
                committed = write(self._fast, batch)
            except BaseException as exc:
                if busy(exc):
                    return False
                for item in batch:
                    item.fail(exc, unless_failed=True)
                return True
        if committed:
            self.commits += 1
            self.wal.committed(sum(len(rows) for item in batch for _, rows in item.statements))
            gone = self.file_gone()
            for item in batch:
                item.fail(gone, unless_failed=True)
        return True

    def put_here(self, row: Row) -> bool:
        """One row put at once, without a batch's bookkeeping (a ``put`` at every syscall); False
        where it cannot be done here and now. Raises SQLite's error, or ``file_gone``'s."""
        fast = self._fast
        if fast is None or self.slow or self.wal.restarting or not self.turns.first(asyncio.get_running_loop()):
            return False
        with self._fast_lock:
            try:
                fast.execute(PUT_CHECKPOINT, row)
            except sqlite3.OperationalError as exc:
                if busy(exc):
                    return False
                raise
        self.commits += 1
        self.wal.committed()
        gone = self.file_gone()
        if gone is not None:
            raise gone
        return True

    def file_gone(self) -> CheckpointerError | None:
        """The error to answer a commit with when the file was deleted or replaced under this
        open connection: SQLite goes on writing to the unlinked file, and all of it would be lost
        at exit. A ``stat`` per commit (about a microsecond) is the price of never losing silently."""
        if identity(self.path) == self.identity:
            return None
        return CheckpointerError(f"SQLite file {self.path} was deleted or replaced while this kernel had it open; "
                                 "what is written now would be lost. Restore the file (or start on a new one) and "
                                 "recover() there")

    def line_up(self, batch: Sequence[Pending]) -> bool:
        """Put ``batch`` in the line of writes for the next commit; True where it goes to the
        waiting thread (already started on it), False where the caller's ``flush`` commits it."""
        with self._pending_lock:
            self._pending.extend(batch)
            slow = self.slow > 0 or self._fast is None
            if slow:
                self._drain_soon()
        return slow

    def to_waiting_thread(self, item: Pending) -> None:
        """Put ``item`` at the end of the line, which the waiting thread commits."""
        with self._pending_lock:
            self._pending.append(item)
            self._drain_soon()

    def flush(self) -> None:
        """Commit every write waiting, on the caller's thread, or hand them to the waiting
        thread if another connection holds the write lock."""
        with self._pending_lock:
            if self.slow or not self._pending:
                return  # taken by another flush, or on their way through the waiting thread
            batch, self._pending = self._pending, []
        if self.write_here(batch):
            settle(batch)
            return
        with self._pending_lock:
            self._pending[:0] = batch  # first in line, ahead of anything written since
            self._drain_soon()

    def _drain_soon(self) -> None:
        """Start the one job that commits the waiting writes on the waiting thread, unless it is
        running (call with ``_pending_lock`` held). While it runs every write joins the line it
        commits, in order; once the line is empty the job ends and writes take the fast path
        again. One job, not one per writer: under steady load a job per writer kept some in
        flight at every moment, so the writes never went back to the fast path."""
        if self._draining:
            return
        self._draining = True
        self.slow += 1
        job = asyncio.get_running_loop().create_task(self._drain_until_caught_up())
        self._handoffs.add(job)
        job.add_done_callback(self._handoffs.discard)

    async def _drain_until_caught_up(self) -> None:
        assert self.db is not None
        try:
            while not await self.db.call(self.drain, job=True):
                pass
        except asyncio.CancelledError:
            raise  # the loop is closing; the commit in flight on the thread wakes its writers itself
        except BaseException as exc:  # the waiting thread is gone: fail what waits rather than hang it
            with self._pending_lock:
                batch, self._pending = self._pending, []
                self._draining = False
                self.slow -= 1
            for item in batch:
                item.fail(exc)
            settle(batch)

    def drain(self, conn: sqlite3.Connection, *, job: bool = False) -> bool:
        """On the waiting thread (which waits up to ``busy_timeout`` for the write lock): commit
        every write waiting, in the order written, and wake their writers. For the drain job
        (``job``): True when nothing is left waiting, and the job is over: that is settled before
        the writers wake, so that one that writes again at once finds the fast path open."""
        self.wal.wait_for_restart()
        with self._pending_lock:
            batch, self._pending = self._pending, []
        try:
            if batch and write(conn, batch):  # none: an earlier drain committed them
                self.commits += 1
                gone = self.file_gone()
                for item in batch:
                    item.fail(gone, unless_failed=True)
        except BaseException as exc:  # the lock stayed taken for the whole busy timeout
            for item in batch:
                item.fail(exc)
        caught_up = False
        if job:
            with self._pending_lock:
                if not self._pending:
                    self._draining = False
                    self.slow -= 1
                    caught_up = True
        settle(batch)
        return caught_up

    def read_here(self, sql: str, params: Sequence[Any]) -> list[Any] | None:
        """A short read on the caller's thread; None where the fast path cannot answer it now."""
        with self._fast_lock:
            if self._fast is None:
                return None
            try:
                return self._fast.execute(sql, params).fetchall()
            except sqlite3.OperationalError as exc:
                if busy(exc):
                    return None
                raise


class _Errors:
    """``Writer.errors``: a plain class, not ``contextmanager``'s generator (cheaper to enter)."""

    __slots__ = ("doing", "path")

    def __init__(self, path: Path, doing: str) -> None:
        self.path, self.doing = path, doing

    def __enter__(self) -> None:
        return None

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: Any) -> None:
        if isinstance(exc, sqlite3.Error):
            raise CheckpointerError(f"SQLite file {self.path}: {self.doing} failed: {exc}") from exc
