"""The append log beside a SqliteCheckpointer's file: a record durable in one ``write()``.

A commit in SQLite's WAL mode costs six lock calls, two writes and the B-tree's work, and the
kernel's journal writes a record at every syscall. ``SqliteCheckpointer.append`` writes the
record into this log instead, one ``write()`` of a checksummed frame, and returns: once in the
operating system's page cache the record survives the host process being killed, which is
what ``synchronous=NORMAL`` promises for a commit too. A record holds rows of one table (its
kind: ``CHECKPOINT`` from ``append``, ``WRITE`` from ``append_writes``). The checkpointer folds the log's records into
the SQLite file in one transaction every ``FOLD_EVERY`` records, a moment after the last one,
before any other write of its own and before a read of a thread they hold; the log starts
over once it is all folded and past ``RESTART_AFTER`` bytes (a folded record left in it is
skipped by its sequence number).

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

__all__ = ["CHECKPOINT", "FOLDED_SCHEMA", "FOLD_AFTER", "FOLD_EVERY", "FOLD_WITHIN", "PUT_CHECKPOINT", "RESTART_AFTER",
           "WRITE", "AppendLog", "Entry", "Row", "fold_orphans", "fold_statements", "other_logs", "records",
           "write_statements"]

FOLD_EVERY = 64
"""Records appended before the log is folded at once (one transaction for all of them)."""

FOLD_AFTER = 0.005
"""Seconds without an append after which the log is folded, so that other connections to the
file (``ringzero ps``, another kernel) see the records soon once the writer pauses."""

FOLD_WITHIN = 0.05
"""Seconds after the oldest record not yet folded by which the log is folded even while
appends go on (fewer than ``FOLD_EVERY`` of them): the most another connection lags behind."""

RESTART_AFTER = 1 << 20
"""Bytes past which a log whose records are all folded starts over (``AppendLog.restart``).
Below it, folded records stay and a dead kernel's fold skips them by their sequence number:
an ``ftruncate`` per fold cost about as much as the record's own ``write()``."""

FOLDED_SCHEMA = "CREATE TABLE IF NOT EXISTS ringzero_folded_logs (name TEXT PRIMARY KEY, seq INTEGER NOT NULL)"

_MAGIC = b"RZLOG2\n"
_MAGIC_1 = b"RZLOG1\n"
"""The first format (checkpoint rows only, no kind in a record): still read, never written."""
_IDENTITY = struct.Struct("!QQ")
"""After the magic: (device, inode) of the SQLite file the log belongs to."""
_HEADER_SIZE = len(_MAGIC) + _IDENTITY.size
_FRAME = struct.Struct("!II")
"""A record's frame: the body's length and its CRC-32 (a record cut short at a crash fails it)."""
_RECORD = struct.Struct("!QIB")
"""A body starts with the record's sequence number, its number of rows and their kind."""
_RECORD_1 = struct.Struct("!QI")
_FIELD = struct.Struct("!i")
"""Each field of a row: its length in bytes (-1: NULL), then the bytes."""

Row = tuple[Any, ...]
"""A row of the table its kind names."""

CHECKPOINT = 0
"""A row of ``checkpoints``: thread_id, namespace, id, parent_id, payload, metadata (``put``)."""
WRITE = 1
"""A row of ``writes``: thread_id, namespace, checkpoint_id, task_id, idx, channel, value,
task_path (``put_writes``: a special write, idx < 0, replaces; an ordinary one never does)."""
_COLUMNS = {CHECKPOINT: (6, 4, -1), WRITE: (8, 6, 4)}
"""Per kind: columns, the one kept as bytes (the others are text), the one that is an integer."""

Entry = tuple[int, Row]
"""(kind, row): a row appended and not yet folded."""

PUT_CHECKPOINT = "INSERT OR REPLACE INTO checkpoints VALUES (?, ?, ?, ?, ?, ?)"
REPLACE_WRITE = "INSERT OR REPLACE INTO writes VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
KEEP_WRITE = "INSERT OR IGNORE INTO writes VALUES (?, ?, ?, ?, ?, ?, ?, ?)"


