"""The waiting thread: one thread with its own connection to the file, for what may wait.

A write on the loop's thread never waits for SQLite's lock. What may wait (a batch of writes
while another connection holds the lock, every write with ``synchronous="FULL"``, whose fsync
would stall the loop, the migration at open, folding a dead checkpointer's log) and the reads
that may return many rows run here, one at a time, in the order they were handed over.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

__all__ = ["THREAD_NAME", "WaitingThread"]

THREAD_NAME = "ringzero-sqlite"
"""The name the waiting threads start with."""

T = TypeVar("T")


class WaitingThread:
    """A connection that lives on a thread of its own; ``call`` runs a function with it there."""

    def __init__(self, path: Path, *, busy_ms: int) -> None:
        self._path = path
        self._busy_ms = busy_ms
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"{THREAD_NAME}-{path.name}")
        self._conn: sqlite3.Connection | None = None

    async def open(self) -> None:
        """Connect on the thread (the connection is used there only)."""
        await self.call(lambda conn: None)

    async def call(self, function: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """``function(connection, *args, **kwargs)`` on the thread."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, lambda: function(self._connection(), *args, **kwargs))

    async def fetchall(self, sql: str, params: Any = ()) -> list[Any]:
        return await self.call(lambda conn: conn.execute(sql, params).fetchall())

    async def execute(self, sql: str, params: Any = ()) -> None:
        await self.call(lambda conn: conn.execute(sql, params))

    def _connection(self) -> sqlite3.Connection:
        if self._conn is None:
            conn = sqlite3.connect(self._path, isolation_level=None)
            try:
                conn.execute(f"PRAGMA busy_timeout={self._busy_ms}")
            except BaseException:
                conn.close()
                raise
            self._conn = conn
        return self._conn

    async def close(self) -> None:
        """Close the connection on its thread, and let the thread go."""
        def close(conn: sqlite3.Connection | None) -> None:
            if conn is not None:
                conn.close()
            self._conn = None

        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._pool, close, self._conn)
        self._pool.shutdown(wait=True)  # idle now: its thread ends at once
