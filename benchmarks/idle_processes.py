"""How many idle agent processes one machine holds, and what each costs in memory.

Each process blocks in ``ctx.recv()`` (holding no run slot). The peer is the bare minimum
asyncio offers: one task awaiting its own ``asyncio.Queue``. Memory is the growth of the
resident set while the processes are alive; then every process gets one message and ends.

    .venv/bin/python benchmarks/idle_processes.py [--count 10000]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from ringzero import Context, Event, Kernel
from ringzero.checkpointers import MemoryCheckpointer, SqliteCheckpointer
from ringzero.core.protocols import Checkpointer


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


async def idle(ctx: Context) -> object:
    return await ctx.recv()


async def bare_asyncio(count: int) -> tuple[float, float, float]:
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


async def ringzero_processes(store: Checkpointer, count: int) -> tuple[float, float, float]:
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
        handles = [await kernel.spawn(idle) for _ in range(count)]
        await all_idle.wait()
        await kernel.flush()  # and every transition on the way there is in the store
        spawned = time.perf_counter() - started
        grown = rss_bytes() - before
        started = time.perf_counter()
        for h in handles:
            await h.send(1)
        await asyncio.gather(*(h.wait() for h in handles))
        return spawned, grown / count, time.perf_counter() - started


async def main(count: int) -> None:
    table = Table(title=f"{count:,} idle processes on one machine")
    for column in ("what", "time to start all, s", "memory per process, KiB", "wake all and finish, s"):
        table.add_column(column, justify="left" if column == "what" else "right")
    rows = [("bare asyncio task + Queue (the peer)", await bare_asyncio(count)),
            ("ringzero process, in-memory store", await ringzero_processes(MemoryCheckpointer(), count))]
    with tempfile.TemporaryDirectory() as tmp:
        rows.append(("ringzero process, SQLite store (durable)",
                     await ringzero_processes(SqliteCheckpointer(Path(tmp) / "idle.db"), count)))
    for name, (spawned, per_process, finished) in rows:
        table.add_row(name, f"{spawned:.2f}", f"{per_process / 1024:.1f}", f"{finished:.2f}")
    Console(width=120).print(table)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--count", type=int, default=10_000)
    asyncio.run(main(parser.parse_args().count))
