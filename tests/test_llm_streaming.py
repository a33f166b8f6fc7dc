"""Streaming: the OpenAI-compatible and Anthropic providers hand over text as it arrives, through
the gate, ``ctx.llm(on_text=...)`` and ``KernelChatModel``; the journal keeps the whole answer."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from ringzero import Context, Kernel, LLMGate
from ringzero.checkpointers import SqliteCheckpointer
from ringzero.compat.vendor_servers import Stream, anthropic_error, anthropic_stream, openai_stream, vendor_server
from ringzero.core.contract.errors import ProviderUnavailable
from ringzero.core.contract.types import LLMRequest, Message, ToolCall
from ringzero.core.support.gate import RetryPolicy
from tests.test_llm_providers import WEATHER, provider_for

VENDORS = ["openai", "anthropic"]
ASK = LLMRequest(messages=(Message("user", "Weather in Paris?"),), max_tokens=50)


def streamed(vendor: str, pieces: list[str], calls: list[tuple[str, str, dict[str, Any]]] = (),  # type: ignore[assignment]
             **options: Any) -> Stream:
    return (openai_stream if vendor == "openai" else anthropic_stream)(pieces, calls, **options)


def first_text_event(vendor: str) -> int:
    """Where the server stops to wait: after the first piece of text (OpenAI sends a role chunk
    first; Anthropic message_start, content_block_start and a ping)."""
    return 2 if vendor == "openai" else 4


@pytest.mark.parametrize("vendor", VENDORS)
async def test_text_arrives_before_the_answer_ends_and_the_whole_answer_is_returned(vendor: str) -> None:
    stream = streamed(vendor, ["It is ", "sunny ", "in Paris."], hold_after=first_text_event(vendor))
    got: list[str] = []

    def on_text(piece: str) -> None:
        got.append(piece)
        stream.release.set()  # the server goes on only once this text has reached us

    with vendor_server(vendor, [stream]) as server:
        provider = provider_for(vendor, server.url)
        assert provider.capabilities.streaming
        response = await provider.stream(ASK, on_text)  # type: ignore[attr-defined]
        await provider.aclose()  # type: ignore[attr-defined]
    assert not stream.waited_out, "the first piece of text did not reach the caller before the answer ended"
    assert got == ["It is ", "sunny ", "in Paris."]
    assert response.content == "It is sunny in Paris." and response.tool_calls == ()
    assert (response.usage.input_tokens, response.usage.output_tokens) == (12, 5)
    assert response.stop_reason == "end_turn"


@pytest.mark.parametrize("vendor", VENDORS)
async def test_a_streamed_tool_call_is_put_back_together(vendor: str) -> None:
    calls = [("call_1", "weather", {"city": "Paris"}), ("call_2", "weather", {"city": "Oslo"})]
    with vendor_server(vendor, [streamed(vendor, ["Let me look."], calls)]) as server:
        provider = provider_for(vendor, server.url)
        got: list[str] = []
        response = await provider.stream(  # type: ignore[attr-defined]
            LLMRequest(messages=ASK.messages, tools=(WEATHER,), max_tokens=50), got.append)
        await provider.aclose()  # type: ignore[attr-defined]
    assert got == ["Let me look."]
    assert response.tool_calls == (ToolCall("call_1", "weather", {"city": "Paris"}),
                                   ToolCall("call_2", "weather", {"city": "Oslo"}))
    assert response.stop_reason == "tool_use"


@pytest.mark.parametrize("vendor", VENDORS)
async def test_a_stream_that_breaks_is_provider_unavailable_and_the_gate_retries_it(vendor: str) -> None:
    broken = streamed(vendor, ["It is "], reset_after=first_text_event(vendor) + 1)
    overloaded = [anthropic_error(529, "overloaded_error", "Overloaded")] if vendor == "anthropic" else []
    whole = streamed(vendor, ["Sunny."])
    with vendor_server(vendor, [broken]) as server:
        provider = provider_for(vendor, server.url)
        with pytest.raises(ProviderUnavailable, match=r"broke|stopped"):
            await provider.stream(ASK, lambda piece: None)  # type: ignore[attr-defined]
        await provider.aclose()  # type: ignore[attr-defined]
    with vendor_server(vendor, [*overloaded, streamed(vendor, ["It is "], reset_after=4), whole]) as server:
        gate = LLMGate(provider_for(vendor, server.url), retry=RetryPolicy(base_delay=0.001))
        got: list[str] = []
        response = await gate.complete(ASK, on_text=got.append)
        await gate.aclose()
    assert response.content == "Sunny."
    assert got[-1] == "Sunny.", "the retried call's text reached the caller"
    assert gate.stats.retries == 1 + len(overloaded)


async def test_an_error_event_mid_stream_is_the_typed_error_of_its_kind() -> None:
    stream = anthropic_stream(["It is "])
    stream.events.insert(4, ("error", {"type": "error", "error": {"type": "overloaded_error",
                                                                  "message": "Overloaded"}}))
    with vendor_server("anthropic", [stream]) as server:
        provider = provider_for("anthropic", server.url)
        with pytest.raises(ProviderUnavailable, match="Overloaded"):
            await provider.stream(ASK, lambda piece: None)  # type: ignore[attr-defined]
        await provider.aclose()  # type: ignore[attr-defined]


async def streams_an_answer(ctx: Context, vendor: str) -> dict[str, Any]:
    """A program that shows the answer as it arrives (``on_text``) and returns what it showed."""
    shown: list[str] = []
    response = await ctx.llm("Weather in Paris?", on_text=shown.append, max_tokens=50)
    go = await ctx.recv()  # the host dies here, after the answer was recorded
    return {"shown": shown, "content": response.content, "go": go}


@pytest.mark.parametrize("vendor", VENDORS)
async def test_ctx_llm_streams_through_the_gate_and_a_resumed_program_gets_the_recorded_answer(
        vendor: str, tmp_path: Path) -> None:
    db = tmp_path / "k.db"
    with vendor_server(vendor, [streamed(vendor, ["It is ", "sunny."], usage=(30, 7))]) as server:
        first = Kernel(checkpointer=SqliteCheckpointer(db), llm=provider_for(vendor, server.url))
        p = await first.spawn(streams_an_answer, vendor)
        while "llm" not in [e.kind for e in await first.store.journal(p.pid)]:
            await asyncio.sleep(0.01)
        gate = first.gate("default")
        assert (gate.total_usage.input_tokens, gate.total_usage.output_tokens) == (30, 7), \
            "the gate did not count the streamed call's tokens"
        await first.aclose()  # the host goes away mid-sleep
    with vendor_server(vendor, []) as silent:  # a call that reached the vendor again would fail here
        async with Kernel(checkpointer=SqliteCheckpointer(db), llm=provider_for(vendor, silent.url)) as again:
            [handle] = await again.recover()
            await again.send(handle, "go")
            result = await asyncio.wait_for(handle.wait(), 10)
        assert silent.requests == []
    assert result == {"shown": [], "content": "It is sunny.", "go": "go"}, \
        "a replayed call shows nothing and returns the record"


def two_model_graph(model: Any) -> Any:
    """A graph of two model nodes in a row, both async."""
    from langgraph.graph import END, START, MessagesState, StateGraph

    async def first(state: MessagesState) -> dict[str, Any]:
        return {"messages": [await model.ainvoke(state["messages"])]}

    async def second(state: MessagesState) -> dict[str, Any]:
        return {"messages": [await model.ainvoke([*state["messages"], ("user", "Sure?")])]}

    graph = StateGraph(MessagesState)
    graph.add_node("first", first)
    graph.add_node("second", second)
    graph.add_edge(START, "first")
    graph.add_edge("first", "second")
    graph.add_edge("second", END)
    return graph.compile()


STREAMED: list[tuple[str, str]] = []


async def graph_streams_messages(ctx: Context, question: str) -> str:
    """A LangGraph graph run as a kernel process, its model's tokens read with stream_mode="messages"."""
    from ringzero.adapters.langchain import KernelChatModel

    final = ""
    async for chunk, meta in two_model_graph(KernelChatModel(max_tokens=50)).astream(
            {"messages": [("user", question)]}, stream_mode="messages"):
        if chunk.content:
            STREAMED.append((meta["langgraph_node"], str(chunk.content)))
            final = str(chunk.content)
    return final


