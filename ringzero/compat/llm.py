"""The LLMProvider conformance kit: what every provider must do, run against yours.

A provider's promises are about its backend's answers, so the kit asks for a backend that acts
out named scenarios. Subclass ``LLMProviderConformance`` and provide a ``provider_for`` fixture:
a function from a scenario name (``SCENARIOS``) to an async context manager that yields a
provider whose backend (your vendor's wire format on a local server, your SDK's test client)
answers every request as that scenario says::

    class TestMyProvider(LLMProviderConformance):
        @pytest.fixture
        def provider_for(self):
            @asynccontextmanager
            async def start(scenario):
                async with my_fake_vendor(scenario) as url:
                    yield MyProvider(base_url=url, timeout=0.5)
            return start

A provider that speaks OpenAI's or Anthropic's wire format can let the kit's own servers act
the scenarios out instead (``ringzero.compat.llm_wire``): subclass ``OpenAIWireConformance`` or
``AnthropicWireConformance`` and provide a ``provider_at`` fixture, a function from the server's
base URL to your provider (with a timeout under ``llm_wire.SLOW_SECONDS``)::

    class TestMyProvider(OpenAIWireConformance):
        @pytest.fixture
        def provider_at(self):
            return lambda url: MyProvider(base_url=url, timeout=0.5)

Needs pytest-asyncio (``pytest -p ringzero.compat`` checks it is there).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any, ClassVar

import pytest

from ringzero.compat.llm_wire import scenario_server
from ringzero.compat.vendor_servers import Vendor
from ringzero.core.contract.errors import (
    AuthenticationFailed,
    ContextTooLong,
    ProviderError,
    ProviderUnavailable,
    RateLimited,
)
from ringzero.core.contract.protocols import LLMProvider, Streaming, backend_problems
from ringzero.core.contract.types import LLMRequest, LLMResponse, Message, ToolCall, ToolSchema
from ringzero.core.support.gate import LLMGate, RetryPolicy

__all__ = ["SCENARIOS", "WEATHER", "AnthropicWireConformance", "LLMProviderConformance", "OpenAIWireConformance"]

WEATHER = ToolSchema("weather", "The weather in a city.",
                     {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]})
"""The one tool the kit's requests offer."""

SCENARIOS: dict[str, str] = {
    "answer": "answer the text 'pong', reporting 11 input and 7 output tokens",
    "tool_call": "answer with one tool call: id 'call_1', name 'weather', arguments {'city': 'Paris'}",
    "truncated": "answer the text 'po', cut short by the output token limit (the vendor's own stop reason for it: "
                 "OpenAI's finish_reason 'length', Anthropic's stop_reason 'max_tokens')",
    "echo": "answer with the text of the request's last message (for a tool result: the result's text)",
    "rate_limited_retry_after": "refuse with the vendor's rate-limit error (HTTP 429) and Retry-After: 2",
    "rate_limited": "refuse with the vendor's rate-limit error (HTTP 429) and no Retry-After",
    "server_error": "fail with the vendor's server error (HTTP 5xx: 500, 502, 503 or the vendor's overloaded)",
    "timeout": "take longer to answer than the provider's own timeout",
    "context_overflow": "refuse with the vendor's context-length error",
    "auth_failed": "refuse the credentials (HTTP 401)",
    "forbidden": "refuse the request as not permitted for these credentials (HTTP 403)",
    "unreachable": "be down: nothing listens where the provider connects (connection refused)",
}
"""Each scenario the ``provider_for`` fixture must act out, and what its backend does. A provider
that declares ``capabilities.streaming`` is also asked to ``stream`` ``answer``, ``tool_call`` and
``rate_limited_retry_after``: its backend streams the answer (in pieces) where the request asks
for a stream, and refuses as before."""

ProviderFor = Callable[[str], AbstractAsyncContextManager[LLMProvider]]

ASK = LLMRequest(messages=(Message("user", "ping"),), tools=(WEATHER,))


async def _complete(provider_for: ProviderFor, scenario: str, request: LLMRequest = ASK) -> Any:
    async with provider_for(scenario) as provider:
        return await provider.complete(request)


