"""Would a pool of fork servers raise ProcessExecutor's throughput on this machine?

Runs ``1 + 1`` through one ProcessExecutor (one fork server) and through two used in turn
(what a pool of one server per core would be on 2 cores), at concurrency 1 and 8, and reports
how busy the whole machine's CPUs were meanwhile (``/proc/stat``): a pool helps only where one
fork server leaves cores idle.

    .venv/bin/python benchmarks/fork_servers.py [--runs 600]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
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


async def throughput(executors: list[ProcessExecutor], concurrency: int, runs: int) -> tuple[float, float]:
    todo = iter(range(runs))
    turn = itertools.cycle(executors)

    async def worker() -> None:
        for _ in todo:
            await next(turn).run("1 + 1")

    busy0, total0 = cpu_ticks()
    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    elapsed = time.perf_counter() - started
    busy1, total1 = cpu_ticks()
    return runs / elapsed, 100 * (busy1 - busy0) / max(1, total1 - total0)


async def main(runs: int) -> None:
    one, two = ProcessExecutor(), ProcessExecutor()
    try:
        for executor in (one, two):
            await executor.run("1")
        table = Table(title=f"ProcessExecutor, {runs} runs of 1 + 1, {os.cpu_count()} CPUs")
        for column in ("fork servers", "concurrency", "runs/s", "machine CPU busy"):
            table.add_column(column, justify="right")
        for servers, concurrency in ((1, 1), (1, 8), (2, 8)):
            step(f"{servers} fork server(s) at concurrency {concurrency}")
            rate, busy = await throughput([one, two][:servers], concurrency, runs)
            table.add_row(str(servers), str(concurrency), f"{rate:,.0f}", f"{busy:.0f}%")
        Console(width=120).print(table)
    finally:
        await one.aclose()
        await two.aclose()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=600)
    asyncio.run(main(parser.parse_args().runs))
