"""KernelToolNode is LangGraph's ToolNode; inside a kernel process its calls are journaled.

LangGraph's own ToolNode tests run against it in test_upstream_langgraph.py; these tests cover
what they cannot see: the journal, replay after a restart, budgets, nested syscalls.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Annotated, Any

import pytest
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.tools import InjectedToolCallId, tool
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition
from langgraph.types import Command

from ringzero import Context, Kernel, Limits
from ringzero.adapters.langchain import KernelChatModel
from ringzero.adapters.langgraph import KernelToolNode
from ringzero.checkpointers import SqliteCheckpointer
from ringzero.core.contract.errors import BudgetExceeded, WrongEventLoop
from ringzero.core.contract.fingerprints import fingerprint
from ringzero.testing import ScriptedProvider

RUNS: list[str] = []


@tool
def add(a: int, b: int) -> int:
    """Add two numbers."""
    RUNS.append(f"add {a} {b}")
    return a + b


@tool
def rename(name: str, tool_call_id: Annotated[str, InjectedToolCallId]) -> Command:
    """Set the user's name in the graph state."""
    RUNS.append(f"rename {name}")
    return Command(update={"name": name, "messages": [ToolMessage(f"now {name}", tool_call_id=tool_call_id)]})


@tool
def explode() -> str:
    """Always fails."""
    RUNS.append("explode")
    raise RuntimeError("boom")


@tool
async def ask_model(question: str) -> str:
    """A tool that asks the model itself (a sub-agent)."""
    RUNS.append(f"ask {question}")
    return str((await KernelChatModel().ainvoke(question)).content)


class State(MessagesState):
    name: str


def graph_with(node: ToolNode, calls: list[dict[str, Any]]) -> Any:
    """agent -> tools -> agent -> END, the agent asking for ``calls`` once, then answering."""
    def agent(state: State) -> dict[str, Any]:  # sync, so that graph.invoke runs it too
        if any(isinstance(m, ToolMessage) for m in state["messages"]):
            return {"messages": [AIMessage("done")]}
        return {"messages": [AIMessage("", tool_calls=[{**c, "id": f"call-{i}"} for i, c in enumerate(calls)])]}

    graph = StateGraph(State)
    graph.add_node("agent", agent)
    graph.add_node("tools", node)
    graph.add_edge(START, "agent")
    graph.add_conditional_edges("agent", tools_condition)
    graph.add_edge("tools", "agent")
    return graph.compile()


def summary(result: dict[str, Any]) -> list[str]:
    return [f"{m.name}:{m.status}:{m.content}" for m in result["messages"] if isinstance(m, ToolMessage)]


async def test_an_ordinary_graph_runs_with_kernel_tool_node_in_place_of_tool_node_outside_a_kernel() -> None:
    RUNS.clear()
    calls = [{"name": "add", "args": {"a": 2, "b": 3}}, {"name": "rename", "args": {"name": "Ada"}}]
    node = KernelToolNode([add, rename, explode])
    assert isinstance(node, ToolNode)
    result = await graph_with(node, calls).ainvoke({"messages": [HumanMessage("hi")]})
    assert summary(result) == ["add:success:5", "rename:success:now Ada"] and result["name"] == "Ada"
    sync_result = await asyncio.to_thread(graph_with(node, calls).invoke, {"messages": [HumanMessage("hi")]})
    assert summary(sync_result) == summary(result)
    assert sorted(RUNS) == ["add 2 3", "add 2 3", "rename Ada", "rename Ada"]


async def tools_then_wait(ctx: Context) -> list[str]:
    """Runs a graph whose tools return a value, a Command and an error, then waits for a message."""
    node = KernelToolNode([add, rename, explode], handle_tool_errors=True)
    calls = [{"name": "add", "args": {"a": 1, "b": 2}}, {"name": "rename", "args": {"name": "Lin"}},
             {"name": "explode", "args": {}}]
    result = await graph_with(node, calls).ainvoke({"messages": [HumanMessage("go")]})
    await ctx.recv()  # the host "dies" here; the resumed program replays the graph
    return [*summary(result), f"name={result['name']}"]


