"""Every built-in LLM provider passes the LLMProvider conformance kit.

OpenAI and Anthropic act out the kit's scenarios on the tests' vendor servers (127.0.0.1, each
vendor's own wire format and error bodies); the scripted provider's backend is its script.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

import pytest

from ringzero.compat.llm import LLMProviderConformance
from ringzero.core.errors import AuthenticationFailed, ContextTooLong, ProviderUnavailable, RateLimited
from ringzero.core.protocols import LLMProvider
from ringzero.core.types import LLMRequest, LLMResponse, Message, Usage
from ringzero.testing import ScriptedProvider
from tests.test_llm_providers import ERRORS, provider_for, rate_limit
from tests.vendor_servers import Reply, anthropic_answer, openai_answer, vendor_server

ProviderFor = Callable[[str], AbstractAsyncContextManager[LLMProvider]]


def last_text(vendor: str, body: dict[str, Any]) -> str:
    """The text of the request's last message, in either vendor's shape (a tool result's text too)."""
    last = body["messages"][-1]
    content = last.get("content")
    if isinstance(content, str):
        return content
    block = content[-1]
    inner = block.get("content", block.get("text", ""))
    return inner if isinstance(inner, str) else "".join(part.get("text", "") for part in inner)


def vendor_reply(vendor: str, scenario: str) -> Reply | Callable[[dict[str, Any]], Reply]:
    pick = 0 if vendor == "openai" else 1
    if scenario == "answer":
        return openai_answer("pong", usage=(11, 7)) if vendor == "openai" else anthropic_answer("pong", usage=(11, 7))
    if scenario == "tool_call":
        call = [("call_1", "weather", {"city": "Paris"})]
        return openai_answer(None, call) if vendor == "openai" else anthropic_answer("", call)
    if scenario == "echo":
        make = openai_answer if vendor == "openai" else anthropic_answer
        return lambda body: make(last_text(vendor, body))
    if scenario == "rate_limited_retry_after":
        return rate_limit(vendor, {"retry-after": "2"})
    if scenario == "rate_limited":
        return rate_limit(vendor, {})
    if scenario == "timeout":
        slow = vendor_reply(vendor, "answer")
        assert isinstance(slow, Reply)
        slow.delay = 2.0
        return slow
    case = {"server_error": "server overloaded", "context_overflow": "context overflow",
            "auth_failed": "bad credentials"}[scenario]
    return ERRORS[case][pick]()


@pytest.mark.parametrize("vendor", ["openai", "anthropic"])
class TestVendorProviders(LLMProviderConformance):
    @pytest.fixture
    def provider_for(self, vendor: str) -> ProviderFor:
        @asynccontextmanager
        async def start(scenario: str) -> AsyncIterator[LLMProvider]:
            with vendor_server(vendor, [vendor_reply(vendor, scenario)]) as server:  # type: ignore[list-item]
                provider = provider_for(vendor, server.url, timeout=0.3)
                try:
                    yield provider
                finally:
                    await provider.aclose()  # type: ignore[attr-defined]
        return start


def scripted_backend(scenario: str) -> Callable[[LLMRequest], Any]:
    def answer(request: LLMRequest) -> Any:
        if scenario == "answer":
            return LLMResponse(Message("assistant", "pong"), Usage(11, 7), "end_turn", "scripted")
        if scenario == "tool_call":
            return {"content": "", "tool_calls": [{"id": "call_1", "name": "weather", "arguments": {"city": "Paris"}}]}
        if scenario == "echo":
            return request.messages[-1].content
        return {"rate_limited_retry_after": RateLimited("429", retry_after=2.0), "rate_limited": RateLimited("429"),
                "server_error": ProviderUnavailable("503"), "timeout": ProviderUnavailable("did not answer in time"),
                "context_overflow": ContextTooLong("too long"), "auth_failed": AuthenticationFailed("401")}[scenario]
    return answer


class TestScriptedProvider(LLMProviderConformance):
    @pytest.fixture
    def provider_for(self) -> ProviderFor:
        @asynccontextmanager
        async def start(scenario: str) -> AsyncIterator[LLMProvider]:
            yield ScriptedProvider(scripted_backend(scenario))
        return start

