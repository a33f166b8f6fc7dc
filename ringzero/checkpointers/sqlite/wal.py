"""WAL checkpoints on a thread of their own (see ``WalCheckpoints``)."""

from __future__ import annotations

import sqlite3
import threading
from contextlib import suppress
from pathlib import Path

__all__ = ["CHECKPOINT_EVERY", "WalCheckpoints"]

CHECKPOINT_EVERY = 1000
"""Rows committed on the fast path between two WAL checkpoints (SQLite's own default is every
1,000 pages; a row written touches at least one)."""


class WalCheckpoints:
    """Copies the WAL back into the database file on a thread of its own, so that the fsync a
    checkpoint ends with is never paid inside a commit on the loop.

    First a PASSIVE checkpoint copies what is there while writers go on; then a RESTART one
    copies the few frames written meanwhile and lets the next writer start the WAL over from
    its beginning (without it, a WAL written to without pause would never restart, and grow).
    While the RESTART one runs it holds the write lock, so the loop's writes go through
    the waiting thread for those milliseconds instead of waiting on the loop.

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
        """On the waiting thread, before a write: let the RESTART checkpoint have the write lock
        first (its own wait for the lock is bounded by the busy timeout, and so is this one)."""
        if self.restarting:
            self._restarted.wait(self._busy_ms / 1000)

    def close(self) -> None:
        self._stop = True
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=self._busy_ms / 1000 + 5)
