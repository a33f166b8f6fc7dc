"""``SqliteCheckpointer``: the protocol's methods over the parts of this package.

Writes go through group commit (``commit``) on the loop's thread, or on the waiting thread
(``thread``) while another connection holds the lock; appends go to the append log (``log``)
and are folded into the file in one transaction; WAL checkpoints run on a thread of their own
(``wal``). See the package's docstring for why each is shaped so.
"""

from __future__ import annotations

import asyncio
import contextvars
import json
import sqlite3
import threading
import time
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any, Literal

from ringzero.checkpointers._filters import list_query, pushable, selected
from ringzero.checkpointers.sqlite.commit import Fold, Pending, Turns, busy, identity, settle, write
from ringzero.checkpointers.sqlite.log import (
    CHECKPOINT,
    FOLD_AFTER,
    FOLD_EVERY,
    FOLD_WITHIN,
    PUT_CHECKPOINT,
    RESTART_AFTER,
    WRITE,
    AppendLog,
    Entry,
    Row,
    fold_orphans,
    other_logs,
    write_statements,
)
from ringzero.checkpointers.sqlite.memory import SqliteMemoryIndex
from ringzero.checkpointers.sqlite.schema import SELECT, check_and_migrate, checkpoint_of, checkpoint_row, write_rows
from ringzero.checkpointers.sqlite.thread import WaitingThread
from ringzero.checkpointers.sqlite.wal import WalCheckpoints
from ringzero.core.errors import CheckpointerError, Closed, InvalidArgument
from ringzero.core.protocols import CheckpointerCapabilities
from ringzero.core.timeouts import shielded
from ringzero.core.types import JSON, Checkpoint, PendingWrite

__all__ = ["DEFAULT_PATH", "FOLD_HERE_AT_MOST", "SqliteCheckpointer"]

_PUT = PUT_CHECKPOINT

FOLD_HERE_AT_MOST = 4096
"""Rows a fold may commit on the loop's thread (some 20 ms of work); a larger one (records that
piled up while a fold waited on the waiting thread) commits there instead, so that no fold
stalls every process for long. Not much lower either: a steady stream of appends piles up a few
thousand rows during a WAL checkpoint's RESTART, and those fold faster on the loop, where a fold
does not hand the GIL back and forth at every row."""

CHECK_FILE_AFTER = 0.005
"""Seconds an append trusts the last check that the file is still the one opened (a ``stat``,
``_file_gone``): a graph's nine appends in a few milliseconds make one, not nine. A commit,
a fold included, checks every time, so an append to a deleted file fails at the latest this
long after it, or at the fold of its record."""

_NO_CONTEXT = contextvars.Context()
"""The context the log's callbacks run in: the appender's own would keep its process (its
``Context``, set in a context variable) alive until the callback ran."""

DEFAULT_PATH = ".ringzero/state.db"


