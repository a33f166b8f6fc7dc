"""A LangGraph graph run as a kernel process: its model and tool calls are syscalls."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from ringzero import Kernel
from ringzero.adapters.langgraph import KernelSaver
from ringzero.checkpointers import SqliteCheckpointer
from ringzero.core.contract.types import LLMRequest
from ringzero.testing import ScriptedProvider
from tests import programs
from tests.programs import graph_agent


def weather_script(request: LLMRequest) -> Any:
    last = request.messages[-1]
    if last.role == "user":  # ask for two cities at once, one of which fails
        return {"content": "", "tool_calls": [
            {"id": "a", "name": "lookup", "arguments": {"city": "Paris"}},
            {"id": "b", "name": "lookup", "arguments": {"city": "Atlantis"}}]}
    results = sorted(m.content for m in request.messages if m.role == "tool")
    return "; ".join(results)


async def test_model_and_tool_calls_are_journaled_syscalls_with_parallel_calls_and_errors(tmp_path: Path) -> None:
    programs.GRAPH_TOOL_RUNS.clear()
    async with Kernel(checkpointer=SqliteCheckpointer(tmp_path / "k.db"), llm=ScriptedProvider(weather_script)) as k:
        p = await k.spawn(graph_agent, "weather?")
        answer = await p.wait()
        kinds = [e.kind for e in await k.store.journal(p.pid)]
    # ToolNode's own error message, since handle_tool_errors=True (tests/programs.py)
    assert answer == "Error: KeyError('no such city')\n Please fix your mistakes.; sunny in Paris"
    assert sorted(programs.GRAPH_TOOL_RUNS) == ["Atlantis", "Paris"]
    assert kinds.count("llm") == 2 and kinds.count("tool") == 2


async def test_a_graph_interrupted_by_shutdown_resumes_without_repeating_recorded_calls(tmp_path: Path) -> None:
    programs.GRAPH_TOOL_RUNS.clear()
    kernel_db = tmp_path / "k.db"
    async def hangs_once_tools_ran(request: LLMRequest) -> Any:
        if any(m.role == "tool" for m in request.messages):
            await asyncio.sleep(30)  # the model call after the tools hangs: the host "dies" here
        return weather_script(request)

    hanging = ScriptedProvider(hangs_once_tools_ran)
    first = Kernel(checkpointer=SqliteCheckpointer(kernel_db), llm=hanging)
    p = await first.spawn(graph_agent, "weather?")
    while hanging.calls < 2:  # both tool calls have run and the second model call has begun
        await asyncio.sleep(0.005)
    assert sorted(programs.GRAPH_TOOL_RUNS) == ["Atlantis", "Paris"]
    await first.aclose()

    async with Kernel(checkpointer=SqliteCheckpointer(kernel_db), llm=ScriptedProvider(weather_script)) as again:
        [handle] = await again.recover()
        assert handle.pid == p.pid
        answer = await asyncio.wait_for(handle.wait(), 10)
    assert answer.endswith("sunny in Paris")
    assert sorted(programs.GRAPH_TOOL_RUNS) == ["Atlantis", "Paris"], "a recorded tool call ran again"


async def test_a_graph_with_a_persistent_checkpointer_is_refused_before_its_first_call(tmp_path: Path) -> None:
    from ringzero import InvalidArgument, ProcessFailed

    def one_city(request: LLMRequest) -> Any:
        if request.messages[-1].role == "user":
            return {"content": "", "tool_calls": [{"id": "a", "name": "lookup", "arguments": {"city": "Oslo"}}]}
        return request.messages[-1].content

    graph_db = tmp_path / "graph.db"
    programs.GRAPH_TOOL_RUNS.clear()
    async with Kernel(checkpointer=SqliteCheckpointer(tmp_path / "k.db"), llm=ScriptedProvider(one_city)) as k:
        refused = await k.spawn(programs.graph_agent_with_saver, "weather?", "sqlite", str(graph_db))
        try:
            await refused.wait()
            raise AssertionError("the graph ran")
        except ProcessFailed as exc:
            assert exc.error is not None and exc.error["type"] == InvalidArgument.__name__
            assert "persistent checkpointer (KernelSaver)" in exc.error["message"]
        assert programs.GRAPH_TOOL_RUNS == [] and await k.store.journal(refused.pid) == []
        # InMemorySaver dies with the process, so it cannot disagree with the journal: allowed.
        allowed = await k.spawn(programs.graph_agent_with_saver, "weather?", "memory", "")
        assert await allowed.wait() == "sunny in Oslo"


async def test_a_graph_of_plain_nodes_on_a_persistent_kernel_saver_is_refused_before_its_first_node(
        tmp_path: Path) -> None:
    """No model or tool call to refuse it at: the saver refuses the graph's first read of its
    thread, so no node runs (on every Python; on 3.10 the model cannot see the graph at all)."""
    from ringzero import InvalidArgument, ProcessFailed
    from ringzero.checkpointers import MemoryCheckpointer

    graph_db = str(tmp_path / "graph.db")
    programs.PLAIN_NODE_RUNS.clear()
    async with Kernel(checkpointer=MemoryCheckpointer()) as k:
        refused = await k.spawn(programs.plain_graph_run, graph_db, "t")
        with pytest.raises(ProcessFailed) as failed:
            await refused.wait()
    assert failed.value.error is not None and failed.value.error["type"] == InvalidArgument.__name__
    assert f"running inside kernel process pid {refused.pid}" in failed.value.error["message"]
    assert "persistent checkpointer (KernelSaver)" in failed.value.error["message"]
    assert programs.PLAIN_NODE_RUNS == []
    # Outside a process the same graph runs, and writes its thread.
    store = SqliteCheckpointer(graph_db)
    try:
        result = await programs.plain_graph(KernelSaver(store)).ainvoke(
            {"messages": [("user", "hi")]}, {"configurable": {"thread_id": "t"}})
    finally:
        await store.aclose()
    assert [m.content for m in result["messages"]] == ["hi", "noted"] and programs.PLAIN_NODE_RUNS == ["1"]


async def test_a_process_reads_a_graphs_thread_from_a_persistent_kernel_saver_but_does_not_change_it(
        tmp_path: Path) -> None:
    from ringzero import InvalidArgument, ProcessFailed
    from ringzero.checkpointers import MemoryCheckpointer

    graph_db = str(tmp_path / "graph.db")
    store = SqliteCheckpointer(graph_db)
    try:
        await programs.plain_graph(KernelSaver(store)).ainvoke(
            {"messages": [("user", "hi")]}, {"configurable": {"thread_id": "t"}})
    finally:
        await store.aclose()
    async with Kernel(checkpointer=MemoryCheckpointer()) as k:
        reader = await k.spawn(programs.plain_graph_state, graph_db, "t", False)
        assert await reader.wait() == 2 * 100 + 3  # two messages; input, start and node checkpoints
        updater = await k.spawn(programs.plain_graph_state, graph_db, "t", True)
        with pytest.raises(ProcessFailed) as failed:
            await updater.wait()
    assert failed.value.error is not None and failed.value.error["type"] == InvalidArgument.__name__
    store = SqliteCheckpointer(graph_db)
    try:
        state = await programs.plain_graph(KernelSaver(store)).aget_state({"configurable": {"thread_id": "t"}})
    finally:
        await store.aclose()
    assert [m.content for m in state.values["messages"]] == ["hi", "noted"]  # not changed


async def plain_graph(ctx: Any, question: str) -> str:
    """A graph built the way LangGraph's docs build one: its own chat model, a plain ToolNode."""
    from langchain_core.language_models.fake_chat_models import FakeMessagesListChatModel
    from langchain_core.messages import AIMessage, HumanMessage
    from langchain_core.tools import tool
    from langgraph.graph import END, START, MessagesState, StateGraph
    from langgraph.prebuilt import ToolNode

    @tool
    def shout(text: str) -> str:
        """Say it loudly."""
        return text.upper()

    model = FakeMessagesListChatModel(responses=[
        AIMessage("", tool_calls=[{"id": "1", "name": "shout", "args": {"text": question}}]), AIMessage("done")])

    async def agent(state: MessagesState) -> dict[str, Any]:
        return {"messages": [await model.ainvoke(state["messages"])]}

    graph = StateGraph(MessagesState)
    graph.add_node("agent", agent)
    graph.add_node("tools", ToolNode([shout]))
    graph.add_edge(START, "agent")
    graph.add_conditional_edges("agent", lambda s: "tools" if s["messages"][-1].tool_calls else END)
    graph.add_edge("tools", "agent")
    for _ in range(2):  # twice: each warning comes once
        model.i = 0
        out = await graph.compile().ainvoke({"messages": [HumanMessage(question)]})
    return str(out["messages"][-2].content)


