"""SqliteCheckpointer: the embedded default, one SQLite file.

WAL mode, so readers never block the writer and a record whose ``put`` returned survives
the host process being killed (``synchronous=NORMAL`` is durable against a process crash;
pass ``synchronous="FULL"`` to survive power loss as well). Several kernels in separate
processes may share one file: SQLite serialises their writes and ``busy_timeout`` makes
them wait for each other instead of failing. The schema carries its version in
``PRAGMA user_version``; a file of another schema, or not SQLite at all, is refused with
its path in the error and left untouched.

Where the time goes, and why the write path is shaped this way (measured on the project's
machine, ``benchmarks/llm_syscall_overhead.py`` and ``benchmarks/checkpointers.py``):

- A commit in WAL mode is one ``write()`` into the WAL, about 25 µs; handing it to
  aiosqlite's thread and back costs about 100 µs more. So writes and point reads run on the
  caller's own thread, through a plain ``sqlite3`` connection (the *fast path*).
- Writes made in the same turn of the event loop commit together (group commit): a write
  joins the batch of its loop's turn, the batch commits in one transaction once the turn's
  other work is done, and each ``put`` returns only once its own record is committed. Should
  one write of the batch fail, the batch runs again with a savepoint per writer, so that the
  bad write fails alone (a savepoint per writer every time cost about 3 µs a writer).
- The fast path never waits for a lock: if another process holds the file's write lock, the
  batch goes to aiosqlite's thread, which waits up to ``busy_timeout``, and every write goes
  that way, in order, until it has caught up. ``synchronous="FULL"``, whose fsync per commit
  would stall the loop, always goes that way.
- WAL checkpoints (copying the WAL into the file, with an fsync) run on a thread of their
  own every ``CHECKPOINT_EVERY`` rows committed instead of inside a commit, where SQLite's
  automatic checkpoint put them: that fsync cost about 20 µs a commit on average.
- ``list`` and the memory index's searches, which may return many rows, stay on aiosqlite's
  thread, so that a long read never stalls the loop.
- ``append`` and ``append_writes`` (the kernel's journal, a record at every syscall;
  ``KernelSaver``'s checkpoints and writes, several at every graph step) are no commit at all
  when they come in a row: one ``write()`` into an append log beside the file
  (``sqlite_log``), as durable against the process dying as a commit with
  ``synchronous=NORMAL``. The log is folded into the file in one transaction every
  ``FOLD_EVERY`` records, ``FOLD_AFTER`` seconds after the last (at most ``FOLD_WITHIN`` after
  the oldest still in the log), ahead of this checkpointer's
  next write (in that write's transaction), and ahead of a read of a thread it holds records
  of; another connection sees an appended record once it is folded. A durable ``ctx.llm``
  went from about +100 µs over the provider call to about +63 µs so
  (``benchmarks/llm_syscall_overhead.py``), and a LangGraph graph's nine commits a run to
  about one every two runs (``benchmarks/checkpointers.py``).
"""

from __future__ import annotations

import asyncio
import contextvars
import json
import os
import sqlite3
import threading
import time
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any, Literal

import aiosqlite

from ringzero.checkpointers._filters import list_query, pushable, selected
from ringzero.checkpointers.sqlite_log import (
    CHECKPOINT,
    FOLD_AFTER,
    FOLD_EVERY,
    FOLD_WITHIN,
    FOLDED_SCHEMA,
    PUT_CHECKPOINT,
    RESTART_AFTER,
    WRITE,
    AppendLog,
    Entry,
    Row,
    fold_orphans,
    fold_statements,
    other_logs,
    write_statements,
)
from ringzero.checkpointers.sqlite_memory import MEMORY_SCHEMA, SqliteMemoryIndex, move_record_memories
from ringzero.core.errors import CheckpointerError, Closed, InvalidArgument
from ringzero.core.protocols import CheckpointerCapabilities
from ringzero.core.timeouts import shielded
from ringzero.core.types import JSON, Checkpoint, PendingWrite, json_encoder

__all__ = ["SqliteCheckpointer"]

SCHEMA_VERSION = 2
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
_SCHEMA_2 = """
CREATE INDEX IF NOT EXISTS checkpoints_run_id ON checkpoints (json_extract(metadata, '$.run_id'))
    WHERE json_extract(metadata, '$.run_id') IS NOT NULL;
""" + MEMORY_SCHEMA
_MIGRATIONS = {0: _SCHEMA + _SCHEMA_2, 1: _SCHEMA_2}
"""What brings a file of each older version to SCHEMA_VERSION (0: a new file)."""

