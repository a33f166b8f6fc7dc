"""``CrewLLMProvider``: a real CrewAI LLM (``crewai.LLM``, its native OpenAI provider and the
openai SDK) serving kernel programs, against a local server that speaks OpenAI's wire format."""

from __future__ import annotations

from typing import Any

import pytest
from crewai import LLM

from ringzero import Context, Kernel
from ringzero.adapters.crewai import CrewLLMProvider
from ringzero.checkpointers import MemoryCheckpointer
from ringzero.compat.vendor_servers import openai_answer, openai_error, vendor_server
from ringzero.core.contract.errors import BadRequest, InvalidArgument, RateLimited
from ringzero.core.contract.types import LLMRequest, Message, ToolCall
from ringzero.core.support.gate import LLMGate, RetryPolicy
from tests.test_llm_providers import WEATHER


def crew_llm(url: str, **options: Any) -> LLM:
    return LLM(model="openai/gpt-test", base_url=url, api_key="sk-test", max_retries=0, **options)


async def asks_the_weather(ctx: Context) -> dict[str, Any]:
    """A tool-calling loop written the natural way: the model asks for a tool, gets its result."""
    messages: list[Any] = [{"role": "user", "content": "Weather in Paris?"}]
    first = await ctx.llm(messages, tools=[WEATHER])
    messages += [first.message, *[{"role": "tool", "tool_call_id": c.id, "content": "sunny", "name": c.name}
                                  for c in first.tool_calls]]
    final = await ctx.llm(messages, tools=[WEATHER])
    return {"calls": [c.arguments for c in first.tool_calls], "answer": final.content,
            "tokens": ctx.spent.tokens}


async def test_a_crewai_llm_serves_a_kernel_program_with_tool_calls_both_ways_and_its_usage() -> None:
    script = [openai_answer(None, [("call_1", "weather", {"city": "Paris"})], usage=(20, 4)),
              openai_answer("It is sunny in Paris.", usage=(30, 6))]
    with vendor_server("openai", script) as server:
        provider = CrewLLMProvider(crew_llm(server.url))
        async with Kernel(llm=provider, checkpointer=MemoryCheckpointer()) as kernel:
            result = await (await kernel.spawn(asks_the_weather)).wait()
            usage = kernel.gate().total_usage
    assert result == {"calls": [{"city": "Paris"}], "answer": "It is sunny in Paris.", "tokens": 60}
    assert (usage.input_tokens, usage.output_tokens) == (50, 10)
    first, second = server.requests
    assert first.body["tools"][0]["function"]["name"] == "weather"
    assert second.body["messages"][1]["tool_calls"][0]["id"] == "call_1"  # the call went back as OpenAI's form
    assert second.body["messages"][2] == {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}


async def test_a_crewai_llm_s_failures_are_the_kernel_s_typed_errors() -> None:
    """CrewAI retries a 429 itself (three tries); what it gives up on reaches the gate as
    RateLimited with the server's Retry-After, and a refusal as BadRequest."""
    limited = openai_error(429, "slow down", "rate_limit_error", headers={"retry-after": "0.01"})
    script = [limited, openai_answer("pong"), openai_error(400, "bad tool schema", "invalid_request_error"),
              limited, limited, limited]
    ask = LLMRequest(messages=(Message("user", "ping"),))
    with vendor_server("openai", script) as server:
        gate = LLMGate(CrewLLMProvider(crew_llm(server.url)), retry=RetryPolicy(max_retries=0))
        assert (await gate.complete(ask)).content == "pong"
        assert len(server.requests) == 2, "CrewAI's own retry of the 429"
        with pytest.raises(BadRequest, match="bad tool schema"):
            await gate.complete(ask)
        with pytest.raises(RateLimited) as refused:
            await gate.complete(ask)
        await gate.aclose()
    assert refused.value.retry_after == 0.01 and len(server.requests) == 6


async def test_a_custom_base_llm_with_only_a_sync_call_works_and_a_non_llm_is_refused() -> None:
    from crewai.llms.base_llm import BaseLLM

    class Echo(BaseLLM):
        def call(self, messages: Any, tools: Any = None, callbacks: Any = None, available_functions: Any = None,
                 from_task: Any = None, from_agent: Any = None, response_model: Any = None) -> Any:
            if tools:
                return [{"id": "t1", "name": tools[0]["function"]["name"], "input": {"city": "Oslo"}}]
            return f"echo: {messages[-1]['content']}"

    provider = CrewLLMProvider(Echo(model="echo-1"))
    answer = await provider.complete(LLMRequest(messages=(Message("user", "hi"),)))
    assert answer.content == "echo: hi" and answer.model == "echo-1"
    asked = await provider.complete(LLMRequest(messages=(Message("user", "hi"),), tools=(WEATHER,)))
    assert asked.tool_calls == (ToolCall("t1", "weather", {"city": "Oslo"}),) and asked.stop_reason == "tool_use"
    with pytest.raises(InvalidArgument, match="takes a CrewAI LLM"):
        CrewLLMProvider("gpt-4o")  # type: ignore[arg-type]


async def test_a_crewai_llm_streams_its_text_through_the_gate_before_the_answer_ends() -> None:
    from ringzero.compat.vendor_servers import openai_stream
    from ringzero.core.support.gate import LLMGate

    stream = openai_stream(["It is ", "sunny."], hold_after=2)
    got: list[str] = []

    def on_text(piece: str) -> None:
        got.append(piece)
        stream.release.set()  # the server goes on only once the first piece reached us

    with vendor_server("openai", [stream]) as server:
        gate = LLMGate(CrewLLMProvider(crew_llm(server.url)))
        response = await gate.complete(LLMRequest(messages=(Message("user", "Weather?"),)), on_text=on_text)
        await gate.aclose()
    assert not stream.waited_out and got == ["It is ", "sunny."]
    assert response.content == "It is sunny." and (response.usage.input_tokens, response.usage.output_tokens) == (12, 5)