async def test_a_resumed_graph_gets_its_recorded_tool_results_without_running_a_tool_again(tmp_path: Path) -> None:
    RUNS.clear()
    db = tmp_path / "k.db"
    first = Kernel(checkpointer=SqliteCheckpointer(db))
    handle = await first.spawn(tools_then_wait)
    while handle.status.value != "waiting":
        await asyncio.sleep(0.005)
    assert sorted(RUNS) == ["add 1 2", "explode", "rename Lin"]
    kinds = [e.kind for e in await first.store.journal(handle.pid)]
    await first.aclose()
    assert kinds.count("tool") == 3

    async with Kernel(checkpointer=SqliteCheckpointer(db)) as again:
        [resumed] = await again.recover()
        await resumed.send("go on")
        answer = await resumed.wait()
    assert sorted(RUNS) == ["add 1 2", "explode", "rename Lin"], "a recorded tool call ran again"
    assert answer == ["add:success:3", "rename:success:now Lin",
                      "explode:error:Error: RuntimeError('boom')\n Please fix your mistakes.", "name=Lin"]


async def asks_through_a_tool(ctx: Context) -> str:
    node = KernelToolNode([ask_model])
    result = await graph_with(node, [{"name": "ask_model", "args": {"question": "capital of France?"}}]).ainvoke(
        {"messages": [HumanMessage("go")]})
    await ctx.recv()
    return str(summary(result))


async def test_an_llm_call_inside_a_tool_is_part_of_the_tool_calls_record(tmp_path: Path) -> None:
    RUNS.clear()
    db = tmp_path / "k.db"
    model = ScriptedProvider(lambda request: "Paris")
    first = Kernel(checkpointer=SqliteCheckpointer(db), llm=model)
    handle = await first.spawn(asks_through_a_tool)
    while handle.status.value != "waiting":
        await asyncio.sleep(0.005)
    journal = [(e.kind, e.summary) for e in await first.store.journal(handle.pid)]
    await first.aclose()
    assert journal[0][0] == "tool" and journal[0][1].startswith("ask_model(") and \
        [k for k, _ in journal].count("llm") == 0, journal
    assert model.calls == 1

    again_model = ScriptedProvider(lambda request: "not asked again")
    async with Kernel(checkpointer=SqliteCheckpointer(db), llm=again_model) as again:
        [resumed] = await again.recover()
        await resumed.send("go on")
        assert await resumed.wait() == "['ask_model:success:Paris']"
    assert again_model.calls == 0 and RUNS == ["ask capital of France?"]


async def many_tool_calls(ctx: Context) -> None:
    node = KernelToolNode([add])
    await graph_with(node, [{"name": "add", "args": {"a": i, "b": i}} for i in range(10)]).ainvoke(
        {"messages": [HumanMessage("go")]})


async def test_tool_calls_count_against_the_process_step_budget() -> None:
    RUNS.clear()
    async with Kernel() as kernel:
        handle = await kernel.spawn(many_tool_calls, limits=Limits(steps=4))
        with pytest.raises(BudgetExceeded, match="steps"):
            await handle.wait()
    assert len(RUNS) < 10


async def blocks_its_own_loop(ctx: Context) -> str:
    node = KernelToolNode([add])
    try:
        graph_with(node, [{"name": "add", "args": {"a": 1, "b": 1}}]).invoke({"messages": [HumanMessage("go")]})
    except WrongEventLoop as exc:
        return str(exc)
    return "no error"


async def test_a_sync_invoke_on_the_process_loop_is_refused_by_name_instead_of_hanging() -> None:
    async with Kernel() as kernel:
        message = await (await kernel.spawn(blocks_its_own_loop)).wait()
    assert "asyncio.to_thread(graph.invoke" in message


async def sync_graph_in_a_thread(ctx: Context) -> list[str]:
    node = KernelToolNode([add])
    graph = graph_with(node, [{"name": "add", "args": {"a": i, "b": 1}} for i in range(4)])
    result = await asyncio.to_thread(graph.invoke, {"messages": [HumanMessage("go")]})
    return summary(result)


async def test_a_sync_graph_in_a_worker_thread_journals_its_calls_in_call_order(tmp_path: Path) -> None:
    async with Kernel(checkpointer=SqliteCheckpointer(tmp_path / "k.db")) as kernel:
        handle = await kernel.spawn(sync_graph_in_a_thread)
        assert await handle.wait() == [f"add:success:{i + 1}" for i in range(4)]
        requests = [e for e in await kernel.store.journal(handle.pid) if e.kind == "tool"]
    in_call_order = [fingerprint({"name": "add", "request": {"id": f"call-{i}", "args": {"a": i, "b": 1}}})
                     for i in range(4)]
    assert [e.fingerprint for e in requests] == in_call_order
