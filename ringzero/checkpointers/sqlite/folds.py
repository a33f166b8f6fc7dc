"""The append log's records on their way into the file: appended, waiting, folded.

An append writes one record into the log (``log``) and returns; its rows wait in ``unfolded``
until a fold commits them in one transaction: every ``FOLD_EVERY`` records, ``FOLD_AFTER``
seconds after the last append (at most ``FOLD_WITHIN`` after the oldest waiting), ahead of the
checkpointer's next other write (in that write's transaction), and ahead of a read of a thread
they hold. Folds go one at a time, so that the records a fold marks as folded are always all
those before it.

Records come from the event loop (``append``) and from any other thread (``append_here``: a
sandbox's thread journaling the tool calls its code makes). The log, its sequence numbers and
the records waiting are kept under one lock; the folds and their timers stay on the loop, which
a record appended elsewhere wakes (once, until it has looked).
"""

from __future__ import annotations

import asyncio
import contextvars
import threading
import time
import weakref
from contextlib import suppress

from ringzero.checkpointers.sqlite.commit import Fold
from ringzero.checkpointers.sqlite.log import (
    FOLD_AFTER,
    FOLD_EVERY,
    FOLD_WITHIN,
    RESTART_AFTER,
    AppendLog,
    Entry,
    Row,
    fold_orphans,
    other_logs,
)
from ringzero.checkpointers.sqlite.writer import Writer
from ringzero.core.contract.errors import CheckpointerError
from ringzero.core.support.loops import before_stop
from ringzero.core.support.timeouts import shielded

__all__ = ["CHECK_FILE_AFTER", "FOLD_HERE_AT_MOST", "LogFolds"]

FOLD_HERE_AT_MOST = 4096
"""Rows a fold may commit on the loop's thread (some 20 ms of work); a larger one (records that
piled up while a fold waited on the waiting thread) commits there instead, so that no fold
stalls every process for long. Not much lower either: a steady stream of appends piles up a few
thousand rows during a WAL checkpoint's RESTART, and those fold faster on the loop, where a fold
does not hand the GIL back and forth at every row."""

CHECK_FILE_AFTER = 0.005
"""Seconds an append trusts the last check that the file is still the one opened (a ``stat``,
``Writer.file_gone``): a graph's nine appends in a few milliseconds make one, not nine. A
commit, a fold included, checks every time, so an append to a deleted file fails at the latest
this long after it, or at the fold of its record."""

_NO_CONTEXT = contextvars.Context()
"""The context the fold timer runs in: the appender's own would keep its process (its
``Context``, set in a context variable) alive until the timer ran."""


