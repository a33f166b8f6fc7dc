"""Every built-in LLM provider passes the LLMProvider conformance kit.

OpenAI, Anthropic and CrewAI's LLM meet the kit's own servers (127.0.0.1, each vendor's wire
format and error bodies, ``ringzero.compat.llm_wire``); the scripted provider's backend is its script;
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
from ringzero.compat.llm import AnthropicWireConformance, LLMProviderConformance, OpenAIWireConformance
from ringzero.core.contract.errors import AuthenticationFailed, ContextTooLong, ProviderUnavailable, RateLimited
from ringzero.core.contract.protocols import LLMProvider
from ringzero.core.contract.types import LLMRequest, LLMResponse, Message, Usage
from ringzero.testing import ScriptedProvider
from tests.test_llm_providers import provider_for

ProviderFor = Callable[[str], AbstractAsyncContextManager[LLMProvider]]


class TestOpenAIProvider(OpenAIWireConformance):
    @pytest.fixture
    def provider_at(self) -> Callable[[str], LLMProvider]:
        return lambda url: provider_for("openai", url, timeout=0.3)


class TestAnthropicProvider(AnthropicWireConformance):
    @pytest.fixture
    def provider_at(self) -> Callable[[str], LLMProvider]:
        return lambda url: provider_for("anthropic", url, timeout=0.3)


class TestCrewLLMProvider(OpenAIWireConformance):
    """A real CrewAI LLM (``crewai.LLM``, the openai SDK) on the kit's OpenAI server. CrewAI
    retries a 429 three times itself, so each scenario's server answers three times."""

    answers = 3

    @pytest.fixture
    def provider_at(self) -> Callable[[str], LLMProvider]:
        from crewai import LLM

        from ringzero.adapters.crewai import CrewLLMProvider

        return lambda url: CrewLLMProvider(LLM(model="openai/gpt-test", base_url=url, api_key="sk-test", timeout=0.3,
                                               max_retries=0))


def scripted_backend(scenario: str) -> Callable[[LLMRequest], Any]:
    def answer(request: LLMRequest) -> Any:
        if scenario == "answer":
            return LLMResponse(Message("assistant", "pong"), Usage(11, 7), "end_turn", "scripted")
        if scenario == "tool_call":
            return {"content": "", "tool_calls": [{"id": "call_1", "name": "weather", "arguments": {"city": "Paris"}}]}
        if scenario == "truncated":
            return LLMResponse(Message("assistant", "po"), Usage(11, 7), "max_tokens", "scripted")
        if scenario == "echo":
            return request.messages[-1].content
        return {"rate_limited_retry_after": RateLimited("429", retry_after=2.0), "rate_limited": RateLimited("429"),
                "server_error": ProviderUnavailable("503"), "timeout": ProviderUnavailable("did not answer in time"),
                "context_overflow": ContextTooLong("too long"), "auth_failed": AuthenticationFailed("401"),
                "forbidden": AuthenticationFailed("403"),
                "unreachable": ProviderUnavailable("connection refused")}[scenario]
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
                    "auth_failed": (401, {}, "Incorrect API key provided"),
                    "forbidden": (403, {}, "Project does not have access to this model")}
        if self.scenario in refusals:
            status, headers, text = refusals[self.scenario]
            request = httpx.Request("POST", "http://127.0.0.1/v1/chat/completions")
            response = httpx.Response(status, headers=headers, json={"error": {"message": text}}, request=request)
            raise httpx.HTTPStatusError(text, request=request, response=response)
        if self.scenario == "timeout":
            raise httpx.ReadTimeout("the model did not answer in time")
        if self.scenario == "unreachable":
            raise httpx.ConnectError("[Errno 111] Connection refused")
        usage = UsageMetadata(input_tokens=11, output_tokens=7, total_tokens=18)
        if self.scenario == "tool_call":
            reply = AIMessage("", tool_calls=[{"id": "call_1", "name": "weather", "args": {"city": "Paris"}}],
                              usage_metadata=usage)
        elif self.scenario == "truncated":  # as langchain-openai says so: the vendor's finish reason, kept
            reply = AIMessage("po", usage_metadata=usage, response_metadata={"finish_reason": "length"})
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
