"""Does the pool of fork servers raise ProcessExecutor's throughput on this machine?

Runs ``1 + 1`` through a ProcessExecutor held to one fork server (``fork_servers=1``) and
through one with the default pool (one server per CPU this process may use, started as
concurrent runs need them), at concurrency 1 and 8, and reports how busy the whole machine's
CPUs were meanwhile (``/proc/stat``): a pool helps only where one fork server leaves cores idle.
Before the pool is measured at a concurrency, rounds at that concurrency run until it stops
growing.

    .venv/bin/python benchmarks/fork_servers.py [--runs 600]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time

from _progress import step
from rich.console import Console
from rich.table import Table

from ringzero.providers.executors import ProcessExecutor


def cpu_ticks() -> tuple[int, int]:
    """(busy, total) jiffies of all CPUs since boot."""
    with open("/proc/stat") as f:
        values = [int(v) for v in f.readline().split()[1:]]
    return sum(values) - values[3] - values[4], sum(values)


async def throughput(executor: ProcessExecutor, concurrency: int, runs: int) -> tuple[float, float]:
    todo = iter(range(runs))

    async def worker() -> None:
        for _ in todo:
            await executor.run("1 + 1")

    busy0, total0 = cpu_ticks()
    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    elapsed = time.perf_counter() - started
    busy1, total1 = cpu_ticks()
    return runs / elapsed, 100 * (busy1 - busy0) / max(1, total1 - total0)


async def grown(executor: ProcessExecutor, concurrency: int) -> None:
    """Run rounds at ``concurrency`` until a round starts no more fork servers (at most 20)."""
    for _ in range(20):
        before = executor.servers_running
        await throughput(executor, concurrency, 100)
        await asyncio.sleep(0.5)  # a server started in the round's last runs joins the pool
        if executor.servers_running == before:
            return


async def main(runs: int) -> None:
    one, pool = ProcessExecutor(fork_servers=1), ProcessExecutor()
    try:
        cpus = len(os.sched_getaffinity(0))
        table = Table(title=f"ProcessExecutor, {runs} runs of 1 + 1, {cpus} CPUs")
        for column in ("executor", "concurrency", "fork servers running", "runs/s", "machine CPU busy", "vs @1"):
            table.add_column(column, justify="right")
        for name, executor in (("fork_servers=1", one), (f"pool (up to {pool.fork_servers})", pool)):
            at_one = 0.0
            for concurrency in (1, 8):
                step(f"{name} at concurrency {concurrency}")
                await grown(executor, concurrency)
                rate, busy = await throughput(executor, concurrency, runs)
                at_one = at_one or rate
                table.add_row(name, str(concurrency), str(executor.servers_running), f"{rate:,.0f}", f"{busy:.0f}%",
                              f"{rate / at_one:.2f}x")
        Console(width=120).print(table)
    finally:
        await one.aclose()
        await pool.aclose()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=600)
    asyncio.run(main(parser.parse_args().runs))
