"""What a kernel keeps in memory after many chatty processes have finished (issue 13, item 3).

10,000 processes each make 50 LLM calls whose replies are 10 KB, then exit: 5 GB of replies
go through the kernel into a durable SQLite journal (a temporary file of about 6 GB). The
kernel must not keep them: its resident set after the last process ends should be within a
small constant of what it was after a warm-up batch. The peer row is what a kernel that kept
every reply in memory would hold (the bytes of the replies alone). Where glibc is the allocator,
the table also shows the resident set once it has given back the free memory it keeps for
reuse (``malloc_trim``): the growth objects still hold.

The suite runs the same check at 50 x 20 x 10 KB under tracemalloc
(tests/test_lean_records.py); this script is the full size, too slow and too big on disk for
``make test``.

    .venv/bin/python benchmarks/finished_processes_memory.py [--count 10000] [--calls 50]
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import ctypes.util
import gc
import itertools
import os
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from ringzero import Context, Kernel
from ringzero.checkpointers import SqliteCheckpointer
from ringzero.testing import ScriptedProvider

REPLY_BYTES = 10_000
CONCURRENCY = 100


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


def give_back() -> bool:
    """Ask glibc's allocator to return the free memory it holds to the system (``malloc_trim``):
    what is left is what objects (Python's or SQLite's) still use. False where there is no glibc."""
    libc = ctypes.util.find_library("c")
    if libc is None:
        return False
    try:
        trim = ctypes.CDLL(libc).malloc_trim
    except AttributeError:  # not glibc
        return False
    trim(0)
    return True


async def chatty(ctx: Context, calls: int) -> int:
    for _ in range(calls):
        await ctx.llm("go")
    return calls


async def run_batch(kernel: Kernel, provider: ScriptedProvider, count: int, calls: int, progress: str = "") -> None:
    slots = asyncio.Semaphore(CONCURRENCY)
    finished = 0

    async def one() -> None:
        nonlocal finished
        async with slots:
            assert await (await kernel.spawn(chatty, calls)).wait() == calls
        provider.requests.clear()  # the test double's own log of requests, not the kernel's memory
        finished += 1
        if progress and finished % 1000 == 0:
            print(f"{progress}: {finished:,}/{count:,} processes finished", flush=True)

    await asyncio.gather(*(one() for _ in range(count)))


async def main(count: int, calls: int) -> None:
    replies = itertools.count()

    def reply(request: object) -> str:  # a new 10 KB string per call, as from a real model
        return f"{next(replies):08d}".ljust(REPLY_BYTES, "r")

    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "chatty.db"
        provider = ScriptedProvider(reply)
        async with Kernel(checkpointer=SqliteCheckpointer(db), llm=provider) as kernel:
            await run_batch(kernel, provider, CONCURRENCY * 2, calls)  # warm-up: every path, every cache
            gc.collect()
            give_back()
            before = rss_bytes()
            started = time.perf_counter()
            await run_batch(kernel, provider, count, calls, progress="chatty")
            elapsed = time.perf_counter() - started
            gc.collect()
            after = rss_bytes()
            trimmed = rss_bytes() if give_back() else None
            live = len(kernel.runtime.procs)
        on_disk = sum(entry.stat().st_size for entry in os.scandir(tmp))

    table = Table(title=f"{count:,} processes x {calls} LLM calls x {REPLY_BYTES // 1000} KB replies, then exit")
    for column in ("what", "MB"):
        table.add_column(column, justify="left" if column == "what" else "right")
    table.add_row("replies passed through the kernel (a kernel that kept them holds this)",
                  f"{count * calls * REPLY_BYTES / 1e6:,.0f}")
    table.add_row("SQLite journal on disk", f"{on_disk / 1e6:,.0f}")
    table.add_row("kernel's resident set after the warm-up batch", f"{before / 1e6:,.1f}")
    table.add_row("kernel's resident set after every process finished", f"{after / 1e6:,.1f}")
    table.add_row("growth", f"{(after - before) / 1e6:,.1f}")
    if trimmed is not None:
        table.add_row("resident set once the allocator gave back its free memory (malloc_trim)",
                      f"{trimmed / 1e6:,.1f}")
        table.add_row("growth held by objects (after malloc_trim)", f"{(trimmed - before) / 1e6:,.1f}")
    Console(width=120).print(table)
    print(f"live processes left in the kernel: {live}; {count * calls / elapsed:,.0f} LLM calls/s, {elapsed:.0f} s")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--count", type=int, default=10_000)
    parser.add_argument("--calls", type=int, default=50)
    arguments = parser.parse_args()
    asyncio.run(main(arguments.count, arguments.calls))
