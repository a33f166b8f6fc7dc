"""What ``ringzero top`` costs the kernel it watches: one activity tick with many live processes.

Each second a kernel with live processes writes one activity row (the syscall each is in, its
spend, the gates; at most 1,000 processes listed) and reads the newest commands
(``ringzero.core.support.monitor``). This measures one tick, on the kernel's event loop, with 1,000
and 10,000 idle processes (in ``ctx.recv()``), in memory and in SQLite. The peer is
``kernel.ps()`` over the same processes: the snapshot a program would take to show them.

    .venv/bin/python benchmarks/monitor_tick.py
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from pathlib import Path

from _progress import step
from rich.console import Console
from rich.table import Table

from ringzero import Context, Kernel
from ringzero.checkpointers import MemoryCheckpointer, SqliteCheckpointer
from ringzero.core.contract.protocols import Checkpointer


async def idle(ctx: Context) -> object:
    return await ctx.recv()


async def best_of(times: int, call: object) -> float:
    """The fastest of ``times`` calls, in milliseconds (this machine is shared and noisy)."""
    samples = []
    for _ in range(times):
        started = time.perf_counter()
        await call()  # type: ignore[operator]
        samples.append(time.perf_counter() - started)
    return min(samples) * 1e3


async def measure(store: Checkpointer, count: int) -> tuple[float, float]:
    async with Kernel(checkpointer=store, monitor_interval=3600) as kernel:  # ticks called here, not by the clock
        handles = await asyncio.gather(*(kernel.spawn(idle) for _ in range(count)))
        await kernel.flush()
        assert kernel.monitor is not None
        tick = await best_of(5, kernel.monitor.tick)
        ps = await best_of(5, kernel.ps)
        await asyncio.gather(*(h.send(1) for h in handles))
        await asyncio.gather(*(h.wait() for h in handles))
    return tick, ps


async def main() -> None:
    table = Table(title="One activity tick of the monitor (what `ringzero top` reads), ms, best of 5")
    for column in ("store", "live processes", "tick (once a second)", "kernel.ps() (the peer)", "share of a second"):
        table.add_column(column, justify="left" if column == "store" else "right")
    with tempfile.TemporaryDirectory() as tmp:
        for count in (1_000, 10_000):
            durable = SqliteCheckpointer(Path(tmp) / f"{count}.db")
            stores: list[tuple[str, Checkpointer]] = [("in memory", MemoryCheckpointer()), ("SQLite", durable)]
            for name, store in stores:
                step(f"{name}, {count:,} processes")
                tick, ps = await measure(store, count)
                table.add_row(name, f"{count:,}", f"{tick:.1f}", f"{ps:.1f}", f"{tick / 10:.1f}%")
    Console(width=120).print(table)


if __name__ == "__main__":
    asyncio.run(main())
