"""``SqliteCheckpointer``: the protocol's methods over the parts of this package.

Writes go through the writer (``writer``: group commit on the caller's thread, or in line on
the waiting thread while another connection holds the lock); appends go to the append log and
are folded into the file (``folds``). See the package's docstring for why each is shaped so.
"""

from __future__ import annotations

import asyncio
import contextlib
import glob
import json
import sqlite3
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import suppress
from pathlib import Path
from typing import Any, Literal

from ringzero.checkpointers._filters import list_query, pushable, selected
from ringzero.checkpointers.sqlite.commit import Pending
from ringzero.checkpointers.sqlite.folds import LogFolds
from ringzero.checkpointers.sqlite.log import CHECKPOINT, PUT_CHECKPOINT, WRITE, Row, write_statements
from ringzero.checkpointers.sqlite.memory import SqliteMemoryIndex
from ringzero.checkpointers.sqlite.schema import SELECT, checkpoint_of, checkpoint_row, write_rows
from ringzero.checkpointers.sqlite.thread import WaitingThread
from ringzero.checkpointers.sqlite.writer import Writer
from ringzero.core.contract.errors import CheckpointerError, Closed, InvalidArgument
from ringzero.core.contract.protocols import CheckpointerCapabilities
from ringzero.core.contract.types import JSON, Checkpoint, PendingWrite
from ringzero.core.support.owner_only import OWN_FOLDER, owner_only_file, owner_only_folder, refuse_unless_yours

__all__ = ["DEFAULT_PATH", "SqliteCheckpointer"]

DEFAULT_PATH = ".ringzero/state.db"
Statements = Sequence[tuple[str, Sequence[Any]]]