class LogFolds:
    """One checkpointer's append log and the records of it not yet in the file."""

    def __init__(self, writer: Writer, *, usable: bool) -> None:
        self.writer = writer
        self.log: AppendLog | None = None
        """The append log, made at the first append that goes to it."""
        self.usable = usable
        """False where appends commit instead: fsync per commit asked for, or no log can be made here."""
        self.after_append = False
        """The store's last write was an append: only then does the next append go to the log."""
        self._seq = 0
        """The sequence number of the log's last record."""
        self.unfolded: list[Entry] = []
        """The rows of the log's records not yet committed to the file, in order, with their kind."""
        self._unfolded_threads: set[str] = set()
        """The threads of the rows of ``unfolded``: a read of another thread need not wait for a fold."""
        self.folding: Fold | None = None
        """The fold on its way through the waiting thread (one at a time)."""
        self._timer: asyncio.TimerHandle | None = None
        self._appended_at = 0.0
        """The loop's time of the last append: the log is folded ``FOLD_AFTER`` after it."""
        self._file_checked_until = 0.0
        """The loop's time until which an append need not check the file again (``CHECK_FILE_AFTER``)."""
        self._unfolded_since = 0.0
        """The loop's time when the fold timer was set: the log is folded ``FOLD_WITHIN`` after it."""
        self._error: BaseException | None = None
        """Why the last fold failed (its rows stay in the log, and wait for the next fold)."""
        self.folds = 0
        """Folds committed."""
        self._folds_before_stop: weakref.ref[asyncio.AbstractEventLoop] | None = None
        """The loop that folds this log before it stops (``before_stop``), weakly."""
        self._lock = threading.Lock()
        """Held while the log is written or started over, and while ``unfolded`` and ``_seq``
        change: records come from other threads too (``append_here``)."""
        self._loop: asyncio.AbstractEventLoop | None = None
        """The loop the appends and folds run on (that of the last ``append``)."""
        self._woken = False
        """A record appended on another thread has asked the loop to look (``_arrived``)."""

    @property
    def idle(self) -> bool:
        """No record waits to be folded, and no fold is on its way."""
        return not self.unfolded and self.folding is None

    def wrote(self, *, appended: bool) -> None:
        """The store wrote (an append that committed, or another write): the next append goes
        to the log only after an append."""
        self.after_append = appended and self.usable

    async def append(self, kind: int, rows: list[Row]) -> bool:
        """Write ``rows`` as one record of the log; True where the caller must commit them
        instead (no log here, or the last write was not an append)."""
        log = (self.log or self._make_log()) if self.after_append and self.usable else None
        if log is None:
            return True
        if self._error is not None:  # the last fold failed: again now, raising if it fails again
            self._error = None
            await self.fold_first()
        loop = self._loop = asyncio.get_running_loop()
        now = loop.time()
        self._check_file(now)
        with self._lock:
            self._write(log, kind, rows)
        if len(self.unfolded) >= FOLD_EVERY:
            self.fold()
        elif self._timer is None:
            self._fold_later()
        else:
            self._appended_at = now
        return False

    def append_here(self, kind: int, rows: list[Row]) -> bool:
        """``append`` from any thread but the loop's: the record written into the log, durable
        when this returns True; False where it must go through the loop instead (the log is
        not made yet, the store's last write was not an append, a fold failed: ``append``
        decides those there). The loop is woken to fold it in time."""
        loop, log = self._loop, self.log
        if loop is None or log is None or not self.after_append or not self.usable or self._error is not None:
            return False
        now = time.monotonic()
        self._check_file(now)
        with self._lock:
            if self.log is not log or not self.after_append:  # closed, or a write came between meanwhile
                return False
            self._write(log, kind, rows)
            self._appended_at = now
            wake = not self._woken and (self._timer is None or len(self.unfolded) >= FOLD_EVERY)
            self._woken = self._woken or wake
        if wake:
            with suppress(RuntimeError):  # the loop is closed: the record is in the log, folded at the next open
                loop.call_soon_threadsafe(self._arrived, context=_NO_CONTEXT)
        return True

    def _arrived(self) -> None:
        """On the loop, woken by a record appended on another thread: fold, or set the timer."""
        with self._lock:
            self._woken = False
        if len(self.unfolded) >= FOLD_EVERY:
            self.fold()
        elif self.unfolded and self._timer is None and self.writer.db is not None:
            self._fold_later()

    def _check_file(self, now: float) -> None:
        """Raise where the file opened is gone (checked at most every ``CHECK_FILE_AFTER`` s)."""
        if now >= self._file_checked_until:
            gone = self.writer.file_gone()
            if gone is not None:
                raise gone
            self._file_checked_until = now + CHECK_FILE_AFTER

    def _write(self, log: AppendLog, kind: int, rows: list[Row]) -> None:
        """One record into the log, and its rows into ``unfolded`` (the lock held)."""
        try:
            log.append(self._seq + 1, rows, kind)
        except OSError as exc:  # the log may end in a torn record now: no more records after it
            self.usable = self.after_append = False
            raise CheckpointerError(f"SQLite file {self.writer.path}: writing its append log {log.path} failed: "
                                    f"{exc}") from exc
        self._seq += 1
        if len(rows) == 1:
            self.unfolded.append((kind, rows[0]))
            self._unfolded_threads.add(rows[0][0])
        else:
            self.unfolded.extend((kind, row) for row in rows)
            self._unfolded_threads.update(row[0] for row in rows)

    def _make_log(self) -> AppendLog | None:
        """The append log, made now; None where appends commit instead."""
        if not self.usable or not self.writer.has_fast_path or self.writer.identity is None:
            return None
        try:
            self.log = AppendLog(self.writer.path, self.writer.identity)
        except (ImportError, OSError):  # no flock (not Unix), or the folder takes no new file
            self.usable = False
        return self.log

    def _fold_later(self) -> None:
        """Fold once no record was appended for ``FOLD_AFTER`` seconds, or ``FOLD_WITHIN`` from
        now, whichever comes first; the timer runs in an empty context (see ``_NO_CONTEXT``)."""
        loop = asyncio.get_running_loop()
        self._appended_at = self._unfolded_since = loop.time()
        self._timer = loop.call_later(min(FOLD_AFTER, FOLD_WITHIN), self._fold_due, context=_NO_CONTEXT)
        if self._folds_before_stop is None or self._folds_before_stop() is not loop:
            self._folds_before_stop = weakref.ref(loop)
            before_stop(self.fold_first)  # a loop ringzero stops (the runtime loop) folds this log first

    def _fold_due(self) -> None:
        """The fold timer: fold now, or wait on where appends since it was set push the fold."""
        loop = asyncio.get_running_loop()
        wait = min(self._appended_at + FOLD_AFTER, self._unfolded_since + FOLD_WITHIN) - loop.time()
        if wait > 0:
            self._timer = loop.call_later(wait, self._fold_due, context=_NO_CONTEXT)
            return
        self._timer = None
        self.fold()

    def unfolded_for(self, thread_id: str | None) -> bool:
        """Whether a read of ``thread_id`` (None: every thread) must wait for a fold: records of
        it are appended and not yet in the file. A read of another thread reads the file as it
        is, so that appends in a row (a graph's steps, a process's syscalls) fold together, not
        at every read in between."""
        if self.folding is not None:
            return True
        return bool(self.unfolded) and (thread_id is None or thread_id in self._unfolded_threads)

    def take_fold(self) -> Fold | None:
        """The records not yet in the file, taken from the line as one write; None where there
        are none, or a fold is on its way."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        with self._lock:
            log, entries = self.log, self.unfolded
            if not entries or log is None or self.folding is not None:
                return None
            self.unfolded = []
            self._unfolded_threads = set()
            return Fold(entries, log.name, self._seq)

    def line_up(self, fold: Fold) -> None:
        """Make ``fold`` wait in the line of writes (the caller puts it there): ``folding`` until done."""
        future = fold.wait_for_commit()
        self.folding = fold
        future.add_done_callback(lambda _: self.folded(fold))

    def fold(self) -> Fold | None:
        """Commit the records not yet in the file, in one transaction: at once on this thread
        where it can, else in line on the waiting thread. None: nothing to fold now."""
        fold = self.take_fold()
        if fold is None:
            return None
        writer = self.writer
        if not writer.slow and len(fold.entries) <= FOLD_HERE_AT_MOST and writer.write_here([fold]):
            self.folded(fold)
            return fold
        self.line_up(fold)
        writer.to_waiting_thread(fold)
        return fold

    def folded(self, fold: Fold) -> None:
        """After a fold (once, whoever sees it end first): the log starts over if nothing was
        appended meanwhile and it passed ``RESTART_AFTER`` bytes; a failed fold's rows go back
        to the front of the line, and the next append folds before it writes (raising if that
        fails too)."""
        if fold.see_to():
            return
        if self.folding is fold:
            self.folding = None
        if fold.error is not None:
            with self._lock:
                self.unfolded[:0] = fold.entries
                self._unfolded_threads.update(row[0] for _, row in fold.entries)
            self._error = fold.error
            return
        self.folds += 1
        with self._lock:  # never started over under a record appended meanwhile on another thread
            restart = self.log is not None and not self.unfolded and self.log.size > RESTART_AFTER
            if restart and self.log is not None:
                with suppress(OSError):  # not started over: its records are folded again, and skipped
                    self.log.restart()
        if not restart and self.unfolded and self._timer is None and self.writer.db is not None:
            self._fold_later()

    async def fold_first(self) -> None:
        """Before a read, or a write that cannot join the fold's transaction: every record
        appended so far is in the file, so that what follows sees it and comes after it.
        Raises the fold's error."""
        while self.unfolded or self.folding is not None:
            fold = self.folding or self.fold()
            if fold is None:
                return
            if fold.future is not None and not fold.future.done():
                await shielded(fold.future)
            self.folded(fold)
            if fold.error is not None:
                self._error = None
                raise CheckpointerError(f"SQLite file {self.writer.path}: committing its append log failed: "
                                        f"{fold.error}") from fold.error

    async def fold_orphans(self) -> None:
        """Fold the logs of checkpointers that died with records in them: at open, and at each
        ``list`` (how a kernel recovering processes reads their journals)."""
        writer = self.writer
        names = other_logs(writer.path, self.log)
        if names and writer.db is not None:
            await writer.db.call(fold_orphans, names, writer.identity)

    def stop_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def close(self, *, remove: bool) -> str | None:
        """Close the log (and delete it where ``remove``); the name of a log deleted."""
        with self._lock:
            log, self.log = self.log, None
            remove = remove and not self.unfolded  # a record appended on another thread meanwhile stays
        if log is None:
            return None
        log.close(remove=remove)
        return log.name if remove else None
