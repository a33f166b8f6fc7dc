"""What a store's optional capabilities buy: one journaled tool syscall (``ctx.tool``) on
ringzero's SQLite store as it is, and on the same store behind a class that declares only what
every Checkpointer needs (no ``append``, no ``put_many``; ``claims`` kept: without it a shared
store is refused), as a backend author who skips them writes it. The peer is the same file
format with every capability, in the same run.

Each row says the time per syscall and how many store calls each syscall made (a round trip
each, for a store over a network).

    .venv/bin/python benchmarks/backend_capabilities.py [--calls 2000] [--pairs 5]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
import warnings
from collections import Counter
from collections.abc import AsyncIterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from _progress import step
from rich.console import Console
from rich.table import Table

from ringzero import Checkpoint, CheckpointerCapabilities, Context, Kernel, PendingWrite
from ringzero.checkpointers import SqliteCheckpointer
from ringzero.core.contract.protocols import Checkpointer
from ringzero.core.contract.types import JSON

warnings.filterwarnings("ignore", message="program .* is defined where no other Python process can import it")


class Counted:
    """A store whose calls are counted, declaring ``capabilities`` of the caller's choice."""

    def __init__(self, rows: SqliteCheckpointer, capabilities: CheckpointerCapabilities) -> None:
        self.rows = rows
        self.capabilities = capabilities
        self.calls: Counter[str] = Counter()
        if capabilities.append:
            self.append, self.append_many, self.append_writes = (self.counted("append"), self.counted("append_many"),
                                                                 self.counted("append_writes"))
        if capabilities.put_many:
            self.put_many = self.counted("put_many")

    def counted(self, name: str) -> Any:
        method = getattr(self.rows, name)

        async def call(*args: Any) -> Any:
            self.calls[name] += 1
            return await method(*args)
        return call

    async def put(self, checkpoint: Checkpoint) -> None:
        self.calls["put"] += 1
        await self.rows.put(checkpoint)

    async def put_writes(self, thread_id: str, namespace: str, checkpoint_id: str,
                         writes: Sequence[PendingWrite]) -> None:
        self.calls["put_writes"] += 1
        await self.rows.put_writes(thread_id, namespace, checkpoint_id, writes)

    async def get(self, thread_id: str, namespace: str = "", checkpoint_id: str | None = None) -> Checkpoint | None:
        self.calls["get"] += 1
        return await self.rows.get(thread_id, namespace, checkpoint_id)

    async def list(self, thread_id: str | None = None, namespace: str | None = None, *,
                   filter: Mapping[str, JSON] | None = None, before: str | None = None,
                   limit: int | None = None) -> AsyncIterator[Checkpoint]:
        self.calls["list"] += 1
        async for checkpoint in self.rows.list(thread_id, namespace, filter=filter, before=before, limit=limit):
            yield checkpoint

    async def delete_thread(self, thread_id: str) -> None:
        await self.rows.delete_thread(thread_id)

    async def delete_checkpoints(self, thread_id: str, namespace: str, ids: Sequence[str]) -> None:
        self.calls["delete_checkpoints"] += 1
        await self.rows.delete_checkpoints(thread_id, namespace, ids)

    async def claim(self, checkpoint: Checkpoint) -> bool:
        self.calls["claim"] += 1
        return await self.rows.claim(checkpoint)

    async def aclose(self) -> None:
        await self.rows.aclose()


FULL = SqliteCheckpointer.capabilities
SHAPES = {
    "every capability (SQLite as shipped: append, put_many, claims)": FULL,
    "no append": CheckpointerCapabilities(durable=True, multi_process=True, claims=True, put_many=True),
    "no append, no put_many (only what every store needs, and claims)":
        CheckpointerCapabilities(durable=True, multi_process=True, claims=True),
}


async def syscalls(store: Checkpointer, n: int) -> float:
    """Seconds per ``ctx.tool`` syscall, over ``n`` after a warm-up."""
    took: list[float] = []

    def noop(i: int) -> int:
        return i

    async def program(ctx: Context) -> None:
        for i in range(50):
            await ctx.tool(noop, i)
        started = time.perf_counter()
        for i in range(n):
            await ctx.tool(noop, i)
        took.append(time.perf_counter() - started)

    async with Kernel(checkpointer=store, monitor_interval=None) as kernel:
        await (await kernel.spawn(program)).wait()
    return took[0] / n


async def processes(store: Checkpointer, n: int) -> float:
    """Seconds per process spawned, run (one syscall) and ended, over ``n`` one after another."""
    async def program(ctx: Context) -> int:
        return await ctx.tool(abs, -1)  # type: ignore[arg-type]

    async with Kernel(checkpointer=store, monitor_interval=None) as kernel:
        started = time.perf_counter()
        for _ in range(n):
            await (await kernel.spawn(program)).wait()
        return (time.perf_counter() - started) / n


async def main(n: int, pairs: int) -> None:
    per_call: dict[str, list[float]] = {name: [] for name in SHAPES}
    per_process: dict[str, list[float]] = {name: [] for name in SHAPES}
    calls: dict[str, float] = {}
    process_calls: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as folder:
        for pair in range(pairs):
            for index, (name, capabilities) in enumerate(SHAPES.items()):
                step(f"pair {pair + 1}/{pairs}: {name}")
                store = Counted(SqliteCheckpointer(Path(folder) / f"{pair}-{index}.db"), capabilities)
                per_call[name].append(await syscalls(store, n))
                calls[name] = sum(store.calls.values()) / (n + 50)
                store = Counted(SqliteCheckpointer(Path(folder) / f"{pair}-{index}-p.db"), capabilities)
                per_process[name].append(await processes(store, n // 10))
                process_calls[name] = sum(store.calls.values()) / (n // 10)
    base = statistics.median(per_call[next(iter(SHAPES))])
    base_process = statistics.median(per_process[next(iter(SHAPES))])
    table = Table(title=f"On SQLite, by the capabilities its store declares: one journaled ctx.tool syscall "
                        f"({n} in one process), and one process spawned, run and ended ({n // 10} in turn); "
                        f"median of {pairs} rounds")
    for column in ("store declares", "µs per syscall", "vs all", "store calls per syscall", "µs per process",
                   "vs all", "store calls per process"):
        table.add_column(column, justify="left" if column == "store declares" else "right")
    for name in SHAPES:
        median = statistics.median(per_call[name])
        process = statistics.median(per_process[name])
        table.add_row(name, f"{median * 1e6:.0f}", f"{median / base:.2f}x", f"{calls[name]:.1f}",
                      f"{process * 1e6:.0f}", f"{process / base_process:.2f}x", f"{process_calls[name]:.1f}")
    Console(width=150).print(table)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--pairs", type=int, default=5)
    options = parser.parse_args()
    asyncio.run(main(options.calls, options.pairs))