class SqliteCheckpointer:
    """Durable checkpoints in one SQLite file."""

    capabilities = CheckpointerCapabilities(durable=True, multi_process=True, delete_checkpoints=True, claims=True,
                                          put_many=True, append=True, append_anywhere=True)

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
        self.writer = Writer(self.path, busy_ms=int(busy_timeout * 1000), synchronous=synchronous)
        """Commits this store's writes (``ringzero.checkpointers.sqlite.writer``)."""
        self.appends = LogFolds(self.writer, usable=synchronous == "NORMAL")
        """The append log and its folds (``ringzero.checkpointers.sqlite.folds``)."""
        self._closed = False
        self._opening = asyncio.Lock()

    def __repr__(self) -> str:
        return f"SqliteCheckpointer({str(self.path)!r})"

    @property
    def commits(self) -> int:
        """Transactions committed: fewer than writes when concurrent writes were grouped."""
        return self.writer.commits

    @property
    def folds(self) -> int:
        """Folds of the append log committed."""
        return self.appends.folds

    @property
    def is_open(self) -> bool:
        return self.writer.db is not None

    async def _open(self) -> WaitingThread:
        """The waiting thread of the open file, opening it at the first call."""
        if self.writer.db is not None:
            return self.writer.db
        if self._closed:
            raise Closed(f"{self!r} is closed; open a new SqliteCheckpointer on the same file to go on")
        async with self._opening:
            if self.writer.db is None:
                await asyncio.to_thread(self._make_files)
                await self.writer.open()
                try:
                    with self.writer.errors("preparing"):
                        await self.appends.fold_orphans()
                except BaseException:
                    await self.writer.close(for_good=False)
                    raise
        assert self.writer.db is not None
        return self.writer.db

    def _make_files(self) -> None:
        """The store's file, made the owner's alone (``owner_only``) where ringzero creates it:
        at any path, whatever the umask (SQLite gives its WAL and shared memory the file's mode);
        a file the user made keeps the user's modes, and must be the user's
        (``refuse_unless_yours``). With ``create_folder``, the folder too, made where missing;
        where it is ringzero's (made now, or a ``.ringzero`` one), it and every file of the store
        in it are the owner's alone."""
        if self._create_folder:
            folder = self.path.parent
            ours = not folder.exists() or OWN_FOLDER in folder.absolute().parts
            owner_only_folder(folder)
            if ours:
                for sibling in folder.glob(f"{glob.escape(self.path.name)}-*"):  # WAL, shared memory, append logs
                    owner_only_file(sibling)
                owner_only_file(self.path)
                return
        if self.path.exists():
            refuse_unless_yours(self.path)  # another user's store is never written to
            return
        with contextlib.suppress(OSError):  # a folder it may not write in: SQLite's open says so, translated
            owner_only_file(self.path)

    async def _transaction(self, statements: Statements, *, appended: bool = False) -> Pending:
        """Commit ``(sql, rows)`` pairs atomically, grouped with the other writes of this turn
        of the loop; when this returns, the write is committed (see the package's docstring).

        The first write of a turn commits at once (``Turns``); a write after it in the same turn
        yields once, so that every other task with work in this turn adds its own; then the
        first of them to run again commits them all, and the others find theirs done.

        Records of the append log not yet in the file go first, in the same transaction (a fold
        of their own): one commit, and this write comes after them. ``appended``: rows an append
        commits instead (see ``append``)."""
        writer, appends = self.writer, self.appends
        appends.wrote(appended=appended)
        loop = asyncio.get_running_loop()
        item = Pending(statements, None)
        if appends.unfolded and appends.folding is not None:
            await appends.fold_first()  # the records after the fold on its way go before this write
        fold = appends.take_fold() if appends.unfolded else None
        batch = [item] if fold is None else [fold, item]
        if appends.folding is None and writer.commits_now(loop) and writer.write_here(batch):
            if fold is not None:
                appends.folded(fold)
            if item.error is not None:
                raise item.error
            return item
        if fold is not None:
            appends.line_up(fold)
        future = item.wait_for_commit()
        if not writer.line_up(batch):
            try:
                await asyncio.sleep(0)
            finally:  # cancelled or not: a write once begun is committed, as a crash-free run would
                if not future.done():
                    writer.flush()
        await future
        if item.error is not None:
            raise item.error
        return item

    def _put_here(self, row: Row, *, appended: bool = False) -> bool:
        """``_transaction``'s commit at once, for one row, without its bookkeeping (a ``put`` at
        every syscall); False where it cannot be done here and now."""
        self.appends.wrote(appended=appended)
        return self.appends.idle and self.writer.put_here(row)

    async def put(self, checkpoint: Checkpoint) -> None:
        if self.writer.db is None:
            await self._open()
        row = checkpoint_row(checkpoint)
        try:  # not writer.errors(): even a light context manager costs, and this runs at every syscall
            if not self._put_here(row):
                await self._transaction([(PUT_CHECKPOINT, [row])])
        except sqlite3.Error as exc:
            raise CheckpointerError(f"SQLite file {self.path}: put failed: {exc}") from exc

    async def put_many(self, checkpoints: Sequence[Checkpoint]) -> None:
        """Store each, in order, in one transaction (grouped with the other writes of this turn)."""
        await self._write([(PUT_CHECKPOINT, [checkpoint_row(cp) for cp in checkpoints])], "put_many")

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
            await self._commit_appended([(PUT_CHECKPOINT, [row])], "append", row)

    def append_here(self, checkpoint: Checkpoint) -> bool:
        """``append`` from a thread that is not the event loop's (``capabilities.append_anywhere``):
        True once the record is in the append log, as durable as ``append`` makes it; False
        where it must be appended on the loop (the store not open yet, or its last write not an
        append, or the log not made: ``append`` decides those)."""
        if self.writer.db is None:
            return False
        return self.appends.append_here(CHECKPOINT, [checkpoint_row(checkpoint)])

    def append_many_here(self, checkpoints: Sequence[Checkpoint]) -> bool:
        """``append_many`` from a thread that is not the event loop's, as ``append_here``: one
        record of the log, all or none."""
        if self.writer.db is None:
            return False
        return not checkpoints or self.appends.append_here(CHECKPOINT, [checkpoint_row(cp) for cp in checkpoints])

    def append_writes_here(self, thread_id: str, namespace: str, checkpoint_id: str,
                           writes: Sequence[PendingWrite]) -> bool:
        """``append_writes`` from a thread that is not the event loop's, as ``append_here``."""
        if self.writer.db is None:
            return False
        return not writes or self.appends.append_here(WRITE, write_rows(thread_id, namespace, checkpoint_id, writes))

    async def append_many(self, checkpoints: Sequence[Checkpoint]) -> None:
        """``put_many`` as ``append`` is ``put``: the checkpoints as one record of the log, so
        that a crash keeps all of them or none (the kernel's transitions, status and state rows
        of a process)."""
        rows = [checkpoint_row(cp) for cp in checkpoints]
        if rows and await self._append(CHECKPOINT, rows):
            await self._commit_appended([(PUT_CHECKPOINT, rows)], "append_many")

    async def append_writes(
        self, thread_id: str, namespace: str, checkpoint_id: str, writes: Sequence[PendingWrite]
    ) -> None:
        """``put_writes`` as ``append`` is ``put``: one ``write()`` into the append log."""
        rows = write_rows(thread_id, namespace, checkpoint_id, writes)
        if writes and await self._append(WRITE, rows):
            await self._commit_appended(write_statements(rows), "append_writes")

    async def _append(self, kind: int, rows: list[Row]) -> bool:
        if self.writer.db is None:
            await self._open()
        return await self.appends.append(kind, rows)

    async def _commit_appended(self, statements: Statements, doing: str, row: Row | None = None) -> None:
        """Commit, as ``put`` would, what an append did not write to the log (see ``append``):
        one ``row`` at once where it can. The appends after it go to the log: it counts as one."""
        with self.writer.errors(doing):
            if row is None or not self._put_here(row, appended=True):
                await self._transaction(statements, appended=True)
        self.appends.wrote(appended=True)

    async def claim(self, checkpoint: Checkpoint) -> bool:
        row = checkpoint_row(checkpoint)
        done = await self._write([("INSERT OR IGNORE INTO checkpoints VALUES (?, ?, ?, ?, ?, ?)", [row])], "claim")
        return done.changed == 1

    async def put_writes(
        self, thread_id: str, namespace: str, checkpoint_id: str, writes: Sequence[PendingWrite]
    ) -> None:
        rows = write_rows(thread_id, namespace, checkpoint_id, writes)
        # a special (negative idx) write replaces, others are kept first
        await self._write(write_statements(rows), "put_writes")

    async def _write(self, statements: Statements, doing: str) -> Pending:
        await self._open()
        with self.writer.errors(doing):
            return await self._transaction(statements)

    async def get(self, thread_id: str, namespace: str = "", checkpoint_id: str | None = None) -> Checkpoint | None:
        db = await self._open()
        if self.appends.unfolded_for(thread_id):
            await self.appends.fold_first()
        params: tuple[str, ...] = (thread_id, namespace)
        if checkpoint_id is None:
            sql = f"{SELECT} WHERE thread_id=? AND namespace=? ORDER BY id DESC LIMIT 1"
        else:
            sql, params = f"{SELECT} WHERE thread_id=? AND namespace=? AND id=?", (*params, checkpoint_id)
        with self.writer.errors("get"):
            rows = self.writer.read_here(sql, params)
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
        db = await self._open()
        if self.appends.unfolded_for(thread_id):
            await self.appends.fold_first()
        pushed = [(f"json_extract(c.metadata, '$.{key}')=?", value) for key, value in pushable(filter)]
        sql, params = list_query(SELECT, "?", thread_id, namespace, before, pushed)
        if limit is not None and not filter:
            sql += f" LIMIT {int(limit)}"
        with self.writer.errors("list"):
            await self.appends.fold_orphans()
            rows = list(await db.fetchall(sql, params))
        for row in selected(rows, lambda r: json.loads(r[5]), filter, limit):
            yield checkpoint_of(row)

    def memory_index(self) -> SqliteMemoryIndex:
        """Long-term memory in this file, searched through its FTS5 index (``ringzero.core.support.memory``)."""
        return SqliteMemoryIndex(self)

    async def delete_thread(self, thread_id: str) -> None:
        await self._write([("DELETE FROM checkpoints WHERE thread_id=?", [(thread_id,)]),
                           ("DELETE FROM writes WHERE thread_id=?", [(thread_id,)])], "delete_thread")

    async def delete_checkpoints(self, thread_id: str, namespace: str, ids: Sequence[str]) -> None:
        rows = [(thread_id, namespace, cid) for cid in ids]
        await self._write([("DELETE FROM checkpoints WHERE thread_id=? AND namespace=? AND id=?", rows),
                           ("DELETE FROM writes WHERE thread_id=? AND namespace=? AND checkpoint_id=?", rows)],
                          "delete_checkpoints")

    async def write(self, statements: Statements) -> int:
        """Run ``(sql, rows)`` statements in one transaction (grouped with other writers); the
        number of rows they changed. For the file's other tables (long-term memory)."""
        return (await self._write(statements, "writing")).changed

    async def read(self, sql: str, params: Sequence[Any]) -> Sequence[Any]:
        """The rows of one query, for the file's other tables."""
        db = await self._open()
        if not self.appends.idle:
            await self.appends.fold_first()
        with self.writer.errors("reading"):
            return list(await db.fetchall(sql, params))

    async def aclose(self) -> None:
        """Close the connection; a later call raises ``Closed``."""
        self._closed = True
        writer, appends = self.writer, self.appends
        db = writer.db
        if db is None:
            return
        folded = True
        try:
            await appends.fold_first()
        except CheckpointerError:
            folded = False  # the records stay in the log, which the file's next opener folds
        try:
            await writer.drain_all()
            if folded and not appends.unfolded:
                removed = appends.close(remove=True)
                if removed is not None:
                    with suppress(sqlite3.Error):  # a row left behind only names a log that is gone
                        await db.execute("DELETE FROM ringzero_folded_logs WHERE name=?", (removed,))
        finally:
            appends.stop_timer()
            appends.close(remove=False)
            await writer.close()

