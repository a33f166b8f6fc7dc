"""The programs, tools and host of the crash matrix (``tests/test_crash_matrix.py``).

A program makes four effects from code: keyed payments (``charge``, a host tool), POSTs through
the run's egress (``http_request``, no tool given), or both in turn. It reaches the code by one
of four surfaces: ``ctx.exec``; a LangGraph ``KernelToolNode`` running a ``code_tool``; a CrewAI
``CodeExecutionTool`` run from a worker thread; a session (``ctx.session()``), each effect a
step. The executor is Monty, the process sandbox or the outside package's ``PipeExecutor``
(which calls its tools itself).

Everything a host needs comes from the environment, so that ``ringzero resume --kernel
tests.crash_matrix_programs:make_kernel`` rebuilds the same kernel: ``MATRIX_EXECUTOR``,
``MATRIX_LOG`` (where ``charge`` writes ``start N KEY`` and ``end N KEY``), ``MATRIX_HOLD``
(the payment that waits, the first time, long enough for the host to be killed inside it, or
the POST whose answer takes two seconds),
``MATRIX_API`` and ``MATRIX_CA`` (the HTTPS server the POSTs go to, and its CA).

``python -m tests.crash_matrix_programs DB SURFACE EFFECT`` spawns the program, prints its pid,
and waits to be killed.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from pathlib import Path
from typing import Any

from ringzero import Context, Egress, ExecLimits, Kernel
from ringzero.checkpointers import open_checkpointer

STEPS = 4
EFFECTS = ("tools", "egress", "mixed")
SURFACES = ("exec", "code_tool", "crewai", "session")
EXECUTORS = ("monty", "process", "outside")


def charge(n: int, idempotency_key: str = "") -> str:
    """Payment ``n``, logged as it starts and ends with the key the kernel gave it; the one
    ``MATRIX_HOLD`` names waits the first time, for the kill."""
    log = Path(os.environ["MATRIX_LOG"])
    with log.open("a") as out:
        out.write(f"start {n} {idempotency_key}\n")
    held = log.parent / "held"
    if str(n) == os.environ.get("MATRIX_HOLD") and not held.exists():
        held.touch()
        time.sleep(60)
    with log.open("a") as out:
        out.write(f"end {n} {idempotency_key}\n")
    return f"paid {n}"


def step_kinds(effect: str) -> list[str]:
    """What each of the four steps is: ``charge`` or ``post``."""
    return {"tools": ["charge"] * STEPS, "egress": ["post"] * STEPS,
            "mixed": ["charge", "post"] * (STEPS // 2)}[effect]


def lines_of(effect: str) -> list[str]:
    """The line of each of the four steps; the POST ``MATRIX_HOLD`` names goes where the answer
    takes a while (``/orders?hold``), so that a kill right after it arrives leaves it in flight."""
    url = f"https://api.test:{os.environ.get('MATRIX_API', '0')}/orders"
    held = os.environ.get("MATRIX_HOLD")
    steps = [f"charge({n})" if kind == "charge" else
             f"http_request('POST', '{url}{'?hold' if str(n) == held else ''}', body='{n}')['status']"
             for n, kind in enumerate(step_kinds(effect))]
    return [f"done.append({step})" for step in steps]


def code_of(effect: str) -> str:
    """The four steps as one piece of code."""
    return "done = []\n" + "".join(f"{line}\n" for line in lines_of(effect)) + "done"


def limits_of(effect: str) -> ExecLimits:
    if effect == "tools":
        return ExecLimits(wall_seconds=120)
    port = os.environ["MATRIX_API"]
    return ExecLimits(wall_seconds=120, egress=Egress(allow=[f"api.test:{port}"], addresses=["127.0.0.1"],
                                                      trust=os.environ["MATRIX_CA"],
                                                      resolver=lambda host: ["127.0.0.1"]))


async def by_exec(ctx: Context, effect: str) -> Any:
    tools = {"charge": charge} if "charge" in step_kinds(effect) else None
    result = await ctx.exec(code_of(effect), tools=tools, limits=limits_of(effect))
    return result.value if result.error is None else f"error: {result.error.type}"


async def by_code_tool(ctx: Context, effect: str) -> Any:
    from langchain_core.messages import AIMessage, HumanMessage
    from langchain_core.tools import StructuredTool
    from langgraph.graph import START, MessagesState, StateGraph

    from ringzero.adapters.langgraph import KernelToolNode, code_tool

    node = KernelToolNode([code_tool([StructuredTool.from_function(charge)])])
    call = {"name": "run_python", "args": {"code": code_of(effect)}, "id": "call-0", "type": "tool_call"}

    def model(state: MessagesState) -> dict[str, Any]:
        return {"messages": [AIMessage("", tool_calls=[call])]}

    graph = StateGraph(MessagesState)
    graph.add_node("model", model)
    graph.add_node("tools", node)
    graph.add_edge(START, "model")
    graph.add_edge("model", "tools")
    result = await graph.compile().ainvoke({"messages": [HumanMessage("pay")]})
    return str(result["messages"][-1].content)


async def by_crewai(ctx: Context, effect: str) -> Any:
    from ringzero.adapters.crewai import CodeExecutionTool

    tool = CodeExecutionTool([charge])
    try:
        return await asyncio.to_thread(tool.run, code=code_of(effect))
    finally:
        await tool.aclose()


async def by_session(ctx: Context, effect: str) -> Any:
    """Each step a step of one session (``ctx.session()``), what it appends kept between them."""
    tools = {"charge": charge} if "charge" in step_kinds(effect) else None
    async with ctx.session(limits=limits_of(effect)) as session:
        await session.exec("done = []")
        for line in lines_of(effect):
            await session.exec(line, tools=tools)
        result = await session.exec("done")
    return result.value if result.error is None else f"error: {result.error.type}"


PROGRAMS = {"exec": by_exec, "code_tool": by_code_tool, "crewai": by_crewai, "session": by_session}


def make_kernel(db: Any) -> Kernel:
    executor: Any
    kind = os.environ["MATRIX_EXECUTOR"]
    if kind == "outside":
        from ringzero_outside.executor import PipeExecutor

        executor = PipeExecutor(wall_seconds=120)
    else:
        from ringzero.providers.executors import MontyExecutor, ProcessExecutor

        executor = MontyExecutor() if kind == "monty" else ProcessExecutor()
    return Kernel(checkpointer=open_checkpointer(str(db)), executor=executor)


async def host(db: str, surface: str, effect: str) -> None:
    async with make_kernel(db) as kernel:
        handle = await kernel.spawn(PROGRAMS[surface], effect, name=f"{surface}-{effect}")
        print(handle.pid, flush=True)
        await asyncio.sleep(3600)  # the trial kills this host


if __name__ == "__main__":
    asyncio.run(host(sys.argv[1], sys.argv[2], sys.argv[3]))
