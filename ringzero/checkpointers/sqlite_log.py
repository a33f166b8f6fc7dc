"""The append log beside a SqliteCheckpointer's file: a record durable in one ``write()``.

A commit in SQLite's WAL mode costs six lock calls, two writes and the B-tree's work, about
15 µs alone and over 30 µs between the kernel's own work; the kernel's journal wrote one at
every syscall. ``SqliteCheckpointer.append`` writes the record into this log instead, one
``write()`` of a checksummed frame, and returns: once in the operating system's page cache
the record survives the host process being killed, which is what ``synchronous=NORMAL``
promises for a commit too. The checkpointer folds the log's records into the SQLite file in
one transaction every ``FOLD_EVERY`` records, a moment after the last one, and before any other
read or write of its own; the log starts over once it is all folded and past
``RESTART_AFTER`` bytes (a folded record left in it is skipped by its sequence number).

Each checkpointer has a log of its own, ``<file>-rzlog-<token>``, and holds an exclusive
``flock`` on it while open. A log nobody holds is an orphan (its kernel died): whoever opens
the file next, or lists it, folds it and deletes it. The table ``ringzero_folded_logs`` keeps,
per log, the last record folded, in the same transaction as the fold, so that a record is
folded once even if the folder died between its commit and the log's deletion.
"""

from __future__ import annotations

import glob
import os
import sqlite3
import struct
import zlib
from collections.abc import Iterator, Sequence
from contextlib import suppress
from pathlib import Path
from typing import Any

__all__ = ["FOLDED_SCHEMA", "FOLD_AFTER", "FOLD_EVERY", "RESTART_AFTER", "AppendLog", "Row", "fold_orphans",
           "folded_statement", "other_logs", "records"]

FOLD_EVERY = 64
"""Records appended before the log is folded at once (one transaction for all of them)."""

FOLD_AFTER = 0.005
"""Seconds after an append before the log is folded, so that other connections to the file
(``ringzero ps``, another kernel) see the records soon even when few are written."""

RESTART_AFTER = 1 << 20
"""Bytes past which a log whose records are all folded starts over (``AppendLog.restart``).
Below it, folded records stay and a dead kernel's fold skips them by their sequence number:
an ``ftruncate`` per fold cost about as much as the record's own ``write()``."""

FOLDED_SCHEMA = "CREATE TABLE IF NOT EXISTS ringzero_folded_logs (name TEXT PRIMARY KEY, seq INTEGER NOT NULL)"

_MAGIC = b"RZLOG1\n"
_IDENTITY = struct.Struct("!QQ")
"""After the magic: (device, inode) of the SQLite file the log belongs to."""
_HEADER_SIZE = len(_MAGIC) + _IDENTITY.size
_FRAME = struct.Struct("!II")
"""A record's frame: the body's length and its CRC-32 (a record cut short at a crash fails it)."""
_RECORD = struct.Struct("!QI")
"""A body starts with the record's sequence number and its number of rows."""
_FIELD = struct.Struct("!i")
"""Each field of a row: its length in bytes (-1: NULL), then the bytes."""

Row = tuple[Any, ...]
"""A row of the ``checkpoints`` table: thread_id, namespace, id, parent_id, payload, metadata."""


def folded_statement(name: str, seq: int) -> tuple[str, Sequence[tuple[str, int]]]:
    """The statement that records records up to ``seq`` of log ``name`` as folded."""
    return "INSERT OR REPLACE INTO ringzero_folded_logs VALUES (?, ?)", [(name, seq)]


def encode(seq: int, rows: Sequence[Row]) -> bytes:
    """One record: its frame and body."""
    parts = [_RECORD.pack(seq, len(rows))]
    for row in rows:
        for value in row:
            if value is None:
                parts.append(_FIELD.pack(-1))
                continue
            data = value.encode() if isinstance(value, str) else bytes(value)
            parts.append(_FIELD.pack(len(data)))
            parts.append(data)
    body = b"".join(parts)
    return _FRAME.pack(len(body), zlib.crc32(body)) + body


def records(data: bytes) -> Iterator[tuple[int, list[Row]]]:
    """(seq, rows) of each whole record of a log's contents after its header, in order; stops
    at the first frame cut short or failing its checksum (a write a crash interrupted)."""
    offset = _HEADER_SIZE
    while offset + _FRAME.size <= len(data):
        length, crc = _FRAME.unpack_from(data, offset)
        body = data[offset + _FRAME.size:offset + _FRAME.size + length]
        if len(body) != length or zlib.crc32(body) != crc:
            return
        offset += _FRAME.size + length
        yield _decode(body)


