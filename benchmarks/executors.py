"""Executors side by side: a warm trivial run, 100 tool calls, throughput at concurrency 1 and 8.

The 100-tool-call column also times ``ctx.exec`` in a durable kernel process (a process spawned
per run, each of its tool calls journaled in SQLite), beside raw pydantic-monty.

Peers measured in the same run: raw pydantic-monty (what MontyExecutor wraps), smolagents'
LocalPythonExecutor (an AST interpreter in the host process) and a cold ``python -c``.
InProcessExecutor isolates nothing and is shown only as the floor.

    .venv/bin/python benchmarks/executors.py [--runs 500] [--tool-call-rounds 10]   # needs: uv sync --extra bench

The 100-tool-call column is one pass; the paired table after it runs raw pydantic-monty,
``MontyExecutor`` and durable ``ctx.exec`` in turn, round after round, and gives each one's
median ratio to raw in the same round (this machine's speed drifts by half within a minute).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import pydantic_monty as pm
from _progress import step
from rich.console import Console
from rich.table import Table

from ringzero import Context, Kernel
from ringzero.checkpointers import SqliteCheckpointer
from ringzero.providers.executors import MontyExecutor, ProcessExecutor
from ringzero.testing import InProcessExecutor

TOOL_CODE = "total = 0\nfor i in range(100):\n    total += double(i)\ntotal"
PANDAS_CODE = ("import pandas as pd\nframe = pd.DataFrame({'g': [i % 10 for i in range(10_000)], 'v': range(10_000)})\n"
               "frame.groupby('g')['v'].sum().to_dict()")
Run = Callable[[str], Awaitable[object]]


def double(i: int) -> int:
    return 2 * i


async def latency(run: Run, code: str, n: int) -> tuple[float, float]:
    for _ in range(min(50, n)):
        await run(code)
    samples = []
    for _ in range(n):
        start = time.perf_counter()
        await run(code)
        samples.append(time.perf_counter() - start)
    samples.sort()
    return statistics.median(samples), samples[int(len(samples) * 0.99) - 1]


async def throughput(run: Run, concurrency: int, seconds: float = 1.0) -> float:
    done = 0
    deadline = time.perf_counter() + seconds

    async def worker() -> None:
        nonlocal done
        while time.perf_counter() < deadline:
            await run("sum(range(100))")
            done += 1

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return done / (time.perf_counter() - start)


def smolagents_runner() -> Run | None:
    try:
        from smolagents.local_python_executor import LocalPythonExecutor
    except ImportError:
        return None
    executor = LocalPythonExecutor(additional_authorized_imports=[])
    executor.send_tools({})
    executor.static_tools["double"] = double  # type: ignore[index]

    async def run(code: str) -> object:
        return executor(code).output

    return run


async def exec_once(ctx: Context, code: str) -> object:
    """A kernel program that runs ``code`` once through ``ctx.exec``, ``double`` its tool."""
    return (await ctx.exec(code, tools={"double": double})).value


async def paired_tool_calls(paths: list[tuple[str, Run]], rounds: int, runs: int = 30) -> Table:
    """The 100-tool-call run on each path in turn, ``rounds`` times (this machine's speed drifts
    within a minute): each path's median latency, and its median ratio to the first path's in the
    same round."""
    for _, run in paths:
        for _ in range(10):
            await run(TOOL_CODE)
    medians: dict[str, list[float]] = {name: [] for name, _ in paths}
    for done in range(rounds):
        step(f"100 tool calls, paired round {done + 1}/{rounds}")
        for name, run in paths:
            medians[name].append((await latency(run, TOOL_CODE, runs))[0])
    base = medians[paths[0][0]]
    table = Table(title=f"100 tool calls from one run, {rounds} paired rounds ({runs} runs a path a round)")
    for column in ("path", "median µs", f"vs {paths[0][0]} (median of rounds)"):
        table.add_column(column, justify="left" if column == "path" else "right")
    for name, values in medians.items():
        ratio = statistics.median(v / b for v, b in zip(values, base, strict=True))
        table.add_row(name, f"{statistics.median(values) * 1e6:,.0f}", f"{ratio:.2f}x")
    return table


async def python_c(code: str) -> object:
    proc = await asyncio.create_subprocess_exec(sys.executable, "-c", f"print({code!r})",
                                                stdout=subprocess.DEVNULL)
    return await proc.wait()


async def main(runs: int, tool_rounds: int) -> None:
    monty = MontyExecutor(max_workers=8)
    process = ProcessExecutor(warm=8)
    await process.start()
    data_process = ProcessExecutor(warm=8, preload=("numpy", "pandas"))
    await data_process.start()
    inproc = InProcessExecutor()
    rows: list[tuple[str, Run, Run | None]] = [
        ("ringzero MontyExecutor", lambda c: monty.run(c), lambda c: monty.run(c, tools={"double": double})),
        ("ringzero ProcessExecutor (full CPython, confined)", lambda c: process.run(c),
         lambda c: process.run(c, tools={"double": double})),
        ("ringzero ProcessExecutor, pandas preloaded", lambda c: data_process.run(c),
         lambda c: data_process.run(c, tools={"double": double})),
        ("ringzero InProcessExecutor (no isolation)", lambda c: inproc.run(c),
         lambda c: inproc.run(c, tools={"double": double})),
    ]
    async with pm.AsyncMonty(min_processes=1, max_processes=8) as pool:

        async def raw_monty(code: str) -> object:
            async with pool.checkout() as session:
                return await session.feed_run(code, external_lookup={"double": double})

        rows.append(("raw pydantic-monty (checkout + feed_run)", raw_monty, raw_monty))
        folder = tempfile.TemporaryDirectory()
        kernel = Kernel(checkpointer=SqliteCheckpointer(Path(folder.name) / "state.db"), executor=monty,
                        monitor_interval=None)
        await kernel.start()

        async def durable_exec(code: str) -> object:
            return await (await kernel.spawn(exec_once, code)).wait()

        rows.append(("ringzero ctx.exec, each tool call journaled (SQLite)", durable_exec,
                     durable_exec))
        smol = smolagents_runner()
        if smol is not None:
            rows.append(("smolagents LocalPythonExecutor", smol, smol))
        rows.append(("python -c (cold start)", python_c, None))
        table = Table(title="Executors (trivial run = '1 + 1'; latencies in microseconds, throughput in runs/s)")
        for column in ("executor", "trivial median", "trivial p99", "100 tool calls median", "runs/s @1", "runs/s @8"):
            table.add_column(column, justify="left" if column == "executor" else "right")
        for name, run, with_tools in rows:
            n = runs if with_tools is not None else max(20, runs // 20)
            step(f"{name}: latency and throughput")
            median, p99 = await latency(run, "1 + 1", n)
            tools = "n/a"
            if with_tools is not None:
                tools = f"{(await latency(with_tools, TOOL_CODE, max(20, n // 5)))[0] * 1e6:,.0f}"
            table.add_row(name, f"{median * 1e6:,.0f}", f"{p99 * 1e6:,.0f}", tools,
                          f"{await throughput(run, 1):,.0f}", f"{await throughput(run, 8):,.0f}")
        if smol is None:
            table.caption = "smolagents not installed: uv sync --extra dev --extra bench"
        paired = await paired_tool_calls([("raw pydantic-monty", raw_monty),
                                          ("ringzero MontyExecutor", lambda c: monty.run(c, tools={"double": double})),
                                          ("ringzero ctx.exec, durable", durable_exec)], tool_rounds)
        pandas_median, _ = await latency(lambda c: data_process.run(c), PANDAS_CODE, 50)
        inproc_pandas, _ = await latency(lambda c: inproc.run(c), PANDAS_CODE, 50)
        await kernel.aclose()
        folder.cleanup()
    await monty.aclose()
    await process.aclose()
    await data_process.aclose()
    Console(width=140).print(table)
    Console(width=140).print(paired)
    Console(width=140).print(f"pandas groupby over 10,000 rows (pandas preloaded by the fork server): "
                             f"ProcessExecutor {pandas_median * 1e3:.1f} ms median, "
                             f"InProcessExecutor {inproc_pandas * 1e3:.1f} ms; Monty cannot import pandas.")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=500)
    parser.add_argument("--tool-call-rounds", type=int, default=10, help="paired rounds of the 100-tool-call run")
    arguments = parser.parse_args()
    asyncio.run(main(arguments.runs, arguments.tool_call_rounds))
