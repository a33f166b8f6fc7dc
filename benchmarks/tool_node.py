"""The cost per tool call of KernelToolNode against LangGraph's ToolNode, same tools, same graph.

The graph is one node that emits an AI message with CALLS tool calls, then the tool node, then
the end. Both tool nodes run inside a kernel process (so the only difference is the node); the
difference between rows is what running each call as a journaled syscall costs. The sandboxed
rows run the same tool body in the Monty executor under either node.

    .venv/bin/python benchmarks/tool_node.py [--invocations 200] [--calls 10]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from _progress import step
from langchain_core.messages import AIMessage, HumanMessage
from langchain_core.tools import BaseTool, StructuredTool
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode
from rich.console import Console
from rich.table import Table

from ringzero import Context, Kernel
from ringzero.adapters.langgraph import KernelToolNode, sandboxed
from ringzero.checkpointers import MemoryCheckpointer, SqliteCheckpointer
from ringzero.core.contract.protocols import Checkpointer
from ringzero.providers.executors import MontyExecutor

# The measured program is a closure over its graphs on purpose: nothing here is resumed after a crash.
warnings.filterwarnings("ignore", message="program .* is defined where no other Python process can import it")


def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def graph(node: Any, calls: int) -> Any:
    def model(state: MessagesState) -> dict[str, Any]:
        tool_calls = [{"id": f"c{i}", "name": "add", "args": {"a": i, "b": 1}} for i in range(calls)]
        return {"messages": [AIMessage("", tool_calls=tool_calls)]}

    g = StateGraph(MessagesState)
    g.add_node("model", model)
    g.add_node("tools", node)
    g.add_edge(START, "model")
    g.add_edge("model", "tools")
    g.add_edge("tools", END)
    return g.compile()


async def per_call_us(make_node: Callable[[], Any], store: Checkpointer, invocations: int, calls: int) -> float:
    """Median microseconds per tool call: (one invocation with CALLS calls - one with none) / CALLS."""
    with_calls, without = graph(make_node(), calls), graph(make_node(), 0)
    samples: dict[int, list[float]] = {calls: [], 0: []}

    async def program(ctx: Context) -> None:
        for app, n in ((with_calls, calls), (without, 0)):
            for i in range(invocations + 20):
                start = time.perf_counter()
                await app.ainvoke({"messages": [HumanMessage("go")]})
                if i >= 20:  # the first runs warm up
                    samples[n].append(time.perf_counter() - start)

    async with Kernel(checkpointer=store, executor=MontyExecutor()) as kernel:
        await (await kernel.spawn(program)).wait()
    return (statistics.median(samples[calls]) - statistics.median(samples[0])) / calls * 1e6


async def main(invocations: int, calls: int) -> None:
    host_tool: BaseTool = StructuredTool.from_function(add)
    rows: list[tuple[str, Callable[[], Any], str]] = [
        ("LangGraph ToolNode, host tool (the peer)", lambda: ToolNode([host_tool]), "memory"),
        ("KernelToolNode, host tool, journal in memory", lambda: KernelToolNode([host_tool]), "memory"),
        ("KernelToolNode, host tool, journal in SQLite (durable)", lambda: KernelToolNode([host_tool]), "sqlite"),
        ("LangGraph ToolNode, sandboxed(add) in Monty (the peer)", lambda: ToolNode([sandboxed(add)]), "memory"),
        ("KernelToolNode, sandboxed(add) in Monty, journal in SQLite",
         lambda: KernelToolNode([sandboxed(add)]), "sqlite"),
    ]
    table = Table(title=f"Cost per tool call: {invocations} graph invocations x {calls} parallel calls each")
    table.add_column("tool node")
    table.add_column("µs per call (median)", justify="right")
    table.add_column("vs the peer", justify="right")
    results: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for i, (name, make, kind) in enumerate(rows):
            store = MemoryCheckpointer() if kind == "memory" else SqliteCheckpointer(Path(tmp) / f"{i}.db")
            step(name)
            results[name] = await per_call_us(make, store, invocations, calls)
    for name, cost in results.items():
        peer = results[rows[3][0]] if "sandboxed" in name else results[rows[0][0]]
        table.add_row(name, f"{cost:,.0f}", "-" if "the peer" in name else f"{cost - peer:+,.0f} µs")
    Console(width=130).print(table)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--invocations", type=int, default=200)
    parser.add_argument("--calls", type=int, default=10)
    args = parser.parse_args()
    asyncio.run(main(args.invocations, args.calls))
