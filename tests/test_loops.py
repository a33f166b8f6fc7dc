"""One loop per object, one bridge: sync and async callers from any thread or loop, no thread
left behind after close, and a named error (never a hang) where a call cannot reach its loop."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest
from langchain_core.messages import HumanMessage
from langgraph.graph import END, START, StateGraph
from typing_extensions import TypedDict

from ringzero import Kernel, LLMGate, RateLimit
from ringzero.adapters.langchain import KernelChatModel
from ringzero.adapters.langgraph import KernelMemoryStore, KernelSaver, code_tool, sandboxed
from ringzero.checkpointers import MemoryCheckpointer, SqliteCheckpointer
from ringzero.checkpointers.sqlite.thread import THREAD_NAME as SQLITE_THREAD_NAME
from ringzero.core.context import Context
from ringzero.core.contract.errors import Closed, WrongEventLoop
from ringzero.core.support.loops import LoopHome
from ringzero.core.support.tool_pool import TOOL_THREAD_NAME
from ringzero.testing import ScriptedProvider
from tests.tool_bodies import word_stats


def _ringzero_threads() -> list[str]:
    """The loop threads of ringzero's objects (not the threads of a tool pool, which run host
    tools and leave on their own once their executor is closed, nor a SQLite file's waiting
    thread, which is its checkpointer's)."""
    return sorted(t.name for t in threading.enumerate()
                  if t.name.startswith("ringzero") and t.name != TOOL_THREAD_NAME
                  and not t.name.startswith(SQLITE_THREAD_NAME))


class Count(TypedDict):
    n: int


def _counting_graph(saver: KernelSaver) -> object:
    builder = StateGraph(Count)
    builder.add_node("bump", lambda state: {"n": state["n"] + 1})
    builder.add_edge(START, "bump")
    builder.add_edge("bump", END)
    return builder.compile(checkpointer=saver)


async def test_invoke_from_a_thread_and_ainvoke_on_the_loop_share_one_gate_without_hanging() -> None:
    """The reported hang: a gate with one concurrency slot, a sync call from a worker thread and
    an async one on the event loop at once. Both run on the gate's one loop now."""
    provider = ScriptedProvider(lambda request: "ok", latency=0.05)
    gate = LLMGate(provider, RateLimit(max_concurrency=1))
    model = KernelChatModel(gate)
    for _ in range(3):
        replies = await asyncio.gather(
            *(asyncio.to_thread(model.invoke, [HumanMessage(f"sync {i}")]) for i in range(4)),
            *(model.ainvoke([HumanMessage(f"async {i}")]) for i in range(4)),
        )
        assert [r.content for r in replies] == ["ok"] * 8
    assert provider.calls == 24 and gate.stats.calls == 24
    await gate.aclose()


async def test_invoke_first_then_ainvoke_from_another_loop_is_forwarded_to_the_gates_loop() -> None:
    before = _ringzero_threads()  # what earlier tests left open is theirs
    model = KernelChatModel(ScriptedProvider(lambda request: "ok", latency=0.01))
    assert (await asyncio.to_thread(model.invoke, [HumanMessage("a")])).content == "ok"  # private loop
    assert model.gate is not None and model.gate.home.owns_loop
    replies = await asyncio.gather(*(model.ainvoke([HumanMessage(str(i))]) for i in range(5)))
    assert [r.content for r in replies] == ["ok"] * 5
    await model.aclose()
    assert _ringzero_threads() == before
    with pytest.raises(Closed, match="closed"):
        await model.ainvoke([HumanMessage("after close")])


async def test_a_blocking_call_on_the_loop_the_object_lives_on_is_refused_by_name() -> None:
    saver = KernelSaver(MemoryCheckpointer())
    config = {"configurable": {"thread_id": "t", "checkpoint_ns": ""}}
    assert await saver.aget_tuple(config) is None  # this loop is now the saver's home
    with pytest.raises(WrongEventLoop, match="KernelSaver sync method was called synchronously on the event loop"):
        saver.get_tuple(config)
    await saver.aclose()


async def test_a_kernel_used_from_a_second_loop_says_so() -> None:
    async def hello(ctx: Context) -> str:
        return "hi"

    kernel = Kernel(checkpointer=MemoryCheckpointer())
    await kernel.start()

    def on_another_loop() -> None:
        asyncio.run(kernel.spawn(hello))

    with pytest.raises(WrongEventLoop, match="this kernel runs on the event loop it was started on"):
        await asyncio.to_thread(on_another_loop)
    assert await (await kernel.spawn(hello)).wait() == "hi"
    await kernel.aclose()