async def test_a_model_and_a_tool_the_kernel_cannot_see_are_named_once_with_the_drop_in(tmp_path: Path) -> None:
    from ringzero.adapters._unseen import UnjournaledCallWarning

    async with Kernel(checkpointer=SqliteCheckpointer(tmp_path / "k.db")) as kernel:
        with pytest.warns(UnjournaledCallWarning) as caught:
            p = await kernel.spawn(plain_graph, "hi")
            assert await p.wait() == "HI"
    texts = sorted(str(w.message) for w in caught if issubclass(w.category, UnjournaledCallWarning))
    assert len(texts) == 2, texts
    assert "the chat model FakeMessagesListChatModel ran inside kernel process pid 1" in texts[0]
    assert "KernelChatModel(ChatModelProvider(your_model))" in texts[0]
    assert "the tool 'shout' ran inside kernel process pid 1 outside the kernel's journal" in texts[1]
    assert "KernelToolNode(tools) in place of ToolNode" in texts[1]


async def test_the_kernel_s_drop_ins_draw_no_such_warning(tmp_path: Path) -> None:
    import warnings

    from ringzero.adapters._unseen import UnjournaledCallWarning

    async with Kernel(checkpointer=SqliteCheckpointer(tmp_path / "k.db"), llm=ScriptedProvider(weather_script)) as k:
        with warnings.catch_warnings():
            warnings.simplefilter("error", UnjournaledCallWarning)
            p = await k.spawn(graph_agent, "weather?")
            assert (await p.wait()).endswith("sunny in Paris")