_WRITES = ("(SELECT json_group_array(json_array(w.task_id, w.channel, hex(w.value), w.task_path, w.idx)) "
           "FROM writes w WHERE w.thread_id=c.thread_id AND w.namespace=c.namespace AND w.checkpoint_id=c.id)")
_SELECT = f"SELECT c.thread_id, c.namespace, c.id, c.parent_id, c.payload, c.metadata, {_WRITES} FROM checkpoints c"
"""A checkpoint with its writes, in one statement (the writes as JSON, their values in hex)."""


_PUT = PUT_CHECKPOINT

FOLD_HERE_AT_MOST = 4096
"""Rows a fold may commit on the loop's thread (about 20 ms, at the 5 µs a row a large fold
costs here); a larger one, records that piled up while a fold went through aiosqlite's thread
(while the loop ran 10,000 woken processes in one turn, say), commits there instead: folded on
the loop, those 48,000 rows stalled every process for 280 ms, and the wake of 10,000 processes
one after another took 2.13-2.25 s instead of 1.86-1.96 s (``benchmarks/idle_processes.py``).
Not lower: at 1,024 the piles of a steady stream of appends (about 3,000 rows, gathered during
a WAL checkpoint's RESTART) went there too, and ``benchmarks/wal_growth.py`` appended a quarter
fewer rows a second (on aiosqlite's thread a fold hands the GIL to the loop and back at every
row), for a longest stall of 3 ms instead of 73."""

CHECK_FILE_AFTER = 0.005
"""Seconds an append trusts the last check that the file is still the one opened (a ``stat``,
``_file_gone``): a graph's nine appends in a few milliseconds make one, not nine. A commit,
a fold included, checks every time, so an append to a deleted file fails at the latest this
long after it, or at the fold of its record."""

CHECKPOINT_EVERY = 1000
"""Rows committed on the fast path between two WAL checkpoints (SQLite's own default is every
1,000 pages; a row written touches at least one)."""


class _Pending:
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


class _Fold(_Pending):
    """A fold of the append log (``SqliteCheckpointer._fold``): the rows it takes from the
    line, to put back if it fails, and whether its end was seen to (``_folded``)."""

    __slots__ = ("entries", "seen")

    def __init__(self, entries: list[Entry], name: str, seq: int) -> None:
        super().__init__(fold_statements(entries, name, seq), None)
        self.entries = entries
        self.seen = False


_NO_CONTEXT = contextvars.Context()
"""The context the log's callbacks run in: the appender's own would keep its process (its
``Context``, set in a context variable) alive until the callback ran (``tests/test_lean_records.py``)."""


_metadata_json = json_encoder()
"""Metadata as compact JSON, through the C encoder directly (``json_encoder``): a microsecond
less than ``json.dumps`` for each of the rows a process writes at every step."""


def _checkpoint_row(checkpoint: Checkpoint) -> Row:
    """``checkpoint`` as a row of the ``checkpoints`` table."""
    metadata = checkpoint.metadata
    return (checkpoint.thread_id, checkpoint.namespace, checkpoint.id, checkpoint.parent_id, checkpoint.payload,
            _metadata_json(metadata if type(metadata) is dict else dict(metadata)) if metadata else "{}")


def _write_rows(thread_id: str, namespace: str, checkpoint_id: str, writes: Sequence[PendingWrite]) -> list[Row]:
    """``writes`` as rows of the ``writes`` table."""
    return [(thread_id, namespace, checkpoint_id, w.task_id, w.idx, w.channel, w.value, w.task_path) for w in writes]


def _write(conn: sqlite3.Connection, batch: Sequence[_Pending]) -> bool:
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
                if _busy(exc):
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


def _write_each_alone(conn: sqlite3.Connection, batch: Sequence[_Pending]) -> bool:
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


def _run(conn: sqlite3.Connection, item: _Pending) -> int:
    """Run one writer's statements in the open transaction; the rows they changed."""
    changed = 0
    for sql, rows in item.statements:
        if len(rows) == 1:
            changed += conn.execute(sql, rows[0]).rowcount
        elif rows:
            changed += conn.executemany(sql, rows).rowcount
    return changed


