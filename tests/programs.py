"""Programs the tests spawn. They live at module level so that recover() can import them again."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path
from typing import Any

from ringzero import Context, idempotent
from ringzero.core.contract.types import LLMRequest


def log_line(line: str) -> None:
    """Append to the file named by RINGZERO_TEST_LOG: the record of real (not replayed) calls."""
    with Path(os.environ["RINGZERO_TEST_LOG"]).open("a") as f:
        f.write(line + "\n")
        f.flush()
        os.fsync(f.fileno())


def logging_llm(request: LLMRequest) -> str:
    prompt = request.messages[-1].content
    log_line(f"llm {prompt}")
    return f"answer to {prompt}"


@idempotent  # a line in a log: a call in flight at a kill runs again when resumed
def record_tool(i: int) -> int:
    log_line(f"tool {i}")
    return i * i


async def durable_worker(ctx: Context, n: int) -> list[Any]:
    """n rounds of one LLM call and one tool call: what a crash must not repeat."""
    out: list[Any] = []
    for i in range(n):
        reply = await ctx.llm(f"step {i}")
        square = await ctx.tool("record", i)
        ctx.state["done"] = i + 1
        out.append([reply.content, square])
    return out


async def echo_twice(ctx: Context, text: str) -> str:
    first = await ctx.llm(text)
    second = await ctx.llm(first.content)
    return second.content


async def prompt_from_env(ctx: Context) -> str:
    """Asks whatever RINGZERO_TEST_PROMPT says: a program that changes between runs."""
    reply = await ctx.llm(os.environ.get("RINGZERO_TEST_PROMPT", "first"))
    return reply.content


async def prompted_then_the_host_died(db: Path, llm: Any) -> int:
    """``prompt_from_env`` run to its end on the SQLite store ``db``, its status row then set
    back to running, as if the host died before its end was written; its pid."""
    from ringzero import Kernel, ProcessStatus
    from ringzero.checkpointers import SqliteCheckpointer

    async with Kernel(checkpointer=SqliteCheckpointer(db), llm=llm) as kernel:
        handle = await kernel.spawn(prompt_from_env)
        await handle.wait()
        record = await kernel.store.load_process(handle.pid)
        assert record is not None
        record.status, record.stop_reason = ProcessStatus.RUNNING, None
        await kernel.store.save_process(record)
    return handle.pid


async def receiver(ctx: Context, count: int) -> list[Any]:
    return [await ctx.recv() for _ in range(count)]


def make_kernel(db: Path) -> Any:
    """What a user hands ``ringzero resume --kernel``: their kernel, configured."""
    from ringzero import Kernel
    from ringzero.checkpointers import SqliteCheckpointer
    from ringzero.testing import ScriptedProvider

    return Kernel(checkpointer=SqliteCheckpointer(db), llm=ScriptedProvider(logging_llm), tools={"record": record_tool})


async def child_naps(ctx: Context, n: int, seconds: float) -> int:
    await ctx.sleep(seconds)
    return n * 10


async def parent_waits_for_child(ctx: Context, n: int, child_seconds: float, after_seconds: float) -> int:
    child = await ctx.spawn(child_naps, n, child_seconds, name="child")
    value = int(await ctx.wait(child))  # type: ignore[arg-type]
    await ctx.sleep(after_seconds)
    return value + 1


GRAPH_TOOL_RUNS: list[str] = []


def react_graph(tools: list[Any], checkpointer: Any = None) -> Any:
    """A ReAct loop: the model (KernelChatModel, through the gate) and a KernelToolNode."""
    from langgraph.graph import END, START, MessagesState, StateGraph
    from langgraph.prebuilt import tools_condition

    from ringzero.adapters.langchain import KernelChatModel
    from ringzero.adapters.langgraph import KernelToolNode

    model = KernelChatModel().bind_tools(tools)

    async def agent(state: MessagesState) -> dict[str, Any]:
        return {"messages": [await model.ainvoke(state["messages"])]}

    graph = StateGraph(MessagesState)
    graph.add_node("agent", agent)
    graph.add_node("tools", KernelToolNode(tools, handle_tool_errors=True))  # errors go back to the model
    graph.add_edge(START, "agent")
    graph.add_conditional_edges("agent", tools_condition)
    graph.add_edge("tools", "agent")
    graph.add_edge("agent", END)
    return graph.compile(checkpointer=checkpointer)


async def graph_agent(ctx: Context, question: str) -> str:
    """A LangGraph ReAct loop run as a kernel process: model and tool calls are syscalls.

    Its durability is the kernel's journal (a resumed run replays the recorded calls), so the
    graph gets no persistent LangGraph checkpointer: one resuming from the middle of the graph
    while the program re-runs from the top would diverge from the journal (the kernel's model
    and tool node refuse such a graph: ``graph_agent_with_saver``).
    """
    from langchain_core.messages import HumanMessage
    from langchain_core.tools import tool

    @tool
    def lookup(city: str) -> str:
        """Look up the weather of a city (a host tool: it records every real run)."""
        GRAPH_TOOL_RUNS.append(city)
        if city == "Atlantis":
            raise KeyError("no such city")
        return f"sunny in {city}"

    result = await react_graph([lookup]).ainvoke({"messages": [HumanMessage(question)]})
    return str(result["messages"][-1].content)


async def graph_agent_with_saver(ctx: Context, question: str, saver: str, db: str) -> str:
    """``graph_agent`` compiled with a LangGraph checkpointer: ``"sqlite"`` (persistent: a
    KernelSaver over SQLite at ``db``) or ``"memory"`` (InMemorySaver, gone with the process)."""
    from langchain_core.messages import HumanMessage
    from langchain_core.tools import tool
    from langgraph.checkpoint.memory import InMemorySaver

    from ringzero.adapters.langgraph import KernelSaver
    from ringzero.checkpointers import SqliteCheckpointer

    @tool
    def lookup(city: str) -> str:
        """Look up the weather of a city (a host tool: it records every real run)."""
        GRAPH_TOOL_RUNS.append(city)
        return f"sunny in {city}"

    checkpointer = KernelSaver(SqliteCheckpointer(db)) if saver == "sqlite" else InMemorySaver()
    try:
        result = await react_graph([lookup], checkpointer).ainvoke(
            {"messages": [HumanMessage(question)]}, {"configurable": {"thread_id": f"pid-{ctx.pid}"}})
    finally:
        if isinstance(checkpointer, KernelSaver):
            await checkpointer.checkpointer.aclose()
    return str(result["messages"][-1].content)


PLAIN_NODE_RUNS: list[str] = []


def plain_graph(checkpointer: Any) -> Any:
    """One node of plain Python (no model, no tool): nothing but the saver can refuse it."""
    from langgraph.graph import END, START, MessagesState, StateGraph

    async def note(state: MessagesState) -> dict[str, Any]:
        PLAIN_NODE_RUNS.append(str(len(state["messages"])))
        return {"messages": [("ai", "noted")]}

    graph = StateGraph(MessagesState)
    graph.add_node("note", note)
    graph.add_edge(START, "note")
    graph.add_edge("note", END)
    return graph.compile(checkpointer=checkpointer)


async def plain_graph_run(ctx: Context, db: str, thread_id: str) -> int:
    """Run ``plain_graph`` on a KernelSaver over SQLite at ``db`` inside this process."""
    from ringzero.adapters.langgraph import KernelSaver
    from ringzero.checkpointers import SqliteCheckpointer

    store = SqliteCheckpointer(db)
    try:
        result = await plain_graph(KernelSaver(store)).ainvoke(
            {"messages": [("user", "hi")]}, {"configurable": {"thread_id": thread_id}})
    finally:
        await store.aclose()
    return len(result["messages"])


async def plain_graph_state(ctx: Context, db: str, thread_id: str, update: bool) -> int:
    """Read a thread a graph left in ``db`` (allowed in a process), then, with ``update``,
    change it (refused: replayed after a crash, the change would be made twice)."""
    from ringzero.adapters.langgraph import KernelSaver
    from ringzero.checkpointers import SqliteCheckpointer

    store = SqliteCheckpointer(db)
    try:
        graph = plain_graph(KernelSaver(store))
        config = {"configurable": {"thread_id": thread_id}}
        state = await graph.aget_state(config)
        history = [s async for s in graph.aget_state_history(config)]
        if update:
            await graph.aupdate_state(config, {"messages": [("user", "again")]})
    finally:
        await store.aclose()
    return len(state.values["messages"]) * 100 + len(history)


async def sandboxed_graph_agent(ctx: Context, question: str) -> str:
    """The ReAct loop with sandboxed tools: their bodies run in the kernel's executor."""
    from langchain_core.messages import HumanMessage

    from ringzero.adapters.langgraph import sandboxed
    from tests.tool_bodies import divide, read_file, word_stats

    tools = [sandboxed(read_file), sandboxed(word_stats), sandboxed(divide)]
    result = await react_graph(tools).ainvoke({"messages": [HumanMessage(question)]})
    return str(result["messages"][-1].content)