def test_a_busy_object_whose_loop_stopped_refuses_instead_of_hanging() -> None:
    busy = True
    home = LoopHome("the test's object", lambda: not busy)
    loop = asyncio.new_event_loop()
    try:
        loop.run_until_complete(home.run(asyncio.sleep(0)))  # home is `loop`, now not running

        async def use() -> None:
            await home.run(asyncio.sleep(0))

        with pytest.raises(WrongEventLoop, match="busy on an event loop that is no longer running"):
            asyncio.run(use())
        busy = False  # idle, it moves to the loop that uses it next
        asyncio.run(use())
    finally:
        loop.close()


def test_twenty_savers_used_synchronously_leave_no_thread_after_close(tmp_path: Path) -> None:
    before = _ringzero_threads()
    savers = [KernelSaver(SqliteCheckpointer(tmp_path / f"{i}.db")) for i in range(20)]
    for saver in savers:
        graph = _counting_graph(saver)
        assert graph.invoke({"n": 1}, {"configurable": {"thread_id": "t"}}) == {"n": 2}  # type: ignore[attr-defined]
    assert set(_ringzero_threads()) - set(before) <= {"ringzero-runtime"}, "the savers started threads of their own"
    assert _ringzero_threads().count("ringzero-runtime") == 1, "twenty savers used from sync code share one loop"
    for saver in savers:
        saver.home.run_sync(saver.checkpointer.aclose(), "closing")  # the checkpointers are the caller's to close
        saver.close()
    assert _ringzero_threads() == before
    with pytest.raises(Closed, match="KernelSaver is closed"):
        savers[0].get_tuple({"configurable": {"thread_id": "t", "checkpoint_ns": ""}})


def test_from_conn_string_opens_and_closes_its_own_checkpointer(tmp_path: Path) -> None:
    before = _ringzero_threads()
    path = tmp_path / "graph.db"
    with KernelSaver.from_conn_string(str(path)) as saver:
        assert isinstance(saver.checkpointer, SqliteCheckpointer)
        _counting_graph(saver).invoke({"n": 1}, {"configurable": {"thread_id": "t"}})  # type: ignore[attr-defined]
    assert _ringzero_threads() == before
    assert not saver.checkpointer.is_open  # type: ignore[attr-defined]  # its connection is closed
    with KernelSaver.from_conn_string(str(path)) as again:  # what was written is there
        state = again.get_tuple({"configurable": {"thread_id": "t", "checkpoint_ns": ""}})
        assert state is not None and state.checkpoint["channel_values"]["n"] == 2


async def test_from_conn_string_as_an_async_context_manager() -> None:
    async with KernelSaver.from_conn_string(":memory:") as saver:
        assert isinstance(saver.checkpointer, MemoryCheckpointer)
        result = await _counting_graph(saver).ainvoke({"n": 5}, {"configurable": {"thread_id": "t"}})  # type: ignore[attr-defined]
        assert result == {"n": 6}
    with pytest.raises(Closed):
        await saver.aget_tuple({"configurable": {"thread_id": "t", "checkpoint_ns": ""}})


def test_memory_store_chat_model_and_tools_close_their_threads() -> None:
    before = _ringzero_threads()
    store = KernelMemoryStore(MemoryCheckpointer())
    store.put(("users", "alice"), "likes", {"food": "pears"})
    assert store.get(("users", "alice"), "likes") is not None
    model = KernelChatModel(ScriptedProvider(["hi"]))
    assert model.invoke([HumanMessage("hello")]).content == "hi"
    tool = sandboxed(word_stats)
    assert tool.invoke({"text": "a b"})["words"] == 2
    runner = code_tool([word_stats])
    assert "2" in runner.invoke({"code": "word_stats('a b')['words']"})
    assert set(_ringzero_threads()) - set(before) <= {"ringzero-runtime"}, "one of them started a thread of its own"
    assert _ringzero_threads().count("ringzero-runtime") == 1, "the four share the runtime loop"
    for thing in (store, model, tool, runner):
        thing.close()
    assert _ringzero_threads() == before
    with pytest.raises(Closed):
        store.get(("users", "alice"), "likes")