def _decode(body: bytes) -> tuple[int, list[Row]]:
    seq, count = _RECORD.unpack_from(body)
    at = _RECORD.size
    rows = []
    for _ in range(count):
        row: list[Any] = []
        for column in range(6):
            (length,) = _FIELD.unpack_from(body, at)
            at += _FIELD.size
            if length < 0:
                row.append(None)
                continue
            data = body[at:at + length]
            at += length
            row.append(data if column == 4 else data.decode())
        rows.append(tuple(row))
    return seq, rows


class AppendLog:
    """This checkpointer's own log: created with a unique name, locked while open."""

    def __init__(self, db_path: Path, identity: tuple[int, int]) -> None:
        import fcntl  # Unix only: SqliteCheckpointer commits each record where it is missing

        self.path = Path(f"{db_path}-rzlog-{os.urandom(8).hex()}")
        self.name = self.path.name
        self.size = 0
        """Bytes in the log, its header included."""
        self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            self._write(_MAGIC + _IDENTITY.pack(*identity))
        except BaseException:
            self.close(remove=True)
            raise

    def append(self, seq: int, rows: Sequence[Row]) -> None:
        """Write one record; durable against the process dying once this returns."""
        self._write(encode(seq, rows))

    def _write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            view = view[os.write(self._fd, view):]
        self.size += len(data)

    def restart(self) -> None:
        """Drop every record (all folded): the log is its header again."""
        os.ftruncate(self._fd, _HEADER_SIZE)
        self.size = _HEADER_SIZE

    def close(self, *, remove: bool) -> None:
        """Close the log (its lock goes with it); ``remove``: delete it first (all folded)."""
        if remove:
            with suppress(FileNotFoundError):
                os.unlink(self.path)
        os.close(self._fd)


def other_logs(db_path: Path, own: AppendLog | None) -> list[str]:
    """The paths of the logs of ``db_path`` but ``own``: each is an orphan or another
    checkpointer's (``fold_orphans`` tells them apart). A directory listing, on the caller's thread."""
    found = glob.glob(glob.escape(str(db_path)) + "-rzlog-*")
    return sorted(name for name in found if own is None or name != str(own.path))


def fold_orphans(conn: sqlite3.Connection, names: Sequence[str], identity: tuple[int, int] | None) -> int:
    """Fold each log of ``names`` whose checkpointer is gone (nobody holds its lock) into the
    file through ``conn``, each in one transaction, and delete it; the rows folded. A log
    written for another file at this path (deleted and made anew since) is left alone."""
    try:
        import fcntl
    except ImportError:
        return 0
    folded = 0
    for name in names:
        try:
            fd = os.open(name, os.O_RDWR | os.O_CLOEXEC)
        except FileNotFoundError:
            continue  # folded by another kernel meanwhile
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue  # its checkpointer is alive
            try:
                if os.stat(name).st_ino != os.fstat(fd).st_ino:
                    continue  # folded and deleted by another kernel after this one opened it
            except FileNotFoundError:
                continue
            data = _read_all(fd)
            if data[:len(_MAGIC)] != _MAGIC or (
                    len(data) < _HEADER_SIZE or _IDENTITY.unpack_from(data, len(_MAGIC)) != identity):
                continue
            folded += _fold_one(conn, Path(name).name, data)
            os.unlink(name)
            conn.execute("DELETE FROM ringzero_folded_logs WHERE name=?", (Path(name).name,))
        finally:
            os.close(fd)
    return folded


def _read_all(fd: int) -> bytes:
    parts = []
    while chunk := os.read(fd, 1 << 20):
        parts.append(chunk)
    return b"".join(parts)


def _fold_one(conn: sqlite3.Connection, name: str, data: bytes) -> int:
    """Commit the records of log ``name`` not folded before; how many rows."""
    found = conn.execute("SELECT seq FROM ringzero_folded_logs WHERE name=?", (name,)).fetchone()
    done = found[0] if found else 0
    rows: list[Row] = []
    last = done
    for seq, record_rows in records(data):
        if seq > done:
            rows.extend(record_rows)
            last = seq
    if not rows:
        return 0
    conn.execute("BEGIN IMMEDIATE")
    try:
        conn.executemany("INSERT OR REPLACE INTO checkpoints VALUES (?, ?, ?, ?, ?, ?)", rows)
        sql, params = folded_statement(name, last)
        conn.executemany(sql, params)
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")
    return len(rows)