class SqliteCheckpointer:
    """Durable checkpoints in one SQLite file."""

    capabilities = CheckpointerCapabilities(durable=True, multi_process=True, delete_checkpoints=True, claims=True,
                                          put_many=True, append=True)

    def __init__(
        self,
        path: str | Path = DEFAULT_PATH,
        *,
        synchronous: Literal["NORMAL", "FULL"] = "NORMAL",
        busy_timeout: float = 30.0,
        create_folder: bool | None = None,
    ) -> None:
        """``create_folder``: make the file's folder if it is missing. By default only for the
        default path (``.ringzero/``): a mistyped folder is an error, not a new tree of folders."""
        if not isinstance(path, (str, Path)) or not str(path):
            raise InvalidArgument(f"SqliteCheckpointer needs a file path, not {path!r}")
        if synchronous not in ("NORMAL", "FULL"):
            raise InvalidArgument(f"synchronous is 'NORMAL' or 'FULL', not {synchronous!r}")
        if isinstance(busy_timeout, bool) or not isinstance(busy_timeout, (int, float)) or not busy_timeout >= 0:
            raise InvalidArgument(f"busy_timeout is a number of seconds, not {busy_timeout!r}")
        self.path = Path(path)
        if create_folder is None:
            create_folder = self.path == Path(DEFAULT_PATH)
        if not create_folder and not self.path.parent.is_dir():
            raise InvalidArgument(f"the folder of SQLite file {self.path} does not exist ({self.path.parent}); create "
                                  "it, or pass create_folder=True")
        self._create_folder = create_folder
        self._synchronous = synchronous
        self._busy_ms = int(busy_timeout * 1000)
        self._db: WaitingThread | None = None
        self._fast: sqlite3.Connection | None = None
        """The caller-thread connection (see the module docstring); None until opened, and
        with ``synchronous="FULL"``."""
        self._fast_lock = threading.Lock()
        self._closed = False
        self._opening = asyncio.Lock()
        self._pending: list[Pending] = []
        self._pending_lock = threading.Lock()
        self._slow = 0
        """Writes on their way through the waiting thread: while any are, every write goes that way."""
        self._handoffs: set[asyncio.Task[None]] = set()
        self._draining = False
        """The job that commits writes on the waiting thread is running (``_drain_soon``)."""
        self._wal = WalCheckpoints(self.path, self._busy_ms)
        self._turns = Turns()
        self._identity: tuple[int, int] | None = None
        """The file this checkpointer opened (``_file_gone``)."""
        self.commits = 0
        """Transactions committed: fewer than writes when concurrent writes were grouped."""
        self._log: AppendLog | None = None
        """This checkpointer's append log (``log``), made at the first ``append``."""
        self._log_usable = synchronous == "NORMAL"
        """False where ``append`` commits instead: fsync per commit asked for, or no log can be made here."""
        self._log_seq = 0
        """The sequence number of the log's last record."""
        self._unfolded: list[Entry] = []
        """The rows of the log's records not yet committed to the file, in order, with their kind."""
        self._unfolded_threads: set[str] = set()
        """The threads of the rows of ``_unfolded``: a read of another thread need not wait for a fold."""
        self._folding: Fold | None = None
        """The fold on its way through the waiting thread: one at a time, so that the records a
        fold marks as folded are always all those before it."""
        self._fold_timer: asyncio.TimerHandle | None = None
        self._appended_at = 0.0
        """The loop's time of the last append: the log is folded ``FOLD_AFTER`` after it."""
        self._file_checked_until = 0.0
        """The loop's time until which an append need not check the file again (``CHECK_FILE_AFTER``)."""
        self._unfolded_since = 0.0
        """The loop's time when the fold timer was set: the log is folded ``FOLD_WITHIN`` after it."""
        self._fold_error: BaseException | None = None
        """Why the last fold failed (its rows stay in the log, and wait for the next fold)."""
        self.folds = 0
        """Folds of the append log committed."""
        self._after_append = False
        """This store's last write was an ``append``: only then does the next go to the log."""

    def __repr__(self) -> str:
        return f"SqliteCheckpointer({str(self.path)!r})"

    @contextmanager
    def _errors(self, doing: str) -> Iterator[None]:
        try:
            yield
        except sqlite3.Error as exc:
            raise CheckpointerError(f"SQLite file {self.path}: {doing} failed: {exc}") from exc

    async def _conn(self) -> WaitingThread:
        if self._db is not None:
            return self._db
        if self._closed:
            raise Closed(f"{self!r} is closed; open a new SqliteCheckpointer on the same file to go on")
        async with self._opening:
            if self._db is None:
                self._db = await self._open()
        return self._db

    async def _open(self) -> WaitingThread:
        if self._create_folder:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        db = WaitingThread(self.path, busy_ms=self._busy_ms)
        try:
            with self._errors("opening"):
                await db.call(check_and_migrate, self.path)
            with self._errors("preparing"):  # only now that the file is known to be ours
                self._identity = identity(self.path)
                await self._enable_wal(db)
                await db.execute(f"PRAGMA synchronous={self._synchronous}")
                if self._synchronous == "NORMAL":
                    self._fast = self._open_fast()
                await self._fold_orphans(db)
        except BaseException:
            if self._fast is not None:
                self._fast.close()
                self._fast = None
            await db.close()
            raise
        return db

    def _open_fast(self) -> sqlite3.Connection:
        fast = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        try:
            fast.execute("PRAGMA busy_timeout=0")  # never wait on the loop: hand off instead
            fast.execute("PRAGMA synchronous=NORMAL")
            fast.execute("PRAGMA wal_autocheckpoint=0")  # WalCheckpoints does it, off the loop
        except BaseException:
            fast.close()
            raise
        return fast

    async def _transaction(self, db: WaitingThread, statements: Sequence[tuple[str, Sequence[Any]]], *,
                           appended: bool = False) -> Pending:
        """Commit ``(sql, rows)`` pairs atomically, grouped with the other writes of this turn
        of the loop; when this returns, the write is committed (see the module docstring).

        The first write of a turn of the loop commits at once (``Turns``): most writes come
        alone, and waiting a turn for company would cost each of them the turn. A write after it
        in the same turn yields once, so that every other task with work in this turn adds its
        own; then the first of them to run again commits them all, and the others find theirs done.

        Records of the append log not yet in the file go first, in the same transaction (a
        fold of their own, ``_take_fold``): one commit, and this write comes after them.
        ``appended``: rows an append commits instead (see ``append``)."""
        self._after_append = appended and self._log_usable
        loop = asyncio.get_running_loop()
        item = Pending(statements, None)
        if self._unfolded and self._folding is not None:
            await self._fold_first(db)  # the records after the fold on its way go before this write
        fold = self._take_fold() if self._unfolded else None
        batch = [item] if fold is None else [fold, item]
        if self._fast is not None and not self._slow and self._folding is None and self._turns.first(loop) \
                and self._write_here(batch):
            if fold is not None:
                self._folded(fold)
            if item.error is not None:
                raise item.error
            return item
        if fold is not None:
            self._line_up(fold)
        item.future = loop.create_future()
        with self._pending_lock:
            self._pending.extend(batch)
            slow = self._slow > 0 or self._fast is None
            if slow:
                self._drain_soon(db)
        if not slow:
            try:
                await asyncio.sleep(0)
            finally:  # cancelled or not: a write once begun is committed, as a crash-free run would
                if not item.future.done():
                    self._flush(db)
        await item.future
        if item.error is not None:
            raise item.error
        return item

    def _write_here(self, batch: list[Pending]) -> bool:
        """Commit ``batch`` on the caller's thread; False, with nothing written, where another
        connection holds the write lock (the batch must go through the waiting thread)."""
        with self._fast_lock:
            if self._fast is None or self._wal.restarting:
                return False
            try:
                committed = write(self._fast, batch)
            except BaseException as exc:
                if busy(exc):
                    return False
                for item in batch:
                    item.error = item.error or exc
                return True
        if committed:
            self.commits += 1
            self._wal.committed(sum(len(rows) for item in batch for _, rows in item.statements))
            gone = self._file_gone()
            for item in batch:
                item.error = item.error or gone
        return True

    def _file_gone(self) -> CheckpointerError | None:
        """The error to answer a commit with when the file was deleted or replaced under this
        open connection: SQLite goes on writing to the unlinked file, and all of it would be lost
        at exit. A ``stat`` per commit (about a microsecond) is the price of never losing silently."""
        if identity(self.path) == self._identity:
            return None
        return CheckpointerError(f"SQLite file {self.path} was deleted or replaced while this kernel had it open; "
                                 "what is written now would be lost. Restore the file (or start on a new one) and "
                                 "recover() there")

    def _flush(self, db: WaitingThread) -> None:
        """Commit every write waiting, on the caller's thread, or hand them to the waiting
        thread if another connection holds the write lock."""
        with self._pending_lock:
            if self._slow or not self._pending:
                return  # taken by another flush, or on their way through the waiting thread
            batch, self._pending = self._pending, []
        if self._write_here(batch):
            settle(batch)
            return
        with self._pending_lock:
            self._pending[:0] = batch  # first in line, ahead of anything written since
            self._drain_soon(db)

    def _drain_soon(self, db: WaitingThread) -> None:
        """Start the one job that commits the waiting writes on the waiting thread, unless it is
        running (call with ``_pending_lock`` held). While it runs every write joins the line it
        commits, in order; once the line is empty the job ends and writes take the fast path again.
        One job, not one per writer: under steady load a job per writer kept some in flight at
        every moment, so the writes never went back to the fast path (each paid the thread's
        round trip, about 100 µs), and most jobs found their write committed by an earlier one."""
        if self._draining:
            return
        self._draining = True
        self._slow += 1
        job = asyncio.get_running_loop().create_task(self._drain_until_caught_up(db))
        self._handoffs.add(job)
        job.add_done_callback(self._handoffs.discard)

    async def _drain_until_caught_up(self, db: WaitingThread) -> None:
        try:
            while not await db.call(self._drain, job=True):
                pass
        except asyncio.CancelledError:
            raise  # the loop is closing; the commit in flight on the thread wakes its writers itself
        except BaseException as exc:  # the waiting thread is gone: fail what waits rather than hang it
            with self._pending_lock:
                batch, self._pending = self._pending, []
                self._draining = False
                self._slow -= 1
            for item in batch:
                item.error = exc
            settle(batch)

    def _drain(self, conn: sqlite3.Connection, *, job: bool = False) -> bool:
        """On the waiting thread (which waits up to ``busy_timeout`` for the write lock): commit
        every write waiting, in the order written, and wake their writers. For the drain job
        (``job``): True when nothing is left waiting, and the job is over: that is settled before
        the writers wake, so that one that writes again at once finds the fast path open (woken
        first, it came back while the job still ran, and kept it going one write at a time)."""
        self._wal.wait_for_restart()
        with self._pending_lock:
            batch, self._pending = self._pending, []
        try:
            if batch and write(conn, batch):  # none: an earlier drain committed them
                self.commits += 1
                gone = self._file_gone()
                for item in batch:
                    item.error = item.error or gone
        except BaseException as exc:  # the lock stayed taken for the whole busy timeout
            for item in batch:
                item.error = exc
        caught_up = False
        if job:
            with self._pending_lock:
                if not self._pending:
                    self._draining = False
                    self._slow -= 1
                    caught_up = True
        settle(batch)
        return caught_up

    def _read_here(self, sql: str, params: Sequence[Any]) -> list[Any] | None:
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

    async def put(self, checkpoint: Checkpoint) -> None:
        db = self._db or await self._conn()
        row = checkpoint_row(checkpoint)
        try:  # not self._errors(): a context manager costs a few µs, and this runs at every syscall
            if not self._put_here(row):
                await self._transaction(db, [(_PUT, [row])])
        except sqlite3.Error as exc:
            raise CheckpointerError(f"SQLite file {self.path}: put failed: {exc}") from exc

    async def put_many(self, checkpoints: Sequence[Checkpoint]) -> None:
        """Store each, in order, in one transaction (grouped with the other writes of this turn)."""
        await self._put_rows([checkpoint_row(cp) for cp in checkpoints])

    async def _put_rows(self, rows: list[Row]) -> None:
        db = self._db or await self._conn()
        with self._errors("put_many"):
            await self._transaction(db, [(_PUT, rows)])

    def _put_here(self, row: tuple[Any, ...], *, appended: bool = False) -> bool:
        """``_transaction``'s commit at once, for one row, without its bookkeeping (a ``put`` at
        every syscall); False where it cannot be done here and now."""
        self._after_append = appended and self._log_usable
        fast = self._fast
        if fast is None or self._slow or self._unfolded or self._folding is not None or self._wal.restarting \
                or not self._turns.first(asyncio.get_running_loop()):
            return False
        with self._fast_lock:
            try:
                fast.execute(_PUT, row)
            except sqlite3.OperationalError as exc:
                if busy(exc):
                    return False
                raise
        self.commits += 1
        self._wal.committed()
        gone = self._file_gone()
        if gone is not None:
            raise gone
        return True

    async def append(self, checkpoint: Checkpoint) -> None:
        """``put`` for a record this checkpointer, or recovery after a crash, reads back (the
        kernel's journal, a LangGraph graph's checkpoints): as durable when it returns, for one
        ``write()`` into the append log (``log``) instead of a commit. Other connections
        to the file see it once the log is folded, at most ``FOLD_AFTER`` seconds or
        ``FOLD_EVERY`` records later; this checkpointer folds it before any other write of its
        own, and before a read of its thread.

        An append right after another write commits as ``put`` does (joining that write's
        batch where one is forming): the log pays where appends come in a row (a process's
        syscalls, a graph's steps), folding many records in one transaction. An append between
        other writes would be folded alone into the next one's transaction, a log ``write()``
        and a bookkeeping statement more than the commit it saved (a woken process's ``recv``
        record between its mail and its end). The appends after it, even those that come before
        its commit (the rest of a burst in one turn of the loop: 1,000 spawns given their pids
        at once), go to the log: it counts as an append."""
        row = checkpoint_row(checkpoint)
        if await self._append(CHECKPOINT, [row]):
            await self._commit_appended([(_PUT, [row])], "append", row)
            self._after_append = self._log_usable

    async def append_many(self, checkpoints: Sequence[Checkpoint]) -> None:
        """``put_many`` as ``append`` is ``put``: the checkpoints as one record of the log, so
        that a crash keeps all of them or none (the kernel's transitions, status and state rows
        of a process)."""
        rows = [checkpoint_row(cp) for cp in checkpoints]
        if rows and await self._append(CHECKPOINT, rows):
            await self._commit_appended([(_PUT, rows)], "append_many")
            self._after_append = self._log_usable

    async def append_writes(
        self, thread_id: str, namespace: str, checkpoint_id: str, writes: Sequence[PendingWrite]
    ) -> None:
        """``put_writes`` as ``append`` is ``put``: one ``write()`` into the append log."""
        rows = write_rows(thread_id, namespace, checkpoint_id, writes)
        if writes and await self._append(WRITE, rows):
            await self._commit_appended(write_statements(rows), "append_writes")
            self._after_append = self._log_usable

    async def _commit_appended(self, statements: Sequence[tuple[str, Sequence[Any]]], doing: str,
                               row: Row | None = None) -> None:
        """Commit, as ``put`` would, what an append did not write to the log (see ``append``):
        one ``row`` at once where it can (``_put_here``)."""
        db = self._db or await self._conn()
        with self._errors(doing):
            if row is None or not self._put_here(row, appended=True):
                await self._transaction(db, statements, appended=True)

    async def _append(self, kind: int, rows: list[Row]) -> bool:
        """Write ``rows`` as one record of the log; True where the caller must commit them
        instead (no log here, or the last write was not an append)."""
        db = self._db or await self._conn()
        log = (self._log or self._make_log()) if self._after_append and self._log_usable else None
        if log is None:
            return True
        if self._fold_error is not None:  # the last fold failed: again now, raising if it fails again
            self._fold_error = None
            await self._fold_first(db)
        now = asyncio.get_running_loop().time()
        if now >= self._file_checked_until:
            gone = self._file_gone()
            if gone is not None:
                raise gone
            self._file_checked_until = now + CHECK_FILE_AFTER
        try:
            log.append(self._log_seq + 1, rows, kind)
        except OSError as exc:  # the log may end in a torn record now: no more records after it
            self._log_usable = self._after_append = False
            raise CheckpointerError(f"SQLite file {self.path}: writing its append log {log.path} failed: "
                                    f"{exc}") from exc
        self._log_seq += 1
        if len(rows) == 1:
            self._unfolded.append((kind, rows[0]))
            self._unfolded_threads.add(rows[0][0])
        else:
            self._unfolded.extend((kind, row) for row in rows)
            self._unfolded_threads.update(row[0] for row in rows)
        if len(self._unfolded) >= FOLD_EVERY:
            self._fold(db)
        elif self._fold_timer is None:
            self._fold_later(db)
        else:
            self._appended_at = now
        return False

    def _fold_later(self, db: WaitingThread) -> None:
        """Fold once no record was appended for ``FOLD_AFTER`` seconds, or ``FOLD_WITHIN`` from
        now, whichever comes first; the timer runs in an empty context (see ``_NO_CONTEXT``)."""
        loop = asyncio.get_running_loop()
        self._appended_at = self._unfolded_since = loop.time()
        self._fold_timer = loop.call_later(min(FOLD_AFTER, FOLD_WITHIN), self._fold_due, db, context=_NO_CONTEXT)

    def _fold_due(self, db: WaitingThread) -> None:
        """The fold timer: fold now, or wait on where appends since it was set push the fold."""
        loop = asyncio.get_running_loop()
        wait = min(self._appended_at + FOLD_AFTER, self._unfolded_since + FOLD_WITHIN) - loop.time()
        if wait > 0:
            self._fold_timer = loop.call_later(wait, self._fold_due, db, context=_NO_CONTEXT)
            return
        self._fold_timer = None
        self._fold(db)

    def _make_log(self) -> AppendLog | None:
        """This checkpointer's append log, made now; None where ``append`` commits instead."""
        if not self._log_usable or self._fast is None or self._identity is None:
            return None
        try:
            self._log = AppendLog(self.path, self._identity)
        except (ImportError, OSError):  # no flock (not Unix), or the folder takes no new file
            self._log_usable = False
        return self._log

    def _unfolded_for(self, thread_id: str | None) -> bool:
        """Whether a read of ``thread_id`` (None: every thread) must wait for a fold: records of
        it are appended and not yet in the file. A read of another thread reads the file as it
        is, so that appends in a row (a graph's steps, a process's syscalls) fold together, not
        at every read in between."""
        if self._folding is not None:
            return True
        return bool(self._unfolded) and (thread_id is None or thread_id in self._unfolded_threads)

    def _take_fold(self) -> Fold | None:
        """The log's records not yet in the file, taken from the line as one write; None where
        there are none, or a fold is on its way (folds go one at a time, so that the records a
        fold marks as folded are always all those before it)."""
        if self._fold_timer is not None:
            self._fold_timer.cancel()
            self._fold_timer = None
        log, entries = self._log, self._unfolded
        if not entries or log is None or self._folding is not None:
            return None
        self._unfolded = []
        self._unfolded_threads = set()
        return Fold(entries, log.name, self._log_seq)

    def _line_up(self, fold: Fold) -> None:
        """Make ``fold`` wait in the line of writes (the caller appends it): ``_folding`` until done."""
        fold.future = asyncio.get_running_loop().create_future()
        self._folding = fold
        fold.future.add_done_callback(lambda _: self._folded(fold))

    def _fold(self, db: WaitingThread) -> Fold | None:
        """Commit the log's records not yet in the file, in one transaction: at once on this
        thread where it can, else in line on the waiting thread. None: nothing to fold now."""
        fold = self._take_fold()
        if fold is None:
            return None
        if not self._slow and len(fold.entries) <= FOLD_HERE_AT_MOST and self._write_here([fold]):
            self._folded(fold)
            return fold
        self._line_up(fold)
        with self._pending_lock:
            self._pending.append(fold)
            self._drain_soon(db)
        return fold

    def _folded(self, fold: Fold) -> None:
        """After a fold (once, whoever sees it end first): the log starts over if nothing was
        appended meanwhile and it passed ``RESTART_AFTER`` bytes; a failed fold's rows go back
        to the front of the line, and the next ``append`` folds before it writes (raising if that fails too)."""
        if fold.seen:
            return
        fold.seen = True
        if self._folding is fold:
            self._folding = None
        if fold.error is not None:
            self._unfolded[:0] = fold.entries
            self._unfolded_threads.update(row[0] for _, row in fold.entries)
            self._fold_error = fold.error
            return
        self.folds += 1
        if self._log is not None and not self._unfolded and self._log.size > RESTART_AFTER:
            with suppress(OSError):  # not started over: its records are folded again, and skipped
                self._log.restart()
        elif self._unfolded and self._fold_timer is None and self._db is not None:
            self._fold_later(self._db)

    async def _fold_first(self, db: WaitingThread) -> None:
        """Before a read, or a write that cannot join the fold's transaction: every record
        appended so far is in the file, so that what follows sees it and comes after it.
        Raises the fold's error."""
        while self._unfolded or self._folding is not None:
            fold = self._folding or self._fold(db)
            if fold is None:
                return
            if fold.future is not None and not fold.future.done():
                await shielded(fold.future)
            self._folded(fold)
            if fold.error is not None:
                self._fold_error = None
                raise CheckpointerError(f"SQLite file {self.path}: committing its append log failed: "
                                        f"{fold.error}") from fold.error

    async def claim(self, checkpoint: Checkpoint) -> bool:
        db = await self._conn()
        row = checkpoint_row(checkpoint)
        with self._errors("claim"):
            done = await self._transaction(db, [("INSERT OR IGNORE INTO checkpoints VALUES (?, ?, ?, ?, ?, ?)", [row])])
        return done.changed == 1

    async def put_writes(
        self, thread_id: str, namespace: str, checkpoint_id: str, writes: Sequence[PendingWrite]
    ) -> None:
        db = await self._conn()
        rows = write_rows(thread_id, namespace, checkpoint_id, writes)
        with self._errors("put_writes"):  # a special (negative idx) write replaces, others are kept first
            await self._transaction(db, write_statements(rows))

    async def get(self, thread_id: str, namespace: str = "", checkpoint_id: str | None = None) -> Checkpoint | None:
        db = await self._conn()
        if self._unfolded_for(thread_id):
            await self._fold_first(db)
        params: tuple[str, ...] = (thread_id, namespace)
        if checkpoint_id is None:
            sql = f"{SELECT} WHERE thread_id=? AND namespace=? ORDER BY id DESC LIMIT 1"
        else:
            sql, params = f"{SELECT} WHERE thread_id=? AND namespace=? AND id=?", (*params, checkpoint_id)
        with self._errors("get"):
            rows = self._read_here(sql, params)
            if rows is None:
                rows = list(await db.fetchall(sql, params))
            return next((checkpoint_of(row) for row in rows), None)

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
        if self._unfolded_for(thread_id):
            await self._fold_first(db)
        pushed = [(f"json_extract(c.metadata, '$.{key}')=?", value) for key, value in pushable(filter)]
        sql, params = list_query(SELECT, "?", thread_id, namespace, before, pushed)
        if limit is not None and not filter:
            sql += f" LIMIT {int(limit)}"
        with self._errors("list"):
            await self._fold_orphans(db)
            rows = list(await db.fetchall(sql, params))
        for row in selected(rows, lambda r: json.loads(r[5]), filter, limit):
            yield checkpoint_of(row)

    async def _fold_orphans(self, db: WaitingThread) -> None:
        """Fold the logs of checkpointers that died with records in them (``log``): at
        open, and at each ``list`` (how a kernel recovering processes reads their journals)."""
        names = other_logs(self.path, self._log)
        if names:
            await db.call(fold_orphans, names, self._identity)

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
        if self._unfolded or self._folding is not None:
            await self._fold_first(db)
        with self._errors("reading"):
            return list(await db.fetchall(sql, params))

    async def aclose(self) -> None:
        """Close the connection; a later call raises ``Closed``."""
        self._closed = True
        if self._db is not None:
            db = self._db
            folded = True
            try:
                await self._fold_first(db)
            except CheckpointerError:
                folded = False  # the records stay in the log, which the file's next opener folds
            with self._pending_lock:
                self._slow += 1  # what is still waiting goes through the waiting thread
            try:
                await db.call(self._drain)
                while self._handoffs:
                    await asyncio.gather(*self._handoffs, return_exceptions=True)
                if self._log is not None and folded and not self._unfolded:
                    log, self._log = self._log, None
                    log.close(remove=True)
                    with suppress(sqlite3.Error):  # a row left behind only names a log that is gone
                        await db.execute("DELETE FROM ringzero_folded_logs WHERE name=?", (log.name,))
            finally:
                with self._pending_lock:
                    self._slow -= 1
                if self._fold_timer is not None:
                    self._fold_timer.cancel()
                    self._fold_timer = None
                if self._log is not None:
                    self._log.close(remove=False)
                    self._log = None
                self._db = None
                with self._fast_lock:
                    fast, self._fast = self._fast, None
                if fast is not None:
                    fast.close()
                self._wal.close()
                await db.close()
