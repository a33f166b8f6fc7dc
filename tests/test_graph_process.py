"""A LangGraph graph run as a kernel process: its model and tool calls are syscalls."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from ringzero import Kernel
from ringzero.checkpointers import SqliteCheckpointer
from ringzero.core.types import LLMRequest
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