async def _stream(provider_for: ProviderFor, scenario: str, pieces: list[str]) -> Any:
    async with provider_for(scenario) as provider:
        if not provider.capabilities.streaming:
            pytest.skip(f"{type(provider).__name__} does not declare streaming (capabilities.streaming)")
        if not isinstance(provider, Streaming):
            raise AssertionError(f"{type(provider).__name__} declares streaming but has no stream(request, on_text)")
        return await provider.stream(ASK, pieces.append)


async def _refusal(provider_for: ProviderFor, scenario: str) -> ProviderError:
    async with provider_for(scenario) as provider:
        try:
            await provider.complete(ASK)
        except ProviderError as error:
            return error
        except Exception as exc:
            raise AssertionError(f"scenario {scenario!r}: {type(exc).__module__}.{type(exc).__name__} escaped "
                                 "complete(), which raises only the kernel's ProviderErrors") from exc
    raise AssertionError(f"scenario {scenario!r}: the provider answered instead of raising a ProviderError")


class _Counted:
    """A provider whose calls are counted: how often the gate tried."""

    def __init__(self, provider: LLMProvider) -> None:
        self.provider = provider
        self.capabilities = provider.capabilities
        self.calls = 0

    async def complete(self, request: LLMRequest) -> LLMResponse:
        self.calls += 1
        return await self.provider.complete(request)


