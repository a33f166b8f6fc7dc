"""How far the SQLite store's WAL grows under a steady stream of appends, and how long the loop stalls.

``SqliteCheckpointer`` copies its WAL back into the file on a thread of its own every
``CHECKPOINT_EVERY`` rows (no fsync inside a commit). The peer is SQLite's own automatic
checkpoint (``wal_autocheckpoint=1000`` pages, run inside the commit that crosses it) on a
plain ``sqlite3`` connection writing the same rows in transactions of 64, as the append log's
folds do. Each round appends 8,000 rows of 1,000 bytes over 97 threads, yielding to the loop
after each append as a process does between syscalls. Reported per writer, median of the
rounds: rows/s, the WAL file's size at the end (its high-water mark: SQLite reuses the file
from its start once a checkpoint has copied it all), and the longest a single append (or
commit) held the loop.

    .venv/bin/python benchmarks/wal_growth.py [--rows 8000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import asyncio
import sqlite3
import statistics
import tempfile
import time
from pathlib import Path

from _progress import step
from rich.console import Console
from rich.table import Table

from ringzero.checkpointers import SqliteCheckpointer
from ringzero.checkpointers.sqlite.log import PUT_CHECKPOINT
from ringzero.core.contract.types import Checkpoint

Row = tuple[float, int, float]
"""rows/s, WAL pages at the end, longest stall in ms."""

PAGE = 4096 + 24  # a WAL frame: the page and its header
PAYLOAD = b"x" * 1000


def wal_pages(db: Path) -> int:
    wal = db.with_name(db.name + "-wal")
    return max(0, (wal.stat().st_size - 32) // PAGE) if wal.exists() else 0


async def ringzero_appends(db: Path, rows: int) -> Row:
    store = SqliteCheckpointer(db)
    await store.put(Checkpoint("t", "", "start", b""))  # the file is open and WAL'd before timing
    worst = 0.0
    started = time.perf_counter()
    for i in range(rows):
        before = time.perf_counter()
        await store.append(Checkpoint(f"t{i % 97}", "", f"{i:06d}", PAYLOAD))
        worst = max(worst, time.perf_counter() - before)
        await asyncio.sleep(0)
    await store.put(Checkpoint("t", "", "end", b""))  # a write that is no append: every record folded first
    elapsed = time.perf_counter() - started
    pages = wal_pages(db)  # before closing: the last connection to close checkpoints and removes the WAL
    await store.aclose()
    return rows / elapsed, pages, worst * 1000


async def sqlite_autocheckpoint(db: Path, rows: int) -> Row:
    conn = sqlite3.connect(db, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")
    conn.execute("CREATE TABLE checkpoints (thread_id TEXT NOT NULL, namespace TEXT NOT NULL, id TEXT NOT NULL, "
                 "parent_id TEXT, payload BLOB NOT NULL, metadata TEXT NOT NULL, "
                 "PRIMARY KEY (thread_id, namespace, id)) WITHOUT ROWID")
    worst = 0.0
    started = time.perf_counter()
    batch: list[tuple[object, ...]] = []
    for i in range(rows):
        batch.append((f"t{i % 97}", "", f"{i:06d}", None, PAYLOAD, "{}"))
        if len(batch) == 64 or i == rows - 1:
            before = time.perf_counter()
            conn.execute("BEGIN")
            conn.executemany(PUT_CHECKPOINT, batch)
            conn.execute("COMMIT")
            worst = max(worst, time.perf_counter() - before)
            batch = []
        await asyncio.sleep(0)
    elapsed = time.perf_counter() - started
    pages = wal_pages(db)
    conn.close()
    return rows / elapsed, pages, worst * 1000


async def main(rows: int, rounds: int) -> None:
    writers = [("ringzero SqliteCheckpointer.append (checkpoints on its own thread)", ringzero_appends),
               ("sqlite3, 64 rows a commit, wal_autocheckpoint=1000 (the peer)", sqlite_autocheckpoint)]
    results: dict[str, list[Row]] = {name: [] for name, _ in writers}
    with tempfile.TemporaryDirectory() as tmp:
        for n in range(rounds):
            for name, writer in writers:  # alternately, so that both see the same machine
                step(f"round {n + 1}/{rounds}: {name}")
                results[name].append(await writer(Path(tmp) / f"{n}-{len(results[name])}-{writer.__name__}.db", rows))
    table = Table(title=f"{rows:,} appended rows of 1,000 bytes, median of {rounds} rounds")
    for column in ("writer", "rows/s", "WAL at the end, pages", "WAL, largest round", "longest stall, ms"):
        table.add_column(column, justify="left" if column == "writer" else "right")
    for name, rows_of in results.items():
        table.add_row(name, f"{statistics.median(r[0] for r in rows_of):,.0f}",
                      f"{statistics.median(r[1] for r in rows_of):,.0f}", f"{max(r[1] for r in rows_of):,}",
                      f"{statistics.median(r[2] for r in rows_of):.1f}")
    Console(width=160).print(table)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=8000)
    parser.add_argument("--rounds", type=int, default=5)
    options = parser.parse_args()
    asyncio.run(main(options.rows, options.rounds))