@pytest.mark.parametrize("vendor", VENDORS)
async def test_stream_mode_messages_yields_tokens_and_a_resumed_graph_yields_the_recorded_message(
        vendor: str, tmp_path: Path) -> None:
    from ringzero.compat.vendor_servers import Reply

    db = tmp_path / "k.db"
    STREAMED.clear()
    hangs = Reply(500, {"error": {"message": "never sent", "type": "api_error"}}, delay=20)
    with vendor_server(vendor, [streamed(vendor, ["It is ", "sunny", "."]), hangs]) as server:
        first = Kernel(checkpointer=SqliteCheckpointer(db), llm=provider_for(vendor, server.url))
        await first.spawn(graph_streams_messages, "Weather?")
        while len(server.requests) < 2:  # the second node's call has begun: the host dies in it
            await asyncio.sleep(0.01)
        await first.aclose()
    assert STREAMED == [("first", "It is "), ("first", "sunny"), ("first", ".")]

    STREAMED.clear()
    with vendor_server(vendor, [streamed(vendor, ["Quite ", "sure."])]) as server:
        async with Kernel(checkpointer=SqliteCheckpointer(db), llm=provider_for(vendor, server.url)) as again:
            [handle] = await again.recover()
            assert await asyncio.wait_for(handle.wait(), 10) == "sure."
        assert len(server.requests) == 1, "the recorded model call reached the vendor again"
    assert STREAMED == [("first", "It is sunny."), ("second", "Quite "), ("second", "sure.")], \
        "the replayed call yields its recorded message whole; the live one streams"