def _commit(conn: sqlite3.Connection, batch: Sequence[_Pending]) -> bool:
    try:
        conn.execute("COMMIT")
    except BaseException as exc:
        return _failed(conn, batch, exc)
    return True


def _failed(conn: sqlite3.Connection, batch: Sequence[_Pending], exc: BaseException) -> bool:
    """Roll back the open transaction and give ``exc`` to each write of ``batch`` without an
    error of its own; False (nothing committed)."""
    if conn.in_transaction:
        conn.execute("ROLLBACK")
    for item in batch:
        item.error = item.error or exc
    return False


def _identity(path: Path) -> tuple[int, int] | None:
    """(device, inode) of the file at ``path``; None where there is none."""
    try:
        found = os.stat(path)
    except FileNotFoundError:
        return None
    return found.st_dev, found.st_ino


def _others_ready(loop: asyncio.AbstractEventLoop) -> bool:
    """Whether anything else may run in this turn of ``loop`` (and could join a write batch):
    asyncio's own loop shows its ready queue; any other loop is assumed to have something."""
    return bool(getattr(loop, "_ready", True))


def _busy(exc: BaseException) -> bool:
    """Whether ``exc`` is SQLite saying another connection holds the lock (worth waiting for)."""
    return isinstance(exc, sqlite3.OperationalError) and ("locked" in str(exc) or "busy" in str(exc))


def _settle(batch: Sequence[_Pending]) -> None:
    """Wake each item's writer, on its own loop (the batch may hold writes from several)."""
    here = asyncio._get_running_loop()
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


