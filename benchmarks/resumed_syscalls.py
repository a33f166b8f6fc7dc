"""What a resumed process's syscalls cost on a store kernels may share: one journaled
``ctx.tool`` syscall of a process taken by a claim (``recover``, or a wake of ``serve``: its
journal is fenced, each record written only where its slot is free), and of a process spawned
in the same run (the peer: its records are appended). SQLite, one process at a time, each
waiting for a message first so that both are measured from the same point.

    .venv/bin/python benchmarks/resumed_syscalls.py [--calls 400] [--rounds 5]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
import warnings
from pathlib import Path

from _progress import step
from rich.console import Console
from rich.table import Table

from ringzero import Context, Kernel
from ringzero.checkpointers import SqliteCheckpointer

warnings.filterwarnings("ignore", message="program .* is defined where no other Python process can import it")

CALLS = 400


def noop(i: int) -> int:
    return i


async def worker(ctx: Context, calls: int) -> float:
    """Waits for its go, then makes ``calls`` tool syscalls; µs per syscall."""
    await ctx.recv()
    started = time.perf_counter()
    for i in range(calls):
        await ctx.tool("noop", i)
    return (time.perf_counter() - started) / calls * 1e6


def kernel(db: Path) -> Kernel:
    return Kernel(checkpointer=SqliteCheckpointer(db), tools={"noop": noop})


async def spawned(db: Path, calls: int) -> float:
    async with kernel(db) as host:
        handle = await host.spawn(worker, calls)
        await host.send(handle.pid, "go")
        return float(await handle.wait())


async def resumed(db: Path, calls: int) -> float:
    async with kernel(db) as first:
        waiting = asyncio.Event()
        first.subscribe(lambda event: waiting.set() if event.kind == "transition" and event.data.get("to") == "waiting"
                        else None)
        await first.spawn(worker, calls)
        await waiting.wait()
    async with kernel(db) as second:  # the first host is gone: this one claims the process
        [handle] = await second.recover(programs={"__main__:worker": worker})
        await second.send(handle.pid, "go")
        return float(await handle.wait())


async def main(calls: int, rounds: int) -> None:
    times: dict[str, list[float]] = {"spawned": [], "resumed": []}
    with tempfile.TemporaryDirectory() as folder:
        for n in range(rounds):
            for name, run in (("spawned", spawned), ("resumed", resumed)):
                step(f"round {n + 1} of {rounds}: {name}")
                times[name].append(await run(Path(folder) / f"{name}-{n}.db", calls))
    table = Table(title=f"One ctx.tool syscall on SQLite, median of {rounds} rounds of {calls} calls")
    for column in ("process", "µs per syscall", "vs spawned"):
        table.add_column(column, justify="left" if column == "process" else "right")
    base = statistics.median(times["spawned"])
    for name, label in (("spawned", "spawned in this run (records appended)"),
                        ("resumed", "resumed by a claim (records written where their slot is free)")):
        median = statistics.median(times[name])
        table.add_row(label, f"{median:.0f}", f"{median / base:.2f}x")
    Console().print(table)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=CALLS)
    parser.add_argument("--rounds", type=int, default=5)
    options = parser.parse_args()
    asyncio.run(main(options.calls, options.rounds))
