"""Checkpointers under LangGraph: a 3-node graph invoked on distinct threads, and raw ops/s.

Peers measured in the same run: LangGraph's AsyncSqliteSaver and InMemorySaver. Durable rows
(SQLite, PostgreSQL) have their record on disk when each call returns. PostgreSQL is used
when RINGZERO_BENCH_POSTGRES_DSN names a server (the tests' fixture starts one).

    .venv/bin/python benchmarks/checkpointers.py [--graphs 200] [--rounds 5] [--pairs 16]

The table runs the savers in turn, ``--rounds`` times, and keeps each one's median (the best
of two rounds, as it did before, picked a fast moment for one saver and a slow one for another
on this shared machine, whose speed drifts by 20% within a minute). The run ends with paired
rounds as well: ``KernelSaver(SqliteCheckpointer)`` then ``InMemorySaver``, 150 graphs each,
``--pairs`` times, and the median of the pairs' ratios, with LangGraph's default durability
(``"async"``: a step's checkpoint is written while the next step runs) and with ``"sync"``
(written before the next step starts), from ``ainvoke`` and from ``graph.invoke`` (the sync
API, in a thread with no event loop).
"""

from __future__ import annotations

import argparse
import asyncio
import operator
import os
import statistics
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Annotated, Any

from _progress import step
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, StateGraph
from rich.console import Console
from rich.table import Table
from typing_extensions import TypedDict

from ringzero.adapters.langgraph import KernelSaver
from ringzero.checkpointers import SqliteCheckpointer
from ringzero.core.contract.types import Checkpoint, PendingWrite


class State(TypedDict):
    log: Annotated[list[str], operator.add]


def graph(saver: BaseCheckpointSaver[Any]) -> Any:
    g = StateGraph(State)
    for name in ("fetch", "think", "answer"):
        g.add_node(name, lambda state, n=name: {"log": [n]})
    g.add_edge(START, "fetch")
    g.add_edge("fetch", "think")
    g.add_edge("think", "answer")
    g.add_edge("answer", END)
    return g.compile(checkpointer=saver)


@asynccontextmanager
async def kernel_sqlite(tmp: Path) -> AsyncIterator[BaseCheckpointSaver[Any]]:
    store = SqliteCheckpointer(tmp / "kernel.db")
    yield KernelSaver(store)
    await store.aclose()


@asynccontextmanager
async def async_sqlite(tmp: Path) -> AsyncIterator[BaseCheckpointSaver[Any]]:
    from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

    async with AsyncSqliteSaver.from_conn_string(str(tmp / "langgraph.db")) as saver:
        yield saver


@asynccontextmanager
async def in_memory(tmp: Path) -> AsyncIterator[BaseCheckpointSaver[Any]]:
    yield InMemorySaver()


@asynccontextmanager
async def kernel_postgres(tmp: Path) -> AsyncIterator[BaseCheckpointSaver[Any]]:
    from ringzero.checkpointers import PostgresCheckpointer

    store = PostgresCheckpointer(os.environ["RINGZERO_BENCH_POSTGRES_DSN"])
    yield KernelSaver(store)
    await store.aclose()


async def graph_throughput(make: Callable[[Path], Any], tmp: Path, graphs: int, concurrency: int,
                           durability: str | None = None) -> float:
    """Graphs/s with ``concurrency`` invocations in flight at any time (1: one after another);
    ``durability``: LangGraph's (None: its default, ``"async"``)."""
    os.makedirs(tmp, exist_ok=True)
    async with make(tmp) as saver:
        app = graph(saver)
        for i in range(20):
            await app.ainvoke({"log": []}, {"configurable": {"thread_id": f"{tmp.name}-warm-up-{i}"}},
                              durability=durability)
        todo = iter(range(graphs))

        async def worker() -> None:
            for i in todo:
                await app.ainvoke({"log": []}, {"configurable": {"thread_id": f"{tmp.name}-t{i}"}},
                                  durability=durability)

        start = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return graphs / (time.perf_counter() - start)


