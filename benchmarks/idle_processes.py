"""How many idle agent processes one machine holds, and what each costs in memory and time.

Each process blocks in ``ctx.recv()`` (holding no run slot). The peer is the bare minimum
asyncio offers: one task awaiting its own ``asyncio.Queue``. Two ways to start them: one
``await kernel.spawn(...)`` after another, and all at once (``asyncio.gather``), which lets the
SQLite store commit many processes' records together. "Start" ends when every process is
idle and every record of the way there is in the store (``kernel.flush()``); "wake and finish"
sends each one message and waits until every process has ended (its end is durable then).
Memory is the growth of the resident set while all are alive, the in-memory store's records
included. The in-memory rows run at ``--many`` processes (100,000 by default).

    .venv/bin/python benchmarks/idle_processes.py [--count 10000] [--many 100000]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from _progress import step
from rich.console import Console
from rich.table import Table

from ringzero import Context, Event, Kernel
from ringzero.checkpointers import MemoryCheckpointer, SqliteCheckpointer
from ringzero.core.contract.protocols import Checkpointer

Row = tuple[float, float, float]


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


async def idle(ctx: Context) -> object:
    return await ctx.recv()


async def bare_asyncio(count: int) -> Row:
    gc.collect()
    before = rss_bytes()
    started = time.perf_counter()
    queues: list[asyncio.Queue[int]] = [asyncio.Queue() for _ in range(count)]
    tasks = [asyncio.create_task(q.get()) for q in queues]
    await asyncio.sleep(0)
    spawned = time.perf_counter() - started
    grown = rss_bytes() - before
    started = time.perf_counter()
    for q in queues:
        q.put_nowait(1)
    await asyncio.gather(*tasks)
    return spawned, grown / count, time.perf_counter() - started


async def ringzero_processes(store: Checkpointer, count: int, at_once: bool) -> Row:
    gc.collect()
    before = rss_bytes()
    async with Kernel(checkpointer=store) as kernel:
        all_idle = asyncio.Event()
        idle_count = 0

        def count_idle(event: Event) -> None:
            nonlocal idle_count
            if event.kind == "transition" and event.data["to"] == "waiting":
                idle_count += 1
                if idle_count == count:
                    all_idle.set()

        kernel.subscribe(count_idle)
        started = time.perf_counter()
        if at_once:
            handles = list(await asyncio.gather(*(kernel.spawn(idle) for _ in range(count))))
        else:
            handles = [await kernel.spawn(idle) for _ in range(count)]
        await all_idle.wait()
        await kernel.flush()  # and every transition on the way there is in the store
        spawned = time.perf_counter() - started
        grown = rss_bytes() - before
        started = time.perf_counter()
        if at_once:
            await asyncio.gather(*(h.send(1) for h in handles))
        else:
            for h in handles:
                await h.send(1)
        await asyncio.gather(*(h.wait() for h in handles))
        return spawned, grown / count, time.perf_counter() - started


async def main(count: int, many: int) -> None:
    table = Table(title="Idle processes on one machine")
    for column in ("what", "processes", "time to start all, s", "memory per process, KiB", "wake all and finish, s"):
        table.add_column(column, justify="left" if column == "what" else "right")
    with tempfile.TemporaryDirectory() as tmp:
        cases: list[tuple[str, int, Callable[[], object]]] = [
            ("bare asyncio task + Queue (the peer)", count, lambda: bare_asyncio(count)),
            ("ringzero, SQLite store (durable), one spawn after another", count,
             lambda: ringzero_processes(SqliteCheckpointer(Path(tmp) / "one.db"), count, False)),
            ("ringzero, SQLite store (durable), spawned at once", count,
             lambda: ringzero_processes(SqliteCheckpointer(Path(tmp) / "all.db"), count, True)),
            ("ringzero, in-memory store, one spawn after another", count,
             lambda: ringzero_processes(MemoryCheckpointer(), count, False)),
            ("bare asyncio task + Queue (the peer)", many, lambda: bare_asyncio(many)),
            ("ringzero, in-memory store, spawned at once", many,
             lambda: ringzero_processes(MemoryCheckpointer(), many, True)),
        ]
        for name, n, run in cases:
            step(f"{name}: {n:,} processes")
            spawned, per_process, finished = await run()  # type: ignore[misc]
            table.add_row(name, f"{n:,}", f"{spawned:.2f}", f"{per_process / 1024:.1f}", f"{finished:.2f}")
    Console(width=140).print(table)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--count", type=int, default=10_000)
    parser.add_argument("--many", type=int, default=100_000)
    options = parser.parse_args()
    asyncio.run(main(options.count, options.many))
