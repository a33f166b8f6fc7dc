"""OpenAIProvider and AnthropicProvider against local servers that speak each vendor's wire format."""

from __future__ import annotations

import socket
from collections.abc import Callable
from typing import Any

import pytest

from ringzero import Context, Kernel, LLMGate
from ringzero.checkpointers import MemoryCheckpointer
from ringzero.compat.llm_wire import vendor_error
from ringzero.compat.vendor_servers import (
    Reply,
    anthropic_answer,
    anthropic_error,
    openai_answer,
    openai_error,
    vendor_server,
)
from ringzero.core.contract.errors import (
    AuthenticationFailed,
    BadRequest,
    ContextTooLong,
    InvalidArgument,
    ProviderError,
    ProviderUnavailable,
    RateLimited,
)
from ringzero.core.contract.protocols import LLMProvider
from ringzero.core.contract.types import LLMRequest, Message, ToolCall, ToolSchema
from ringzero.core.support.gate import RetryPolicy
from ringzero.providers.llm import AnthropicProvider, OpenAIProvider

VENDORS = ["openai", "anthropic"]
WEATHER = ToolSchema("weather", "The weather of a city", {"type": "object", "properties": {"city": {"type": "string"}},
                                                          "required": ["city"]})


def provider_for(vendor: str, url: str, **options: Any) -> LLMProvider:
    if vendor == "openai":
        return OpenAIProvider("gpt-test", base_url=url, api_key="sk-test", **options)
    return AnthropicProvider("claude-test", base_url=url, api_key="ant-test", **options)


def answer(vendor: str, text: str = "", calls: list[tuple[str, str, dict[str, Any]]] = ()) -> Reply:  # type: ignore[assignment]
    return openai_answer(text or None, calls) if vendor == "openai" else anthropic_answer(text, calls)


@pytest.mark.parametrize("vendor", VENDORS)
async def test_a_plain_answer_carries_text_usage_stop_reason_and_model(vendor: str) -> None:
    with vendor_server(vendor, [answer(vendor, "Paris.")]) as server:
        provider = provider_for(vendor, server.url)
        response = await provider.complete(LLMRequest(
            messages=(Message("system", "Answer in one word."), Message("user", "Capital of France?")),
            max_tokens=50, temperature=0.2, stop=("END",)))
        await provider.aclose()  # type: ignore[attr-defined]
    assert response.content == "Paris." and response.tool_calls == ()
    assert (response.usage.input_tokens, response.usage.output_tokens) == (12, 5)
    assert response.stop_reason == "end_turn"
    [seen] = server.requests
    if vendor == "openai":
        assert seen.headers["authorization"] == "Bearer sk-test"
        assert seen.body["messages"][0] == {"role": "system", "content": "Answer in one word."}
        assert (seen.body["max_tokens"], seen.body["temperature"], seen.body["stop"]) == (50, 0.2, ["END"])
        assert response.model == "gpt-test"
    else:
        assert seen.headers["x-api-key"] == "ant-test" and seen.headers["anthropic-version"] == "2023-06-01"
        assert seen.body["system"] == "Answer in one word."
        assert seen.body["messages"] == [{"role": "user", "content": [{"type": "text", "text": "Capital of France?"}]}]
        assert (seen.body["max_tokens"], seen.body["stop_sequences"]) == (50, ["END"])
        assert response.model == "claude-test"


@pytest.mark.parametrize("vendor", VENDORS)
async def test_tool_calls_cross_both_ways(vendor: str) -> None:
    script = [answer(vendor, "", [("call_1", "weather", {"city": "Paris"}), ("call_2", "weather", {"city": "Oslo"})]),
              answer(vendor, "Paris is sunny, Oslo is cold.")]
    with vendor_server(vendor, script) as server:
        provider = provider_for(vendor, server.url)
        question = Message("user", "Weather in Paris and Oslo?")
        first = await provider.complete(LLMRequest(messages=(question,), tools=(WEATHER,)))
        assert first.stop_reason == "tool_use"
        assert first.tool_calls == (ToolCall("call_1", "weather", {"city": "Paris"}),
                                    ToolCall("call_2", "weather", {"city": "Oslo"}))
        results = (Message("tool", "sunny", tool_call_id="call_1", name="weather"),
                   Message("tool", "cold", tool_call_id="call_2", name="weather"))
        # the server refuses (400) any tool result that does not answer a call of the turn before
        second = await provider.complete(LLMRequest(messages=(question, first.message, *results), tools=(WEATHER,)))
        await provider.aclose()  # type: ignore[attr-defined]
    assert second.content == "Paris is sunny, Oslo is cold."
    sent = server.requests[1].body
    if vendor == "openai":
        assert sent["tools"][0] == {"type": "function", "function": WEATHER.to_dict()}
        assert sent["messages"][1]["tool_calls"][0]["function"] == {"name": "weather", "arguments": '{"city": "Paris"}'}
        assert [m["tool_call_id"] for m in sent["messages"][2:]] == ["call_1", "call_2"]
    else:
        assert sent["tools"][0] == {"name": "weather", "description": WEATHER.description,
                                    "input_schema": WEATHER.parameters}
        assert [m["role"] for m in sent["messages"]] == ["user", "assistant", "user"]  # both results in one turn
        assert [b["tool_use_id"] for b in sent["messages"][2]["content"]] == ["call_1", "call_2"]