@pytest.mark.asyncio
class LLMProviderConformance:
    """Answers with usage, tool calls both ways, and each failure as the kernel's typed error."""

    async def test_it_is_an_llm_provider(self, provider_for: ProviderFor) -> None:
        """What ``Kernel(llm=...)`` checks: every member of the protocol is there."""
        from ringzero.core.contract.protocols import ProviderCapabilities

        async with provider_for("answer") as provider:
            assert backend_problems(provider, LLMProvider) == []
            assert isinstance(provider.capabilities, ProviderCapabilities)

    async def test_an_answer_comes_back_with_its_usage(self, provider_for: ProviderFor) -> None:
        """``stop_reason`` speaks one vocabulary whatever the vendor: ``end_turn`` for an answer,
        ``tool_use`` for tool calls, ``max_tokens`` and ``stop_sequence``."""
        response = await _complete(provider_for, "answer")
        assert response.content == "pong" and response.tool_calls == ()
        assert (response.usage.input_tokens, response.usage.output_tokens) == (11, 7)
        assert response.stop_reason == "end_turn"

    async def test_an_answer_cut_short_by_the_token_limit_stops_for_max_tokens(self, provider_for: ProviderFor) -> None:
        """Whatever the vendor calls it (OpenAI's ``length``), the kernel's word is ``max_tokens``:
        what a loop checks to ask for the rest."""
        response = await _complete(provider_for, "truncated")
        assert response.content == "po", response
        assert response.stop_reason == "max_tokens", (
            f"an answer cut short by the token limit stopped for {response.stop_reason!r}, not 'max_tokens'")

    async def test_a_tool_call_comes_back_parsed(self, provider_for: ProviderFor) -> None:
        response = await _complete(provider_for, "tool_call")
        assert response.tool_calls == (ToolCall("call_1", "weather", {"city": "Paris"}),)
        assert response.stop_reason == "tool_use"

    async def test_a_tool_result_reaches_the_model_with_the_call_it_answers(self, provider_for: ProviderFor) -> None:
        asked = Message("assistant", "", tool_calls=(ToolCall("call_1", "weather", {"city": "Paris"}),))
        result = Message("tool", "sunny, 21 C", tool_call_id="call_1", name="weather")
        response = await _complete(provider_for, "echo", LLMRequest(
            messages=(Message("user", "Weather in Paris?"), asked, result), tools=(WEATHER,)))
        assert response.content == "sunny, 21 C"

    async def test_a_429_with_retry_after_is_rate_limited_with_the_delay(self, provider_for: ProviderFor) -> None:
        error = await _refusal(provider_for, "rate_limited_retry_after")
        assert type(error) is RateLimited and error.retry_after == 2.0

    async def test_a_429_without_retry_after_is_rate_limited_without_a_delay(self, provider_for: ProviderFor) -> None:
        error = await _refusal(provider_for, "rate_limited")
        assert type(error) is RateLimited and error.retry_after is None

    @pytest.mark.parametrize("scenario", ["server_error", "timeout"])
    async def test_a_server_error_or_timeout_is_provider_unavailable(self, provider_for: ProviderFor,
                                                                   scenario: str) -> None:
        assert type(await _refusal(provider_for, scenario)) is ProviderUnavailable

    async def test_a_context_overflow_is_context_too_long(self, provider_for: ProviderFor) -> None:
        assert type(await _refusal(provider_for, "context_overflow")) is ContextTooLong

    @pytest.mark.parametrize("scenario", ["auth_failed", "forbidden"])
    async def test_refused_credentials_are_authentication_failed(self, provider_for: ProviderFor,
                                                                scenario: str) -> None:
        """401 and 403 alike: the credentials do not allow this call, and a retry will not help."""
        error = await _refusal(provider_for, scenario)
        assert type(error) is AuthenticationFailed, f"{scenario}: {type(error).__name__}, not AuthenticationFailed"

    async def test_a_server_that_is_down_is_provider_unavailable_and_retried(self, provider_for: ProviderFor) -> None:
        """Connection refused is ``ProviderUnavailable`` (nothing else escapes ``complete``), so
        the gate in front of the provider tries again."""
        error = await _refusal(provider_for, "unreachable")
        assert type(error) is ProviderUnavailable, f"unreachable: {type(error).__name__}, not ProviderUnavailable"
        async with provider_for("unreachable") as provider:
            counted = _Counted(provider)
            gate = LLMGate(counted, retry=RetryPolicy(max_retries=2, base_delay=0.01, max_delay=0.01))
            with pytest.raises(ProviderUnavailable):
                await gate.complete(ASK)
        assert counted.calls == 3, f"the gate tried {counted.calls} time(s), not 1 + 2 retries"

    async def test_a_streamed_answer_is_the_whole_answer_in_pieces(self, provider_for: ProviderFor) -> None:
        pieces: list[str] = []
        response = await _stream(provider_for, "answer", pieces)
        assert response.content == "pong" and "".join(pieces) == "pong"
        assert (response.usage.input_tokens, response.usage.output_tokens) == (11, 7)

    async def test_a_streamed_tool_call_comes_back_parsed(self, provider_for: ProviderFor) -> None:
        response = await _stream(provider_for, "tool_call", [])
        assert response.tool_calls == (ToolCall("call_1", "weather", {"city": "Paris"}),)

    async def test_a_streamed_call_refused_is_the_same_typed_error(self, provider_for: ProviderFor) -> None:
        with pytest.raises(RateLimited) as refused:
            await _stream(provider_for, "rate_limited_retry_after", [])
        assert refused.value.retry_after == 2.0


class OpenAIWireConformance(LLMProviderConformance):
    """The kit's scenarios acted out by its own server in OpenAI's chat completions wire format
    (``ringzero.compat.llm_wire``). Provide ``provider_at``: base URL -> your provider."""

    wire: ClassVar[Vendor] = "openai"
    answers: ClassVar[int] = 1
    """How many requests each scenario's server answers (a client that retries a 429 itself needs more)."""

    @pytest.fixture
    def provider_for(self, provider_at: Callable[[str], LLMProvider]) -> ProviderFor:
        @asynccontextmanager
        async def start(scenario: str) -> AsyncIterator[LLMProvider]:
            with scenario_server(self.wire, scenario, self.answers) as url:
                provider = provider_at(url)
                try:
                    yield provider
                finally:
                    close = getattr(provider, "aclose", None)
                    if close is not None:
                        await close()
        return start


class AnthropicWireConformance(OpenAIWireConformance):
    """The kit's scenarios acted out by its own server in Anthropic's messages wire format."""

    wire: ClassVar[Vendor] = "anthropic"
