"""Every built-in LLM provider passes the LLMProvider conformance kit.

OpenAI and Anthropic act out the kit's scenarios on the tests' vendor servers (127.0.0.1, each
vendor's own wire format and error bodies); the scripted provider's backend is its script;
ChatModelProvider wraps a LangChain chat model that fails as an httpx-based vendor SDK does.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

import httpx
import pytest
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.messages.ai import UsageMetadata
from langchain_core.outputs import ChatGeneration, ChatResult

from ringzero.adapters.langchain import ChatModelProvider
from ringzero.compat.llm import LLMProviderConformance
from ringzero.core.contract.errors import AuthenticationFailed, ContextTooLong, ProviderUnavailable, RateLimited
from ringzero.core.contract.protocols import LLMProvider
from ringzero.core.contract.types import LLMRequest, LLMResponse, Message, Usage
from ringzero.testing import ScriptedProvider
from tests.test_llm_providers import ERRORS, provider_for, rate_limit
from tests.vendor_servers import (
    Reply,
    Stream,
    anthropic_answer,
    anthropic_stream,
    openai_answer,
    openai_stream,
    vendor_server,
)

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


def vendor_reply(vendor: str, scenario: str) -> Reply | Callable[[dict[str, Any]], Reply | Stream]:
    stream = openai_stream if vendor == "openai" else anthropic_stream
    if scenario in ("answer", "tool_call"):  # streamed where the request asks for a stream
        whole = whole_reply(vendor, scenario)
        pieces = stream(["po", "ng"], usage=(11, 7)) if scenario == "answer" else \
            stream([], [("call_1", "weather", {"city": "Paris"})])
        return lambda body: pieces if body.get("stream") else whole
    if scenario == "echo":
        make = openai_answer if vendor == "openai" else anthropic_answer
        return lambda body: make(last_text(vendor, body))
    return whole_reply(vendor, scenario)


def whole_reply(vendor: str, scenario: str) -> Reply:
    pick = 0 if vendor == "openai" else 1
    if scenario == "answer":
        return openai_answer("pong", usage=(11, 7)) if vendor == "openai" else anthropic_answer("pong", usage=(11, 7))
    if scenario == "tool_call":
        call = [("call_1", "weather", {"city": "Paris"})]
        return openai_answer(None, call) if vendor == "openai" else anthropic_answer("", call)
    if scenario == "rate_limited_retry_after":
        return rate_limit(vendor, {"retry-after": "2"})
    if scenario == "rate_limited":
        return rate_limit(vendor, {})
    if scenario == "timeout":
        slow = whole_reply(vendor, "answer")
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


class TestCrewLLMProvider(LLMProviderConformance):
    """A real CrewAI LLM (``crewai.LLM``, the openai SDK) on the OpenAI vendor server. CrewAI
    retries a 429 three times itself, so those scenarios answer three times."""

    @pytest.fixture
    def provider_for(self) -> ProviderFor:
        from crewai import LLM

        from ringzero.adapters.crewai import CrewLLMProvider

        @asynccontextmanager
        async def start(scenario: str) -> AsyncIterator[LLMProvider]:
            replies = [vendor_reply("openai", scenario)] * (3 if scenario.startswith("rate_limited") else 1)
            with vendor_server("openai", replies) as server:  # type: ignore[arg-type]
                yield CrewLLMProvider(LLM(model="openai/gpt-test", base_url=server.url, api_key="sk-test",
                                          timeout=0.3, max_retries=0))
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



class ScenarioChatModel(BaseChatModel):
    """A LangChain chat model whose backend acts out one kit scenario, failing as an httpx-based
    vendor SDK fails (an ``httpx.HTTPStatusError`` carrying the real status and headers)."""

    scenario: str

    @property
    def _llm_type(self) -> str:
        return "scenario"

    def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
        return self

    def _generate(self, messages: list[BaseMessage], stop: list[str] | None = None, run_manager: Any = None,
                  **kwargs: Any) -> ChatResult:
        refusals = {"rate_limited_retry_after": (429, {"retry-after": "2"}, "rate limit reached"),
                    "rate_limited": (429, {}, "rate limit reached"),
                    "server_error": (503, {}, "The server is overloaded"),
                    "context_overflow": (400, {}, "This model's maximum context length is 128000 tokens "
                                                  "(context_length_exceeded)"),
                    "auth_failed": (401, {}, "Incorrect API key provided")}
        if self.scenario in refusals:
            status, headers, text = refusals[self.scenario]
            request = httpx.Request("POST", "http://127.0.0.1/v1/chat/completions")
            response = httpx.Response(status, headers=headers, json={"error": {"message": text}}, request=request)
            raise httpx.HTTPStatusError(text, request=request, response=response)
        if self.scenario == "timeout":
            raise httpx.ReadTimeout("the model did not answer in time")
        usage = UsageMetadata(input_tokens=11, output_tokens=7, total_tokens=18)
        if self.scenario == "tool_call":
            reply = AIMessage("", tool_calls=[{"id": "call_1", "name": "weather", "args": {"city": "Paris"}}],
                              usage_metadata=usage)
        else:
            reply = AIMessage("pong" if self.scenario == "answer" else str(messages[-1].content), usage_metadata=usage)
        return ChatResult(generations=[ChatGeneration(message=reply)])


class TestChatModelProvider(LLMProviderConformance):
    @pytest.fixture
    def provider_for(self) -> ProviderFor:
        @asynccontextmanager
        async def start(scenario: str) -> AsyncIterator[LLMProvider]:
            yield ChatModelProvider(ScenarioChatModel(scenario=scenario))
        return start