def write_statements(rows: Sequence[Row]) -> list[tuple[str, list[Row]]]:
    """``put_writes``'s statements for ``rows``: special writes (a negative idx) replace, the
    others are kept first. Their keys never meet, so the order between the two does not matter."""
    return [(REPLACE_WRITE, [r for r in rows if r[4] < 0]), (KEEP_WRITE, [r for r in rows if r[4] >= 0])]


def fold_statements(entries: Sequence[Entry], name: str, seq: int) -> list[tuple[str, Sequence[Any]]]:
    """A fold's transaction: ``entries`` as ``put`` and ``put_writes`` would write them, and the
    record that log ``name`` is folded up to ``seq``. Each table's rows keep their order; the two
    tables' rows are independent of each other."""
    checkpoints = [row for kind, row in entries if kind == CHECKPOINT]
    writes = [row for kind, row in entries if kind == WRITE]
    return [(PUT_CHECKPOINT, checkpoints), *write_statements(writes),
            ("INSERT OR REPLACE INTO ringzero_folded_logs VALUES (?, ?)", [(name, seq)])]


def encode(seq: int, rows: Sequence[Row], kind: int = CHECKPOINT) -> bytes:
    """One record: its frame and body."""
    parts = [_RECORD.pack(seq, len(rows), kind)]
    for row in rows:
        for value in row:
            if value is None:
                parts.append(_FIELD.pack(-1))
                continue
            data = value.encode() if isinstance(value, str) else str(value).encode() if isinstance(value, int) \
                else bytes(value)
            parts.append(_FIELD.pack(len(data)))
            parts.append(data)
    body = b"".join(parts)
    return _FRAME.pack(len(body), zlib.crc32(body)) + body


class UnknownRecord(ValueError):
    """A whole record (its checksum holds) of a kind this version does not know."""


def records(data: bytes) -> Iterator[tuple[int, int, list[Row]]]:
    """(seq, kind, rows) of each whole record of a log's contents (its header included), in
    order; stops at the first frame cut short or failing its checksum (a write a crash
    interrupted). A log of the first format holds checkpoint rows only."""
    first_format = data[:len(_MAGIC_1)] == _MAGIC_1
    offset = _HEADER_SIZE
    while offset + _FRAME.size <= len(data):
        length, crc = _FRAME.unpack_from(data, offset)
        body = data[offset + _FRAME.size:offset + _FRAME.size + length]
        if len(body) != length or zlib.crc32(body) != crc:
            return
        offset += _FRAME.size + length
        yield _decode(body, first_format)


def _decode(body: bytes, first_format: bool) -> tuple[int, int, list[Row]]:
    if first_format:
        (seq, count), kind, at = _RECORD_1.unpack_from(body), CHECKPOINT, _RECORD_1.size
    else:
        seq, count, kind = _RECORD.unpack_from(body)
        at = _RECORD.size
    if kind not in _COLUMNS:
        raise UnknownRecord(f"a record of kind {kind}")
    columns, binary, integer = _COLUMNS[kind]
    rows = []
    for _ in range(count):
        row: list[Any] = []
        for column in range(columns):
            (length,) = _FIELD.unpack_from(body, at)
            at += _FIELD.size
            if length < 0:
                row.append(None)
                continue
            data = body[at:at + length]
            at += length
            row.append(data if column == binary else int(data) if column == integer else data.decode())
        rows.append(tuple(row))
    return seq, kind, rows


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

    def append(self, seq: int, rows: Sequence[Row], kind: int = CHECKPOINT) -> None:
        """Write one record; durable against the process dying once this returns."""
        self._write(encode(seq, rows, kind))

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
            if data[:len(_MAGIC)] not in (_MAGIC, _MAGIC_1) or (
                    len(data) < _HEADER_SIZE or _IDENTITY.unpack_from(data, len(_MAGIC)) != identity):
                continue
            try:
                folded += _fold_one(conn, Path(name).name, data)
            except UnknownRecord:
                continue  # written by a later ringzero: left for it, not half folded and deleted
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
    entries: list[Entry] = []
    last = done
    for seq, kind, rows in records(data):
        if seq > done:
            entries.extend((kind, row) for row in rows)
            last = seq
    if not entries:
        return 0
    conn.execute("BEGIN IMMEDIATE")
    try:
        for sql, params in fold_statements(entries, name, last):
            if params:
                conn.executemany(sql, params)
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")
    return len(entries)
