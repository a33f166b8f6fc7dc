"""``ringzero ui`` over a store of 10,000 processes: how long its pages take to render.

A SQLite store gets ``--count`` processes (each asks the model once, then waits for a message:
a store an agent service keeps, every process alive and listed); the UI's app answers over
HTTP through httpx's ASGI transport (no network, the server's own work), each page the median
of ``--rounds``: the first page of the process table, a filtered page, one process's page, and
what ``/events`` reads each half second to see a change. The peer row is ``ringzero ps``'s
read of the same store (every record, and each live one's journal).

    .venv/bin/python benchmarks/ui.py [--count 10000] [--rounds 7]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import _timing
import httpx
from _progress import step
from rich.console import Console
from rich.table import Table

from ringzero import Context, Kernel
from ringzero.checkpointers import SqliteCheckpointer
from ringzero.core.contract.store import KernelStore
from ringzero.testing import ScriptedProvider
from ringzero.ui import create_app

TOKEN = "a-benchmark-token-of-enough-length"


PLANNED: dict[str, Any] = {}
"""How many processes have asked the model, and the event set when all have."""


async def waits(ctx: Context) -> str:
    await ctx.llm("plan")
    PLANNED["count"] += 1
    if PLANNED["count"] == PLANNED["all"]:
        PLANNED["done"].set()
    return str(await ctx.recv())


async def fill(db: Path, count: int) -> None:
    PLANNED.update(count=0, all=count, done=asyncio.Event())
    async with Kernel(checkpointer=SqliteCheckpointer(db), llm=ScriptedProvider(lambda request: "ok"),
                      monitor_interval=None) as kernel:
        for n in range(count):
            await kernel.spawn(waits, name=f"agent-{n}")
        await PLANNED["done"].wait()
        await asyncio.sleep(1.0)  # the last ones into ctx.recv(), their status written


async def median(rounds: int, one: Callable[[], Awaitable[Any]]) -> float:
    return statistics.median(await _timing.samples(one, rounds, warm=1))


async def main(count: int, rounds: int) -> None:
    with tempfile.TemporaryDirectory() as folder:
        db = Path(folder) / "state.db"
        step(f"{count:,} processes into a SQLite store")
        await fill(db, count)
        store = SqliteCheckpointer(db)
        app = create_app(store, token=TOKEN, host="127.0.0.1", port=8787)
        transport = httpx.ASGITransport(app=app)
        rows: list[tuple[str, float]] = []
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1:8787",
                                     headers={"Authorization": f"Bearer {TOKEN}"}) as client:
            async def get(path: str) -> None:
                response = await client.get(path)
                assert response.status_code == 200, (path, response.status_code)

            for name, path in (("the process table, first page", "/"),
                               ("the process table, filtered by name", "/?q=agent-99&status=waiting"),
                               ("the process table's last page", f"/?page={count // 50}"),
                               ("one process's page", f"/p/{count // 2}")):
                step(name)
                rows.append((f"`ringzero ui`: {name}", await median(rounds, lambda path=path: get(path))))
        kernel_store = KernelStore(store)

        async def digest() -> None:
            async for _ in kernel_store.statuses():
                pass

        step("what /events reads to see a change")
        rows.append(("`ringzero ui`: what `/events` reads each half second", await median(rounds, digest)))

        async def ps() -> None:
            for record in await kernel_store.load_processes():
                if not record.status.terminal:
                    await kernel_store.journal(record.pid)

        step("ringzero ps's read")
        rows.append(("`ringzero ps`'s read of the same store (the peer)", await median(max(1, rounds // 3), ps)))
        await store.aclose()
    table = Table(title=f"ringzero ui over {count:,} waiting processes (SQLite), median of {rounds}")
    table.add_column("what")
    table.add_column("ms", justify="right")
    for name, seconds in rows:
        table.add_row(name, f"{seconds * 1000:,.0f}")
    Console(width=120).print(table)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=7)
    arguments = parser.parse_args()
    asyncio.run(main(arguments.count, arguments.rounds))