class _WalCheckpoints:
    """Copies the WAL back into the database file on a thread of its own, so that the fsync a
    checkpoint ends with is never paid inside a commit on the loop.

    First a PASSIVE checkpoint copies what is there while writers go on; then a RESTART one
    copies the few frames written meanwhile and lets the next writer start the WAL over from
    its beginning (without it, a WAL written to without pause would never restart, and grow).
    While the RESTART one runs it holds the write lock, so the loop's writes go through
    aiosqlite's thread for those milliseconds instead of waiting on the loop.

    The RESTART one takes the write lock ahead of this process's own writers (``restarting``):
    left to SQLite's busy handler, which sleeps 1, 2, 5, 10... ms between tries, it lost the
    lock to the loop's commits, a few milliseconds apart, for 150 ms and more, while the WAL
    grew by thousands of pages and the writes that found it taken waited behind it."""

    def __init__(self, path: Path, busy_ms: int) -> None:
        self._path = path
        self._busy_ms = busy_ms
        self._wake = threading.Event()
        self._stop = False
        self._thread: threading.Thread | None = None
        self._since = 0
        self.runs = 0
        self.restarting = False
        """The RESTART checkpoint wants or holds the write lock: this process's writers keep off it."""
        self._restarted = threading.Event()
        self._restarted.set()

    def committed(self, rows: int = 1) -> None:
        """After a commit of ``rows`` rows: a checkpoint every ``CHECKPOINT_EVERY`` rows, each
        at least a page of the WAL (counted in commits, the folds of the append log, 14 rows
        each in a LangGraph run, let the WAL grow past 60 MB between two checkpoints)."""
        self._since += rows
        if self._since < CHECKPOINT_EVERY:
            return
        self._since = 0
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name=f"ringzero-wal-{self._path.name}", daemon=True)
            self._thread.start()
        self._wake.set()

    def _run(self) -> None:
        conn = sqlite3.connect(self._path, isolation_level=None)
        try:
            conn.execute(f"PRAGMA busy_timeout={self._busy_ms}")
            while True:
                self._wake.wait()
                self._wake.clear()
                if self._stop:
                    return
                with suppress(sqlite3.Error):  # a checkpoint that cannot run now runs next time
                    conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
                    self._restarted.clear()
                    self.restarting = True
                    try:
                        conn.execute("PRAGMA wal_checkpoint(RESTART)").fetchall()
                    finally:
                        self.restarting = False
                        self._restarted.set()
                    self.runs += 1
        finally:
            conn.close()

    def wait_for_restart(self) -> None:
        """On aiosqlite's thread, before a write: let the RESTART checkpoint have the write lock
        first (its own wait for the lock is bounded by the busy timeout, and so is this one)."""
        if self.restarting:
            self._restarted.wait(self._busy_ms / 1000)

    def close(self) -> None:
        self._stop = True
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=self._busy_ms / 1000 + 5)


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
        self._db: aiosqlite.Connection | None = None
        self._fast: sqlite3.Connection | None = None
        """The caller-thread connection (see the module docstring); None until opened, and
        with ``synchronous="FULL"``."""
        self._fast_lock = threading.Lock()
        self._closed = False
        self._opening = asyncio.Lock()
        self._pending: list[_Pending] = []
        self._pending_lock = threading.Lock()
        self._slow = 0
        """Writes on their way through aiosqlite's thread: while any are, every write goes that way."""
        self._handoffs: set[asyncio.Task[None]] = set()
        self._draining = False
        """The job that commits writes on aiosqlite's thread is running (``_drain_soon``)."""
        self._wal = _WalCheckpoints(self.path, self._busy_ms)
        self._identity: tuple[int, int] | None = None
        """The file this checkpointer opened (``_file_gone``)."""
        self.commits = 0
        """Transactions committed: fewer than writes when concurrent writes were grouped."""
        self._log: AppendLog | None = None
        """This checkpointer's append log (``sqlite_log``), made at the first ``append``."""
        self._log_usable = synchronous == "NORMAL"
        """False where ``append`` commits instead: fsync per commit asked for, or no log can be made here."""
        self._log_seq = 0
        """The sequence number of the log's last record."""
        self._unfolded: list[Entry] = []
        """The rows of the log's records not yet committed to the file, in order, with their kind."""
        self._unfolded_threads: set[str] = set()
        """The threads of the rows of ``_unfolded``: a read of another thread need not wait for a fold."""
        self._folding: _Fold | None = None
        """The fold on its way through aiosqlite's thread: one at a time, so that the records a
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

    async def _conn(self) -> aiosqlite.Connection:
        if self._db is not None:
            return self._db
        if self._closed:
            raise Closed(f"{self!r} is closed; open a new SqliteCheckpointer on the same file to go on")
        async with self._opening:
            if self._db is None:
                self._db = await self._open()
        return self._db

    async def _open(self) -> aiosqlite.Connection:
        if self._create_folder:
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
                self._identity = _identity(self.path)
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
            fast.execute("PRAGMA wal_autocheckpoint=0")  # _WalCheckpoints does it, off the loop
        except BaseException:
            fast.close()
            raise
        return fast

    async def _transaction(self, db: aiosqlite.Connection, statements: Sequence[tuple[str, Sequence[Any]]], *,
                           appended: bool = False) -> _Pending:
        """Commit ``(sql, rows)`` pairs atomically, grouped with the other writes of this turn
        of the loop; when this returns, the write is committed (see the module docstring).

        Where the loop has nothing else ready to run (asyncio's own loop shows its ready queue,
        ``_ready``), nobody could join a batch, and the write commits at once. Otherwise it
        yields once, so that every other task with work in this turn adds its own; then the
        first of them to run again commits them all, and the others find theirs done.

        Records of the append log not yet in the file go first, in the same transaction (a
        fold of their own, ``_take_fold``): one commit, and this write comes after them.
        ``appended``: rows an append commits instead (see ``append``)."""
        self._after_append = appended and self._log_usable
        loop = asyncio.get_running_loop()
        item = _Pending(statements, None)
        if self._unfolded and self._folding is not None:
            await self._fold_first(db)  # the records after the fold on its way go before this write
        fold = self._take_fold() if self._unfolded else None
        batch = [item] if fold is None else [fold, item]
        if self._fast is not None and not self._slow and self._folding is None and not _others_ready(loop) \
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

    def _write_here(self, batch: list[_Pending]) -> bool:
        """Commit ``batch`` on the caller's thread; False, with nothing written, where another
        connection holds the write lock (the batch must go through aiosqlite's thread)."""
        with self._fast_lock:
            if self._fast is None or self._wal.restarting:
                return False
            try:
                committed = _write(self._fast, batch)
            except BaseException as exc:
                if _busy(exc):
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
        if _identity(self.path) == self._identity:
            return None
        return CheckpointerError(f"SQLite file {self.path} was deleted or replaced while this kernel had it open; "
                                 "what is written now would be lost. Restore the file (or start on a new one) and "
                                 "recover() there")

    def _flush(self, db: aiosqlite.Connection) -> None:
        """Commit every write waiting, on the caller's thread, or hand them to aiosqlite's
        thread if another connection holds the write lock."""
        with self._pending_lock:
            if self._slow or not self._pending:
                return  # taken by another flush, or on their way through aiosqlite's thread
            batch, self._pending = self._pending, []
        if self._write_here(batch):
            _settle(batch)
            return
        with self._pending_lock:
            self._pending[:0] = batch  # first in line, ahead of anything written since
            self._drain_soon(db)

    def _drain_soon(self, db: aiosqlite.Connection) -> None:
        """Start the one job that commits the waiting writes on aiosqlite's thread, unless it is
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

    async def _drain_until_caught_up(self, db: aiosqlite.Connection) -> None:
        try:
            while not await db._execute(self._drain, db._conn, job=True):  # type: ignore[no-untyped-call]
                pass
        except asyncio.CancelledError:
            raise  # the loop is closing; the commit in flight on the thread wakes its writers itself
        except BaseException as exc:  # aiosqlite's thread is gone: fail what waits rather than hang it
            with self._pending_lock:
                batch, self._pending = self._pending, []
                self._draining = False
                self._slow -= 1
            for item in batch:
                item.error = exc
            _settle(batch)

    def _drain(self, conn: sqlite3.Connection, *, job: bool = False) -> bool:
        """On aiosqlite's thread (which waits up to ``busy_timeout`` for the write lock): commit
        every write waiting, in the order written, and wake their writers. For the drain job
        (``job``): True when nothing is left waiting, and the job is over: that is settled before
        the writers wake, so that one that writes again at once finds the fast path open (woken
        first, it came back while the job still ran, and kept it going one write at a time)."""
        self._wal.wait_for_restart()
        with self._pending_lock:
            batch, self._pending = self._pending, []
        try:
            if batch and _write(conn, batch):  # none: an earlier drain committed them
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
        _settle(batch)
        return caught_up

    def _read_here(self, sql: str, params: Sequence[Any]) -> list[Any] | None:
        """A short read on the caller's thread; None where the fast path cannot answer it now."""
        with self._fast_lock:
            if self._fast is None:
                return None
            try:
                return self._fast.execute(sql, params).fetchall()
            except sqlite3.OperationalError as exc:
                if _busy(exc):
                    return None
                raise

    async def _enable_wal(self, db: aiosqlite.Connection) -> None:
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

    async def put(self, checkpoint: Checkpoint) -> None:
        db = self._db or await self._conn()
        row = _checkpoint_row(checkpoint)
        try:  # not self._errors(): a context manager costs a few µs, and this runs at every syscall
            if not self._put_here(row):
                await self._transaction(db, [(_PUT, [row])])
        except sqlite3.Error as exc:
            raise CheckpointerError(f"SQLite file {self.path}: put failed: {exc}") from exc

    async def put_many(self, checkpoints: Sequence[Checkpoint]) -> None:
        """Store each, in order, in one transaction (grouped with the other writes of this turn)."""
        await self._put_rows([_checkpoint_row(cp) for cp in checkpoints])

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
                or _others_ready(asyncio.get_running_loop()):
            return False
        with self._fast_lock:
            try:
                fast.execute(_PUT, row)
            except sqlite3.OperationalError as exc:
                if _busy(exc):
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
        ``write()`` into the append log (``sqlite_log``) instead of a commit. Other connections
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
        row = _checkpoint_row(checkpoint)
        if await self._append(CHECKPOINT, [row]):
            await self._commit_appended([(_PUT, [row])], "append", row)
            self._after_append = self._log_usable

    async def append_many(self, checkpoints: Sequence[Checkpoint]) -> None:
        """``put_many`` as ``append`` is ``put``: the checkpoints as one record of the log, so
        that a crash keeps all of them or none (the kernel's transitions, status and state rows
        of a process)."""
        rows = [_checkpoint_row(cp) for cp in checkpoints]
        if rows and await self._append(CHECKPOINT, rows):
            await self._commit_appended([(_PUT, rows)], "append_many")
            self._after_append = self._log_usable

    async def append_writes(
        self, thread_id: str, namespace: str, checkpoint_id: str, writes: Sequence[PendingWrite]
    ) -> None:
        """``put_writes`` as ``append`` is ``put``: one ``write()`` into the append log."""
        rows = _write_rows(thread_id, namespace, checkpoint_id, writes)
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

    def _fold_later(self, db: aiosqlite.Connection) -> None:
        """Fold once no record was appended for ``FOLD_AFTER`` seconds, or ``FOLD_WITHIN`` from
        now, whichever comes first; the timer runs in an empty context (see ``_NO_CONTEXT``)."""
        loop = asyncio.get_running_loop()
        self._appended_at = self._unfolded_since = loop.time()
        self._fold_timer = loop.call_later(min(FOLD_AFTER, FOLD_WITHIN), self._fold_due, db, context=_NO_CONTEXT)

    def _fold_due(self, db: aiosqlite.Connection) -> None:
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

    def _take_fold(self) -> _Fold | None:
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
        return _Fold(entries, log.name, self._log_seq)

    def _line_up(self, fold: _Fold) -> None:
        """Make ``fold`` wait in the line of writes (the caller appends it): ``_folding`` until done."""
        fold.future = asyncio.get_running_loop().create_future()
        self._folding = fold
        fold.future.add_done_callback(lambda _: self._folded(fold))

    def _fold(self, db: aiosqlite.Connection) -> _Fold | None:
        """Commit the log's records not yet in the file, in one transaction: at once on this
        thread where it can, else in line on aiosqlite's thread. None: nothing to fold now."""
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

    def _folded(self, fold: _Fold) -> None:
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

    async def _fold_first(self, db: aiosqlite.Connection) -> None:
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
        row = _checkpoint_row(checkpoint)
        with self._errors("claim"):
            done = await self._transaction(db, [("INSERT OR IGNORE INTO checkpoints VALUES (?, ?, ?, ?, ?, ?)", [row])])
        return done.changed == 1

    async def put_writes(
        self, thread_id: str, namespace: str, checkpoint_id: str, writes: Sequence[PendingWrite]
    ) -> None:
        db = await self._conn()
        rows = _write_rows(thread_id, namespace, checkpoint_id, writes)
        with self._errors("put_writes"):  # a special (negative idx) write replaces, others are kept first
            await self._transaction(db, write_statements(rows))

    async def get(self, thread_id: str, namespace: str = "", checkpoint_id: str | None = None) -> Checkpoint | None:
        db = await self._conn()
        if self._unfolded_for(thread_id):
            await self._fold_first(db)
        params: tuple[str, ...] = (thread_id, namespace)
        if checkpoint_id is None:
            sql = f"{_SELECT} WHERE thread_id=? AND namespace=? ORDER BY id DESC LIMIT 1"
        else:
            sql, params = f"{_SELECT} WHERE thread_id=? AND namespace=? AND id=?", (*params, checkpoint_id)
        with self._errors("get"):
            rows = self._read_here(sql, params)
            if rows is None:
                rows = list(await db.execute_fetchall(sql, params))
            return next((_checkpoint(row) for row in rows), None)

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
        sql, params = list_query(_SELECT, "?", thread_id, namespace, before, pushed)
        if limit is not None and not filter:
            sql += f" LIMIT {int(limit)}"
        with self._errors("list"):
            await self._fold_orphans(db)
            rows = list(await db.execute_fetchall(sql, params))
        for row in selected(rows, lambda r: json.loads(r[5]), filter, limit):
            yield _checkpoint(row)

    async def _fold_orphans(self, db: aiosqlite.Connection) -> None:
        """Fold the logs of checkpointers that died with records in them (``sqlite_log``): at
        open, and at each ``list`` (how a kernel recovering processes reads their journals)."""
        names = other_logs(self.path, self._log)
        if names:
            await db._execute(fold_orphans, db._conn, names, self._identity)  # type: ignore[no-untyped-call]

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
            return list(await db.execute_fetchall(sql, params))

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
                self._slow += 1  # what is still waiting goes through aiosqlite's thread
            try:
                await db._execute(self._drain, db._conn)  # type: ignore[no-untyped-call]
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


def _checkpoint(row: Any) -> Checkpoint:
    thread_id, namespace, cid, parent_id, payload, metadata, writes = row
    return Checkpoint(
        thread_id=thread_id, namespace=namespace, id=cid, parent_id=parent_id, payload=bytes(payload),
        metadata=json.loads(metadata),
        writes=tuple(PendingWrite(t, c, bytes.fromhex(v), p, i) for t, c, v, p, i in json.loads(writes)))