async def test_anthropic_thinking_blocks_are_kept_and_sent_back_with_their_turn() -> None:
    thinking = [{"type": "thinking", "thinking": "Paris first.", "signature": "sig-abc"},
                {"type": "redacted_thinking", "data": "opaque=="}]
    script = [anthropic_answer("Let me look.", [("toolu_1", "weather", {"city": "Paris"})], thinking=thinking),
              anthropic_answer("Sunny.")]
    with vendor_server("anthropic", script) as server:
        provider = AnthropicProvider("claude-test", base_url=server.url, api_key="ant-test")
        question = Message("user", "Weather in Paris?")
        first = await provider.complete(LLMRequest(messages=(question,), tools=(WEATHER,)))
        assert first.content == "Let me look."
        assert first.tool_calls == (ToolCall("toolu_1", "weather", {"city": "Paris"}),)
        kept = Message.from_dict(first.message.to_dict())  # as the journal stores and replays it
        result = Message("tool", "sunny", tool_call_id="toolu_1", name="weather")
        await provider.complete(LLMRequest(messages=(question, kept, result), tools=(WEATHER,)))
        await provider.aclose()
    assistant_turn = server.requests[1].body["messages"][1]
    assert assistant_turn["role"] == "assistant"
    assert assistant_turn["content"] == [*thinking, {"type": "text", "text": "Let me look."},
                                         {"type": "tool_use", "id": "toolu_1", "name": "weather",
                                          "input": {"city": "Paris"}}]


def rate_limit(vendor: str, headers: dict[str, str]) -> Reply:
    return vendor_error(vendor, "rate_limited", headers)  # type: ignore[arg-type]


ERRORS: dict[str, tuple[Callable[[], Reply], Callable[[], Reply], type[ProviderError]]] = {
    "context overflow": (lambda: vendor_error("openai", "context_overflow"),
                         lambda: vendor_error("anthropic", "context_overflow"), ContextTooLong),
    "bad credentials": (lambda: vendor_error("openai", "auth_failed"),
                        lambda: vendor_error("anthropic", "auth_failed"), AuthenticationFailed),
    "not permitted": (lambda: vendor_error("openai", "forbidden"),
                      lambda: vendor_error("anthropic", "forbidden"), AuthenticationFailed),
    "server overloaded": (lambda: vendor_error("openai", "server_error"),
                          lambda: vendor_error("anthropic", "server_error"), ProviderUnavailable),
    "malformed request": (
        lambda: openai_error(400, "Invalid type for 'temperature'", "invalid_request_error", "invalid_type"),
        lambda: anthropic_error(400, "invalid_request_error", "temperature: Input should be less than or equal to 1"),
        BadRequest),
}


@pytest.mark.parametrize("vendor", VENDORS)
@pytest.mark.parametrize("case", list(ERRORS))
async def test_vendor_errors_become_the_kernels_typed_errors(vendor: str, case: str) -> None:
    openai_reply, anthropic_reply, expected = ERRORS[case]
    with vendor_server(vendor, [openai_reply() if vendor == "openai" else anthropic_reply()]) as server:
        provider = provider_for(vendor, server.url)
        with pytest.raises(expected) as caught:
            await provider.complete(LLMRequest(messages=(Message("user", "hi"),)))
        await provider.aclose()  # type: ignore[attr-defined]
    assert type(caught.value) is expected
    assert "HTTP" in str(caught.value)  # the message says what the vendor answered


@pytest.mark.parametrize("vendor", VENDORS)
@pytest.mark.parametrize(("headers", "seconds"), [({"retry-after": "1.5"}, 1.5), ({"retry-after-ms": "250"}, 0.25),
                                                  ({}, None)])
async def test_a_429_is_rate_limited_with_its_retry_after(vendor: str, headers: dict[str, str],
                                                           seconds: float | None) -> None:
    with vendor_server(vendor, [rate_limit(vendor, headers)]) as server:
        provider = provider_for(vendor, server.url)
        with pytest.raises(RateLimited) as caught:
            await provider.complete(LLMRequest(messages=(Message("user", "hi"),)))
        await provider.aclose()  # type: ignore[attr-defined]
    assert caught.value.retry_after == seconds


