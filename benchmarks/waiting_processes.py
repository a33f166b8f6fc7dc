"""What a host of waiting processes costs as their number grows: ``ringzero serve``, which lets
a process that waits for a message or on a timer go and brings it back when one comes, against
the peer, a kernel that resumes every waiting process and holds it in memory.

For each count, a store (SQLite) is filled with that many processes waiting in ``ctx.recv()``
and one sleeping until a set time, by a host that then shuts down. The host under test starts
on the store in an OS process of its own, and once it says it serves:

- idle CPU: the share of one core its process used over ``--idle`` seconds (from /proc);
- memory: its resident set then (VmRSS);
- send to finished: ``--sends`` messages, one at a time, each to a waiting process, sent with
  ``Kernel.send`` from this OS process (another process than the host); the time from the send
  to the process's end being in the store (polled every 5 ms);
- timer: how long after its deadline the sleeper woke (the time its program read on waking).

    .venv/bin/python benchmarks/waiting_processes.py [--counts 10,1000,10000,100000] [--held-up-to 10000]
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _progress import step
from _waiting_programs import make_kernel, sleeps_until, waits_for_mail
from rich.console import Console
from rich.table import Table

from ringzero import Event

HERE = Path(__file__).resolve().parent
TICKS = os.sysconf("SC_CLK_TCK")


async def fill(db: str, count: int, wake_in: float) -> tuple[list[int], int, float]:
    """``count`` processes waiting for mail and one sleeping ``wake_in`` s past the end of the
    fill, in a store whose host then shuts down: their pids, the sleeper's, its deadline."""
    waiting: set[int] = set()
    all_waiting = asyncio.Event()

    def seen(event: Event) -> None:
        if event.kind == "transition" and event.data.get("to") == "waiting":
            waiting.add(event.pid)
            if len(waiting) == count + 1:
                all_waiting.set()

    async with make_kernel(db) as kernel:
        kernel.subscribe(seen)
        pids: list[int] = []
        for start in range(0, count, 5000):
            handles = await asyncio.gather(*(kernel.spawn(waits_for_mail) for _ in range(min(5000, count - start))))
            pids += [h.pid for h in handles]
        deadline = time.time() + wake_in
        when = datetime.datetime.fromtimestamp(deadline, datetime.timezone.utc).isoformat()
        sleeper = (await kernel.spawn(sleeps_until, when)).pid
        await all_waiting.wait()
        await kernel.flush()
    return pids, sleeper, deadline


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def start_host(db: str, held: bool) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(HERE)}
    command = ([sys.executable, str(HERE / "_waiting_programs.py"), db] if held else
               [sys.executable, "-m", "ringzero.cli", "serve", "--db", db, "--kernel", "_waiting_programs:make_kernel"])
    host = subprocess.Popen(command, text=True, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    assert host.stdout is not None
    for line in host.stdout:
        if line.startswith("holding") or line.startswith("serving:"):
            return host
    raise RuntimeError(f"the host ended before it served: {host.wait()}")


async def ended_at(db: str, pid: int, timeout: float = 30) -> float:
    async with make_kernel(db) as kernel:
        give_up = time.monotonic() + timeout
        while time.monotonic() < give_up:
            record = await kernel.store.load_process(pid)
            if record is not None and record.status.terminal:
                return time.perf_counter()
            await asyncio.sleep(0.005)
    raise TimeoutError(f"pid {pid} did not end within {timeout} s")


async def measure(count: int, held: bool, idle: float, sends: int) -> list[str]:
    with tempfile.TemporaryDirectory() as folder:
        db = str(Path(folder) / "state.db")
        what = "held in memory" if held else "ringzero serve"
        step(f"{count:,} waiting: filling the store")
        margin = 12 + idle + 2 * sends + count / 4000 * (4 if held else 1)
        pids, sleeper, deadline = await fill(db, count, margin)
        step(f"{count:,} waiting: {what} starting")
        started = time.perf_counter()
        host = start_host(db, held)
        ready = time.perf_counter() - started
        try:
            await asyncio.sleep(2)  # what it does once, after it says it serves (letting go: 1 s)
            step(f"{count:,} waiting: {what} idle for {idle:g} s")
            before, wall = cpu_seconds(host.pid), time.perf_counter()
            await asyncio.sleep(idle)
            cpu = (cpu_seconds(host.pid) - before) / (time.perf_counter() - wall)
            rss = rss_mib(host.pid)
            step(f"{count:,} waiting: {what}, {sends} sends")
            latencies = []
            async with make_kernel(db) as sender:
                for pid in random.sample(pids, min(sends, len(pids))):
                    sent = time.perf_counter()
                    await sender.send(pid, "go")
                    latencies.append(await ended_at(db, pid) - sent)
            step(f"{count:,} waiting: {what}, waiting for the timer")
            left = deadline - time.time() + 1
            if left > 0:
                await asyncio.sleep(left)
            async with make_kernel(db) as reader:
                record = await reader.store.load_process(sleeper)
            late = (f"{float(record.result) - deadline:.2f}" if record is not None and record.status.terminal
                    else "not fired")  # a deadline passed before the host was up fires late by design
            if time.time() < deadline:
                late = "n/a"
        finally:
            host.terminate()
            host.wait(30)
            if host.stdout is not None:
                host.stdout.close()
    return [what, f"{count:,}", f"{ready:.1f}", f"{100 * cpu:.2f}", f"{rss:.0f}",
            f"{statistics.median(latencies):.3f}", f"{max(latencies):.3f}", late]


async def main(counts: list[int], held_up_to: int, idle: float, sends: int) -> None:
    table = Table(title=f"Waiting processes on one machine (SQLite store; idle CPU over {idle:g} s; {sends} sends "
                        "from another OS process)")
    for column in ("host", "waiting", "ready after, s", "idle CPU, % of a core", "resident memory, MiB",
                   "send to finished, median s", "worst s", "timer fired late by, s"):
        table.add_column(column, justify="left" if column == "host" else "right")
    for count in counts:
        if count <= held_up_to:
            table.add_row(*await measure(count, True, idle, sends))
        table.add_row(*await measure(count, False, idle, sends))
    Console(width=170).print(table)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--counts", default="10,1000,10000,100000")
    parser.add_argument("--held-up-to", type=int, default=10000)
    parser.add_argument("--idle", type=float, default=10.0)
    parser.add_argument("--sends", type=int, default=9)
    args = parser.parse_args()
    asyncio.run(main([int(c) for c in args.counts.split(",")], args.held_up_to, args.idle, args.sends))