async def paired_ratio(tmp: Path, pairs: int, concurrency: int, durability: str) -> tuple[float, float, float]:
    """KernelSaver(SqliteCheckpointer) / InMemorySaver graphs/s, both with ``durability``, each
    pair run back to back: the median ratio and its quartiles."""
    ratios = []
    for i in range(pairs):
        step(f"pair {i + 1}/{pairs}, {concurrency} at a time, durability={durability!r}")
        where = f"{durability}-{concurrency}-{i}"
        kernel = await graph_throughput(kernel_sqlite, tmp / f"pair-k-{where}", 150, concurrency, durability)
        memory = await graph_throughput(in_memory, tmp / f"pair-m-{where}", 150, concurrency, durability)
        ratios.append(kernel / memory)
    ratios.sort()
    return statistics.median(ratios), ratios[len(ratios) // 4], ratios[(3 * len(ratios)) // 4]


def sync_graph_throughput(saver: BaseCheckpointSaver[Any], name: str, graphs: int, durability: str) -> float:
    """Graphs/s of ``graph.invoke`` (LangGraph's sync API) one after another, in this thread."""
    app = graph(saver)
    for i in range(20):
        app.invoke({"log": []}, {"configurable": {"thread_id": f"{name}-warm-up-{i}"}}, durability=durability)
    start = time.perf_counter()
    for i in range(graphs):
        app.invoke({"log": []}, {"configurable": {"thread_id": f"{name}-t{i}"}}, durability=durability)
    return graphs / (time.perf_counter() - start)


def paired_sync_ratio(tmp: Path, pairs: int, durability: str) -> tuple[float, float, float]:
    """``paired_ratio`` for ``graph.invoke`` from a thread with no event loop (a sync program):
    KernelSaver's steps are appended from that thread (SQLite takes records from any thread)."""
    ratios = []
    for i in range(pairs):
        step(f"pair {i + 1}/{pairs}, graph.invoke, durability={durability!r}")
        store = SqliteCheckpointer(tmp / f"sync-{durability}-{i}.db")
        with KernelSaver(store) as saver:
            kernel = sync_graph_throughput(saver, f"k{i}", 150, durability)
            saver.home.run_sync(store.aclose(), "closing the benchmark's store")
        memory = sync_graph_throughput(InMemorySaver(), f"m{i}", 150, durability)
        ratios.append(kernel / memory)
    ratios.sort()
    return statistics.median(ratios), ratios[len(ratios) // 4], ratios[(3 * len(ratios)) // 4]


async def raw_ops(tmp: Path, n: int) -> dict[str, float]:
    store = SqliteCheckpointer(tmp / "raw.db")
    rates = {}
    start = time.perf_counter()
    for i in range(n):
        await store.put(Checkpoint("raw", "", f"{i:08d}", b"x" * 1024, metadata={"step": i}))
    rates["put"] = n / (time.perf_counter() - start)
    start = time.perf_counter()
    for i in range(n):
        await store.put_writes("raw", "", f"{i:08d}", [PendingWrite("task", "out", b"y" * 256)])
    rates["put_writes"] = n / (time.perf_counter() - start)
    start = time.perf_counter()
    for i in range(n):
        await store.get("raw", "", f"{i:08d}")
    rates["get"] = n / (time.perf_counter() - start)
    await store.aclose()
    return rates


async def main(graphs: int, pairs: int, rounds: int) -> None:
    cases: list[tuple[str, Callable[[Path], Any]]] = [
        ("KernelSaver(SqliteCheckpointer), durable", kernel_sqlite),
        ("LangGraph AsyncSqliteSaver (the peer)", async_sqlite),
        ("LangGraph InMemorySaver (the peer, not durable)", in_memory),
    ]
    if os.environ.get("RINGZERO_BENCH_POSTGRES_DSN"):
        cases.insert(1, ("KernelSaver(PostgresCheckpointer), durable", kernel_postgres))
    table = Table(title=f"3-node LangGraph graph, {graphs} invocations on distinct threads (graphs/s)")
    table.add_column("checkpointer")
    levels = (1, 16, 200)
    for level in levels:
        table.add_column("sequential" if level == 1 else f"{level} at a time", justify="right")
    with tempfile.TemporaryDirectory() as tmp:
        measured: dict[str, dict[int, list[float]]] = {name: {level: [] for level in levels} for name, _ in cases}
        for done in range(rounds):  # the savers interleaved, each one's median kept: this machine is noisy
            for level in levels:
                for name, make in cases:
                    step(f"round {done + 1}/{rounds}: {name}, {level} at a time")
                    rate = await graph_throughput(make, Path(tmp) / f"{done}-{level}", graphs, level)
                    measured[name][level].append(rate)
        rates = {name: {level: statistics.median(runs) for level, runs in by_level.items()}
                 for name, by_level in measured.items()}
        ceiling = rates["LangGraph InMemorySaver (the peer, not durable)"]
        for name, by_level in rates.items():
            table.add_row(name, *(f"{by_level[level]:,.0f} ({by_level[level] / ceiling[level]:.2f}x)"
                                  for level in levels))
        paired = {(mode, level): await paired_ratio(Path(tmp), pairs, level, mode)
                  for mode in ("async", "sync") for level in (1, 16)} if pairs else {}
        sync_paired = {mode: await asyncio.to_thread(paired_sync_ratio, Path(tmp), pairs, mode)
                       for mode in ("async", "sync")} if pairs else {}
        step("SqliteCheckpointer raw ops")
        raw = await raw_ops(Path(tmp), 2000)
    console = Console(width=140)
    console.print(table)
    console.print("(x): against LangGraph's InMemorySaver at the same concurrency, the ceiling for any saver")
    for (mode, level), (median, low, high) in paired.items():
        console.print(f"KernelSaver(SqliteCheckpointer) / InMemorySaver, durability={mode!r}, {pairs} pairs back to "
                      f"back, {level} at a time: median {median:.2f}x (quartiles {low:.2f}x to {high:.2f}x)")
    for mode, (median, low, high) in sync_paired.items():
        console.print(f"the same with graph.invoke (LangGraph's sync API, from a thread), durability={mode!r}, {pairs} "
                      f"pairs: median {median:.2f}x (quartiles {low:.2f}x to {high:.2f}x)")
    console.print("SqliteCheckpointer raw ops/s (sequential, durable): "
                  + ", ".join(f"{op} {rate:,.0f}" for op, rate in raw.items()))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--graphs", type=int, default=200)
    parser.add_argument("--pairs", type=int, default=16, help="paired rounds at the end (0: none)")
    parser.add_argument("--rounds", type=int, default=5, help="rounds of the table, each saver's median kept")
    options = parser.parse_args()
    asyncio.run(main(options.graphs, options.pairs, options.rounds))
