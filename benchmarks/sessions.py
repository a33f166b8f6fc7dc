"""A step of a session: code that uses what earlier steps defined, and calls a host tool.

Paths measured in one run, each the median of ``--steps`` steps after a first step that
defines a function and a class:

- ``ctx.session()`` in a kernel process, each step journaled in SQLite (durable), on Monty and
  on the process sandbox (one confined CPython process kept for the session);
- the same session outside a kernel (``MontyExecutor().session()``: no journal);
- a fresh ``ctx.exec`` in a kernel process, on each, which must define the function and the
  class again at every step (what a session saves an agent from);
- smolagents' ``LocalPythonExecutor`` (the peer: an AST interpreter in the host process, no
  isolation, no journal), its state kept from step to step.

    .venv/bin/python benchmarks/sessions.py [--steps 300]      # needs: uv sync --extra bench
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
from _progress import step
from rich.console import Console
from rich.table import Table

from ringzero import Context, Kernel
from ringzero.checkpointers import SqliteCheckpointer
from ringzero.core.contract.protocols import Executor
from ringzero.providers.executors import MontyExecutor, ProcessExecutor

SETUP = """
def scaled(city):
    return population(city) * 1_000_000

class Report:
    def __init__(self, rows):
        self.rows = rows
"""
STEP = "Report([scaled('Paris'), scaled('Lyon')]).rows"


def population(city: str) -> float:
    return {"Paris": 2.1, "Lyon": 0.5}[city]


TOOLS = {"population": population}


async def timed(steps: int, one: Callable[[], Awaitable[Any]]) -> float:
    """The median seconds of ``steps`` calls of ``one`` (after ten not counted)."""
    return statistics.median(await _timing.samples(one, steps, warm=10))


async def stepping(ctx: Context, steps: int, fresh: bool) -> float:
    """The kernel program: its steps in one session, or each a fresh ``ctx.exec`` with the setup
    again; the median seconds of a step."""
    if fresh:
        return await timed(steps, lambda: ctx.exec(SETUP + STEP, tools=TOOLS))
    async with ctx.session() as session:
        await session.exec(SETUP, tools=TOOLS)
        return await timed(steps, lambda: session.exec(STEP, tools=TOOLS))


async def in_kernel(steps: int, fresh: bool, executor: Callable[[], Executor] = MontyExecutor) -> float:
    with tempfile.TemporaryDirectory() as folder:
        async with Kernel(checkpointer=SqliteCheckpointer(Path(folder) / "state.db"), executor=executor(),
                          monitor_interval=None) as kernel:
            return float(await (await kernel.spawn(stepping, steps, fresh)).wait(timeout=600))


async def outside(steps: int) -> float:
    executor = MontyExecutor()
    try:
        async with executor.session() as session:
            await session.run(SETUP, tools=TOOLS)
            return await timed(steps, lambda: session.run(STEP, tools=TOOLS))
    finally:
        await executor.aclose()


async def smolagents_local(steps: int) -> float | None:
    try:
        from smolagents.local_python_executor import LocalPythonExecutor
    except ImportError:
        return None
    executor = LocalPythonExecutor(additional_authorized_imports=[])
    executor.send_tools({})
    executor.static_tools["population"] = population
    executor(SETUP)

    async def one() -> Any:
        return executor(STEP)

    return await timed(steps, one)


async def main(steps: int) -> None:
    rows: list[tuple[str, float | None]] = []
    step("ctx.session() in a kernel process, journaled in SQLite")
    rows.append(("ringzero `ctx.session()` on Monty, a step journaled (SQLite)", await in_kernel(steps, fresh=False)))
    step("a fresh ctx.exec at every step, the setup again")
    fresh = await in_kernel(steps, fresh=True)
    rows.append(("ringzero fresh `ctx.exec` on Monty, the setup again at every step (SQLite)", fresh))
    step("ctx.session() on the process sandbox")
    rows.append(("ringzero `ctx.session()` on `ProcessExecutor`, a step journaled (SQLite)",
                 await in_kernel(steps, fresh=False, executor=ProcessExecutor)))
    step("a fresh ctx.exec on the process sandbox")
    rows.append(("ringzero fresh `ctx.exec` on `ProcessExecutor`, the setup again (SQLite)",
                 await in_kernel(steps, fresh=True, executor=ProcessExecutor)))
    step("MontyExecutor().session() outside a kernel")
    rows.append(("ringzero `MontyExecutor().session()`, no journal", await outside(steps)))
    step("smolagents LocalPythonExecutor")
    peer = await smolagents_local(steps)
    rows.append(("smolagents `LocalPythonExecutor` (the peer: host process, no journal)", peer))
    table = Table(title=f"A session's step: code using what an earlier step defined, one host tool call "
                        f"({steps} steps)")
    table.add_column("path")
    table.add_column("median µs a step", justify="right")
    for name, seconds in rows:
        table.add_row(name, "not installed (uv sync --extra bench)" if seconds is None else f"{seconds * 1e6:,.0f}")
    Console(width=140).print(table)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    asyncio.run(main(parser.parse_args().steps))
