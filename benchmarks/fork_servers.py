"""Does the pool of fork servers raise ProcessExecutor's throughput on this machine?

Runs ``1 + 1`` through a ProcessExecutor held to one fork server (``fork_servers=1``) and
through one with the default pool (one server per CPU this process may use, started as
concurrent runs need them), at concurrency 1 and 8, and reports how busy the whole machine's
CPUs were meanwhile (``/proc/stat``): a pool helps only where one fork server leaves cores idle.
Before the pool is measured at a concurrency, rounds at that concurrency run until it stops
growing. Each row also says where a run's CPU went: this process (the host's side of every
run, on one event loop), the fork servers (forks, cgroup leaves), and the whole machine
(the runs themselves, and the kernel's teardown of their namespaces). A machine with N idle
cores can do at most N / (the machine's CPU per run) runs a second, and the host's side
caps it at one second / (this process's CPU per run).

The second table gives the executor 1, 2, 4, ... of the CPUs this process may use
(``sched_setaffinity``, inherited by the fork servers and their runs; a fresh pool each
time, so up to one server per CPU given) and measures concurrency 8: how throughput grows
with cores. The kernel's deferred work (freeing a run's network namespace) may still run on
the other CPUs; the machine column shows it.

    .venv/bin/python benchmarks/fork_servers.py [--runs 600] [--allow-weaker-isolation]

``--allow-weaker-isolation`` measures on a host that cannot enforce every control (gVisor has
no Landlock, for one): the tables then name what is missing, and measure a different sandbox.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import time
from dataclasses import dataclass

from _progress import step
from rich.console import Console
from rich.table import Table

from ringzero.providers.executors import ProcessExecutor

TICKS_PER_SECOND = os.sysconf("SC_CLK_TCK")


def cpu_ticks() -> tuple[int, int]:
    """(busy, total) jiffies of all CPUs since boot."""
    with open("/proc/stat") as f:
        values = [int(v) for v in f.readline().split()[1:]]
    return sum(values) - values[3] - values[4], sum(values)


def children_cpu_seconds() -> float:
    """CPU seconds used so far by this process's living children: the fork servers (this
    script starts nothing else). Their runs are not counted: they are the servers' children.
    NaN where this kernel does not list a task's children (gVisor, or no CONFIG_PROC_CHILDREN)."""
    seconds = 0.0
    for task in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{task}/children") as f:
                pids = f.read().split()
        except FileNotFoundError:
            return math.nan
        for pid in pids:
            try:
                with open(f"/proc/{pid}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except FileNotFoundError:  # it ended meanwhile
                continue
            seconds += (int(fields[11]) + int(fields[12])) / TICKS_PER_SECOND  # utime, stime
    return seconds


@dataclass
class Measured:
    runs_per_second: float
    machine_busy: float  # percent of all CPUs
    host_us: float  # CPU per run: this process
    servers_us: float  # the fork servers
    machine_us: float  # every CPU of the machine, busy


async def throughput(executor: ProcessExecutor, concurrency: int, runs: int) -> Measured:
    todo = iter(range(runs))

    async def worker() -> None:
        for _ in todo:
            await executor.run("1 + 1")

    busy0, total0 = cpu_ticks()
    host0, servers0 = time.process_time(), children_cpu_seconds()
    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    elapsed = time.perf_counter() - started
    host1, servers1 = time.process_time(), children_cpu_seconds()
    busy1, total1 = cpu_ticks()
    return Measured(runs / elapsed, 100 * (busy1 - busy0) / max(1, total1 - total0), 1e6 * (host1 - host0) / runs,
                    1e6 * (servers1 - servers0) / runs, 1e6 * (busy1 - busy0) / TICKS_PER_SECOND / runs)


async def grown(executor: ProcessExecutor, concurrency: int) -> None:
    """Run rounds at ``concurrency`` until a round starts no more fork servers (at most 20)."""
    for _ in range(20):
        before = executor.servers_running
        await throughput(executor, concurrency, 100)
        await asyncio.sleep(0.5)  # a server started in the round's last runs joins the pool
        if executor.servers_running == before:
            return


CPU_COLUMNS = ("CPU/run: this process", "fork servers", "machine")


def cpu_cells(measured: Measured) -> list[str]:
    return [f"{value:,.0f} µs" if math.isfinite(value) else "n/a"
            for value in (measured.host_us, measured.servers_us, measured.machine_us)]


def weaker(executor: ProcessExecutor) -> str:
    """What a title says of controls this host could not enforce (empty where it enforces all)."""
    missing = ", ".join(executor.missing_controls)
    return f" [yellow](weaker isolation, without {missing})[/]" if missing else ""


async def pool_or_one(runs: int, weaker_ok: bool) -> Table:
    one = ProcessExecutor(fork_servers=1, allow_weaker_isolation=weaker_ok)
    pool = ProcessExecutor(allow_weaker_isolation=weaker_ok)
    try:
        cpus = len(os.sched_getaffinity(0))
        table = Table(title=f"ProcessExecutor, {runs} runs of 1 + 1, {cpus} CPUs")
        for column in ("executor", "concurrency", "fork servers running", "runs/s", "machine CPU busy", "vs @1",
                       *CPU_COLUMNS):
            table.add_column(column, justify="right")
        for name, executor in (("fork_servers=1", one), (f"pool (up to {pool.fork_servers})", pool)):
            at_one = 0.0
            for concurrency in (1, 8):
                step(f"{name} at concurrency {concurrency}")
                await grown(executor, concurrency)
                measured = await throughput(executor, concurrency, runs)
                at_one = at_one or measured.runs_per_second
                table.add_row(name, str(concurrency), str(executor.servers_running),
                              f"{measured.runs_per_second:,.0f}", f"{measured.machine_busy:.0f}%",
                              f"{measured.runs_per_second / at_one:.2f}x", *cpu_cells(measured))
        table.title = f"{table.title}{weaker(pool)}"
    finally:
        await one.aclose()
        await pool.aclose()
    return table


async def scaling(runs: int, weaker_ok: bool) -> Table:
    """Concurrency 8 with the executor held to 1, 2, 4, ... of this process's CPUs."""
    allowed = sorted(os.sched_getaffinity(0))
    counts = sorted({*(2**k for k in range(len(allowed).bit_length()) if 2**k <= len(allowed)), len(allowed)})
    table = Table(title=f"ProcessExecutor pool at concurrency 8, {runs} runs of 1 + 1, by the CPUs it may use")
    for column in ("CPUs", "fork servers running", "runs/s", "machine CPU busy", "vs 1 CPU", *CPU_COLUMNS):
        table.add_column(column, justify="right")
    on_one = 0.0
    try:
        for count in counts:
            step(f"the pool on {count} of {len(allowed)} CPUs at concurrency 8")
            os.sched_setaffinity(0, allowed[:count])  # before the pool starts: its servers and runs inherit it
            pool = ProcessExecutor(allow_weaker_isolation=weaker_ok)
            try:
                await grown(pool, 8)
                measured = await throughput(pool, 8, runs)
                running = pool.servers_running
                table.title = f"{table.title}{weaker(pool) if count == counts[-1] else ''}"
            finally:
                await pool.aclose()
            on_one = on_one or measured.runs_per_second
            table.add_row(str(count), str(running), f"{measured.runs_per_second:,.0f}",
                          f"{measured.machine_busy:.0f}%", f"{measured.runs_per_second / on_one:.2f}x",
                          *cpu_cells(measured))
    finally:
        os.sched_setaffinity(0, allowed)
    return table


async def main(runs: int, weaker_ok: bool) -> None:
    console = Console(width=160)
    console.print(await pool_or_one(runs, weaker_ok))
    console.print(await scaling(runs, weaker_ok))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=600)
    parser.add_argument("--allow-weaker-isolation", action="store_true",
                        help="measure even where this host cannot enforce every control (the tables say which)")
    arguments = parser.parse_args()
    asyncio.run(main(arguments.runs, arguments.allow_weaker_isolation))