@pytest.mark.parametrize("vendor", VENDORS)
async def test_the_gate_waits_out_a_429_and_the_call_succeeds(vendor: str) -> None:
    with vendor_server(vendor, [rate_limit(vendor, {"retry-after": "0.2"}), answer(vendor, "done")]) as server:
        provider = provider_for(vendor, server.url)
        gate = LLMGate(provider, retry=RetryPolicy(max_retries=2, base_delay=0.01))
        response = await gate.complete(LLMRequest(messages=(Message("user", "hi"),)))
        await provider.aclose()  # type: ignore[attr-defined]
    assert response.content == "done" and len(server.requests) == 2


@pytest.mark.parametrize("vendor", VENDORS)
async def test_no_server_and_a_slow_server_are_provider_unavailable(vendor: str) -> None:
    with socket.socket() as probe:  # a port with nothing listening on it
        probe.bind(("127.0.0.1", 0))
        closed_port = probe.getsockname()[1]
    nobody = provider_for(vendor, f"http://127.0.0.1:{closed_port}")
    with pytest.raises(ProviderUnavailable, match="cannot reach"):
        await nobody.complete(LLMRequest(messages=(Message("user", "hi"),)))
    slow_reply = answer(vendor, "late")
    slow_reply.delay = 2.0
    with vendor_server(vendor, [slow_reply]) as server:
        slow = provider_for(vendor, server.url, timeout=0.3)
        with pytest.raises(ProviderUnavailable, match="did not answer in time"):
            await slow.complete(LLMRequest(messages=(Message("user", "hi"),)))
        await slow.aclose()  # type: ignore[attr-defined]


async def test_malformed_answers_are_errors_or_kept_for_the_model() -> None:
    not_json_arguments = openai_answer(None, [("c1", "weather", {})])
    not_json_arguments.body["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"] = '{"city": Par'
    script = [Reply(200, {"id": "x", "object": "chat.completion", "choices": []}), not_json_arguments]
    with vendor_server("openai", script) as server:
        provider = provider_for("openai", server.url)
        with pytest.raises(ProviderUnavailable, match="without a choice"):
            await provider.complete(LLMRequest(messages=(Message("user", "hi"),)))
        kept = await provider.complete(LLMRequest(messages=(Message("user", "hi"),)))
        await provider.aclose()  # type: ignore[attr-defined]
    assert kept.tool_calls[0].arguments == {"_unparsed_arguments": '{"city": Par'}


def test_a_provider_without_what_it_needs_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("OPENAI_API_KEY", "OPENAI_BASE_URL", "ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(InvalidArgument, match="needs a model name"):
        OpenAIProvider("")
    with pytest.raises(InvalidArgument, match="OPENAI_API_KEY"):
        OpenAIProvider("gpt-4o-mini")
    with pytest.raises(InvalidArgument, match="ANTHROPIC_API_KEY"):
        AnthropicProvider("claude-sonnet-4-5")
    local = OpenAIProvider("qwen2.5", base_url="http://127.0.0.1:11434/v1")  # a local server needs no key
    assert "Authorization" not in local.headers and local.max_tokens_field == "max_tokens"
    monkeypatch.setenv("OPENAI_API_KEY", "sk-env")
    official = OpenAIProvider("gpt-4o-mini")
    assert official.headers["Authorization"] == "Bearer sk-env"
    assert official.max_tokens_field == "max_completion_tokens"


@pytest.mark.parametrize("vendor", VENDORS)
async def test_a_kernel_program_calls_the_vendor_through_ctx_llm(vendor: str) -> None:
    script = [answer(vendor, "", [("call_1", "weather", {"city": "Paris"})]), answer(vendor, "It is sunny in Paris.")]

    async def program(ctx: Context) -> str:
        messages: list[Any] = [{"role": "user", "content": "Weather in Paris?"}]
        first = await ctx.llm(messages, tools=[WEATHER])
        call = first.tool_calls[0]
        result = await ctx.tool(lambda city: f"sunny in {city}", **call.arguments)
        messages += [first.message, Message("tool", str(result), tool_call_id=call.id, name=call.name)]
        return (await ctx.llm(messages, tools=[WEATHER])).content

    with vendor_server(vendor, script) as server:
        async with Kernel(checkpointer=MemoryCheckpointer(), llm=provider_for(vendor, server.url)) as kernel:
            process = await kernel.spawn(program)
            assert await process.wait() == "It is sunny in Paris."
            assert process.info().tokens == 34  # both calls' usage, as the server counted it
    assert len(server.requests) == 2