@pytest.mark.parametrize("vendor", VENDORS)
async def test_kernel_chat_model_streams_outside_a_process_async_and_sync(vendor: str) -> None:
    from langgraph.graph import END, START, MessagesState, StateGraph

    from ringzero.adapters.langchain import KernelChatModel

    script = [streamed(vendor, ["One ", "two."]),
              streamed(vendor, ["Three ", "four."], [("c1", "weather", {"city": "Oslo"})]),
              streamed(vendor, ["Five ", "six."])]
    with vendor_server(vendor, script) as server:
        model = KernelChatModel(provider_for(vendor, server.url), max_tokens=50)
        chunks = [c async for c in model.astream("Count")]
        assert [c.content for c in chunks if c.content] == ["One ", "two."]
        tooled = model.bind_tools([{"type": "function", "function": WEATHER.to_dict()}])
        whole = None
        for chunk in await asyncio.to_thread(lambda: list(tooled.stream("Weather in Oslo?"))):
            whole = chunk if whole is None else whole + chunk
        assert whole is not None and whole.content == "Three four."
        assert whole.tool_calls == [{"name": "weather", "args": {"city": "Oslo"}, "id": "c1", "type": "tool_call"}]
        assert whole.usage_metadata == {"input_tokens": 12, "output_tokens": 5, "total_tokens": 17}

        def node(state: MessagesState) -> dict[str, Any]:  # a sync node: invoke streams through _stream
            return {"messages": [model.invoke(state["messages"])]}

        graph = StateGraph(MessagesState)
        graph.add_node("node", node)
        graph.add_edge(START, "node")
        graph.add_edge("node", END)
        parts = await asyncio.to_thread(lambda: [chunk.content for chunk, _ in graph.compile().stream(
            {"messages": [("user", "Go")]}, stream_mode="messages") if chunk.content])
        await model.aclose()
    assert parts == ["Five ", "six."]


async def test_a_langchain_chat_model_and_the_scripted_provider_stream_through_the_gate() -> None:
    """``ChatModelProvider`` streams through the chat model's own ``astream`` (LangChain's fake
    model streams word by word); the offline ``ScriptedProvider`` hands its text over a word at
    a time, so ``stream_mode="messages"`` shows tokens offline too."""
    from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
    from langchain_core.messages import AIMessage

    from ringzero.adapters.langchain import ChatModelProvider, KernelChatModel
    from ringzero.testing import ScriptedProvider

    chat = ChatModelProvider(GenericFakeChatModel(messages=iter([AIMessage("It is sunny today.")])))
    got: list[str] = []
    gate = LLMGate(chat)
    response = await gate.complete(ASK, on_text=got.append)
    await gate.aclose()
    assert len(got) > 1 and "".join(got) == response.content == "It is sunny today."

    model = KernelChatModel(ScriptedProvider(["Quite sure, yes.", "Indeed."]))
    parts = [chunk.content for chunk, _ in [
        item async for item in two_model_graph(model).astream({"messages": [("user", "Go")]}, stream_mode="messages")
    ] if chunk.content]
    await model.aclose()
    assert parts == ["Quite ", "sure, ", "yes.", "Indeed."], parts


async def test_a_streamed_anthropic_thinking_block_is_kept_whole_with_its_signature() -> None:
    """Thinking arrives in deltas, its signature last; the turn keeps the whole block (to send
    back with the tool result, as the API requires) and only the answer's text is streamed."""
    stream = anthropic_stream(["Sunny."], [("toolu_1", "weather", {"city": "Paris"})])
    thinking = [("content_block_start", {"type": "content_block_start", "index": 0,
                                         "content_block": {"type": "thinking", "thinking": "", "signature": ""}}),
                *[("content_block_delta", {"type": "content_block_delta", "index": 0,
                                           "delta": {"type": "thinking_delta", "thinking": part}})
                  for part in ("Paris? ", "Ask the tool.")],
                ("content_block_delta", {"type": "content_block_delta", "index": 0,
                                         "delta": {"type": "signature_delta", "signature": "sig-1"}}),
                ("content_block_stop", {"type": "content_block_stop", "index": 0})]
    for event in stream.events:  # the text and tool blocks move up one index
        data = event[1]
        if isinstance(data, dict) and "index" in data:
            data["index"] += 1
    stream.events[1:1] = thinking
    with vendor_server("anthropic", [stream]) as server:
        provider = provider_for("anthropic", server.url)
        got: list[str] = []
        response = await provider.stream(LLMRequest(messages=ASK.messages, tools=(WEATHER,), max_tokens=50),
                                         got.append)  # type: ignore[attr-defined]
        await provider.aclose()  # type: ignore[attr-defined]
    assert got == ["Sunny."] and response.content == "Sunny."
    assert response.tool_calls == (ToolCall("toolu_1", "weather", {"city": "Paris"}),)
    assert response.message.blocks[0] == {"type": "thinking", "thinking": "Paris? Ask the tool.", "signature": "sig-1"}
    assert [b["type"] for b in response.message.blocks] == ["thinking", "text", "tool_use"]