CONCURRENT_RUNS: list[int] = []


async def slow_then_fast(n: int) -> int:
    CONCURRENT_RUNS.append(n)
    await asyncio.sleep(0.05 if n == 1 else 0.0)  # the first call finishes last
    return n * 10


async def concurrent_syscalls(ctx: Context) -> list[Any]:
    results = await asyncio.gather(ctx.tool("slow_then_fast", 1), ctx.tool("slow_then_fast", 2))
    await ctx.sleep(0.2)  # a window for the test to stop the host in
    return list(results)


LOOKUP_SCHEMA = {"name": "lookup", "description": "Look up a record by number",
                 "parameters": {"type": "object", "properties": {"n": {"type": "integer"}}}}


def lookup_record(n: int) -> str:
    return f"record {n} is green"


async def long_chat(ctx: Context, turns: int, budget: int) -> dict[str, Any]:
    """A long conversation with tool calls, folded to stay under ``budget``; a fact is told at turn 20."""
    from ringzero.core.contract.types import Message

    conversation = ctx.conversation("You are a careful assistant.", budget=budget, keep_recent=budget // 2)
    for turn in range(turns):
        fact = "fact: the vault code is 4471. " if turn == 20 else ""
        reply = await conversation.ask(f"turn {turn}: {fact}" + "some filler words here " * 8, tools=[LOOKUP_SCHEMA])
        if reply.tool_calls:
            for call in reply.tool_calls:
                result = await ctx.tool(lookup_record, **call.arguments)
                conversation.add(Message("tool", str(result), tool_call_id=call.id, name=call.name))
            await conversation.ask()
    found = await ctx.memory.search("vault code", 3)
    return {"notes": conversation.notes, "found": [m.value for m in found],
            "last": [m.content for m in conversation.messages[-2:]]}


async def remember_in(ctx: Context, namespace: str, key: str, value: str) -> None:
    await ctx.memory.namespace(namespace).remember(key, value)


async def recall_from(ctx: Context, namespace: str, query: str) -> dict[str, Any]:
    shared = ctx.memory.namespace(namespace)
    return {"search": [m.key for m in await shared.search(query)], "own": await ctx.memory.search(query),
            "recall": await shared.recall("deadline")}


async def asks_inside_code(ctx: Context) -> list[Any]:
    """Sandboxed code that asks the model twice (nested calls), then one ordinary model call."""

    async def ask_llm(prompt: str) -> str:
        return (await ctx.nested_llm(prompt)).content

    ran = await ctx.exec("[ask_llm('one two three'), ask_llm('four five')]", tools={"ask_llm": ask_llm})
    final = await ctx.llm("and finally")
    return [ran.value, final.content]


async def asks_then_dies(ctx: Context, calls: int) -> list[str]:
    """``calls`` LLM calls, then, in a host started with ``RINGZERO_TEST_DIE_AFTER_CALLS`` set,
    kill -9 of that host the moment the last call returns: nothing in between gives the event
    loop a turn, so the journal's records are in SQLite's append log only, not yet folded."""
    answers = [(await ctx.llm(f"question {i}")).content for i in range(calls)]
    if os.environ.get("RINGZERO_TEST_DIE_AFTER_CALLS"):
        os.kill(os.getpid(), signal.SIGKILL)
    return answers
