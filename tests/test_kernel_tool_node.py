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


# ------------------------------------------------------- keys and in-doubt calls
HANG: set[str] = set()
KEYS_SEEN: list[str] = []


@tool
async def charge(amount: int, idempotency_key: str = "") -> str:
    """Charge the card once per idempotency key."""
    KEYS_SEEN.append(idempotency_key)
    RUNS.append(f"charge {amount}")
    if "charge" in HANG:
        await asyncio.sleep(3600)  # the host dies while the payment runs
    return f"charged {amount} under {idempotency_key}"


@tool
async def notify(text: str) -> str:
    """Send a message: no key, not safe to repeat."""
    RUNS.append(f"notify {text}")
    if "notify" in HANG:
        await asyncio.sleep(3600)
    return f"sent {text}"


def pays(in_doubt: str) -> Any:
    async def program(ctx: Context) -> list[str]:
        node = KernelToolNode([charge, notify], in_doubt=in_doubt)
        calls = [{"name": "charge", "args": {"amount": 5}}, {"name": "notify", "args": {"text": "paid"}}]
        result = await graph_with(node, calls).ainvoke({"messages": [HumanMessage("go")]})
        return summary(result)
    program.__qualname__ = f"pays_{in_doubt}"
    return program


async def crash_inside(db: Path, tool_name: str, program: Any) -> None:
    """Run ``program`` until ``tool_name`` hangs in its live call and the other tool call of its
    turn is recorded (the two run at once), then stop the host."""
    HANG.add(tool_name)
    try:
        async with Kernel(checkpointer=SqliteCheckpointer(db)) as kernel:
            handle = await kernel.spawn(program, name="pays")
            while not any(run.startswith(tool_name) for run in RUNS) or \
                    sum(e.kind == "tool" for e in await kernel.store.journal(handle.pid)) < 1:
                await asyncio.sleep(0.005)
    finally:
        HANG.clear()


async def resumed(db: Path, program: Any) -> Any:
    async with Kernel(checkpointer=SqliteCheckpointer(db)) as kernel:
        [handle] = await kernel.recover(programs={"pays": program})
        return await handle.wait(timeout=30)


async def test_a_keyed_tool_gets_the_kernels_key_hidden_from_the_model_the_same_when_run_again(
        tmp_path: Path) -> None:
    from langchain_core.utils.function_calling import convert_to_openai_tool

    RUNS.clear()
    KEYS_SEEN.clear()
    program = pays("raise")
    KernelToolNode([charge])
    assert list(convert_to_openai_tool(charge)["function"]["parameters"]["properties"]) == ["amount"]
    await crash_inside(tmp_path / "k.db", "charge", program)
    got = await resumed(tmp_path / "k.db", program)
    assert RUNS.count("charge 5") == 2 and len(KEYS_SEEN) == 2
    assert KEYS_SEEN[0] == KEYS_SEEN[1] and KEYS_SEEN[0].startswith("rz-1-"), KEYS_SEEN
    assert got == [f"charge:success:charged 5 under {KEYS_SEEN[0]}", "notify:success:sent paid"]


async def test_a_key_the_model_passes_is_replaced_by_the_kernels(tmp_path: Path) -> None:
    KEYS_SEEN.clear()

    async def passes_a_key(ctx: Context) -> list[str]:
        node = KernelToolNode([charge])
        calls = [{"name": "charge", "args": {"amount": 1, "idempotency_key": "made-up"}}]
        return summary(await graph_with(node, calls).ainvoke({"messages": [HumanMessage("go")]}))

    async with Kernel(checkpointer=SqliteCheckpointer(tmp_path / "k.db")) as kernel:
        await (await kernel.spawn(passes_a_key)).wait()
    assert KEYS_SEEN and KEYS_SEEN[0].startswith("rz-1-")


async def test_an_in_doubt_call_raises_tool_in_doubt_out_of_the_graph_by_default(tmp_path: Path) -> None:
    from ringzero import ProcessFailed

    RUNS.clear()
    program = pays("raise")
    await crash_inside(tmp_path / "k.db", "notify", program)
    with pytest.raises(ProcessFailed, match="ToolInDoubt: pid 1: tool 'notify'"):
        await resumed(tmp_path / "k.db", program)
    assert RUNS.count("notify paid") == 1


async def test_an_in_doubt_call_is_reported_to_the_model_with_in_doubt_report_and_the_graph_finishes(
        tmp_path: Path) -> None:
    RUNS.clear()
    program = pays("report")
    await crash_inside(tmp_path / "k.db", "notify", program)
    got = await resumed(tmp_path / "k.db", program)
    assert RUNS.count("notify paid") == 1 and RUNS.count("charge 5") == 1, RUNS
    assert got[0].startswith("charge:success:charged 5")
    assert got[1].startswith("notify:error:Error: the outcome of this notify call is unknown"), got


async def test_in_doubt_takes_raise_or_report_only() -> None:
    from ringzero.core.contract.errors import InvalidArgument

    with pytest.raises(InvalidArgument, match="in_doubt must be one of 'raise', 'report', not 'ignore'"):
        KernelToolNode([add], in_doubt="ignore")
