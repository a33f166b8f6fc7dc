"""KernelChatModel and ChatModelProvider with real LangChain and LangGraph objects."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage
from langgraph.prebuilt import create_react_agent

from ringzero import Context, Kernel, LLMGate, RateLimit
from ringzero.adapters.langchain import ChatModelProvider, KernelChatModel
from ringzero.adapters.langgraph import KernelSaver, sandboxed
from ringzero.checkpointers import MemoryCheckpointer, SqliteCheckpointer
from ringzero.core.contract.errors import ProcessFailed, ProviderError, ProviderUnavailable, RateLimited
from ringzero.core.contract.types import LLMRequest
from ringzero.core.support.gate import RetryPolicy
from ringzero.testing import ScriptedProvider
from tests.tool_bodies import word_stats


def test_kernel_chat_model_answers_through_the_gate_and_reports_usage() -> None:
    gate = LLMGate(ScriptedProvider(["hello there"]), RateLimit(requests_per_minute=600))
    model = KernelChatModel(gate)
    reply = model.invoke([SystemMessage("be brief"), HumanMessage("hi")])
    assert isinstance(reply, AIMessage) and reply.content == "hello there"
    assert reply.usage_metadata is not None and reply.usage_metadata["output_tokens"] == 2
    assert gate.stats.calls == 1 and gate.total_usage.output_tokens == 2


# create_react_agent's successor, langchain.agents.create_agent, lives in the `langchain` package,
# which ringzero does not depend on; the prebuilt agent is still LangGraph's own and still works.
@pytest.mark.filterwarnings("ignore:create_react_agent has been moved")
async def test_a_react_agent_with_sandboxed_tools_kernel_model_and_kernel_saver(tmp_path: Path) -> None:
    """The adapter's whole promise in one graph: model through the gate, tools in the sandbox,
    state in the kernel's store."""
    def script(request: LLMRequest) -> Any:
        if request.messages[-1].role == "tool":
            return f"The text has {request.messages[-1].content}"
        assert [t.name for t in request.tools] == ["word_stats"]
        return {"content": "", "tool_calls": [{"id": "call-1", "name": "word_stats",
                                               "arguments": {"text": "to be or not to be", "top": 1}}]}

    provider = ScriptedProvider(script)
    store = SqliteCheckpointer(tmp_path / "agent.db")
    agent = create_react_agent(KernelChatModel(provider), [sandboxed(word_stats)], checkpointer=KernelSaver(store))
    config = {"configurable": {"thread_id": "react"}}
    result = await agent.ainvoke({"messages": [HumanMessage("count the words")]}, config)
    final = result["messages"][-1]
    assert final.content == 'The text has {"words": 6, "top": ["be"]}'  # computed in the sandbox
    assert provider.calls == 2
    assert len([c async for c in store.list("react")]) >= 3
    await store.aclose()


async def test_any_langchain_chat_model_serves_a_kernel_program() -> None:
    fake = GenericFakeChatModel(messages=iter([AIMessage("first"), AIMessage("second")]))

    async def program(ctx: Context) -> list[str]:
        return [(await ctx.llm("one")).content, (await ctx.llm([{"role": "user", "content": "two"}])).content]

    async with Kernel(checkpointer=MemoryCheckpointer(), llm=ChatModelProvider(fake)) as kernel:
        assert await (await kernel.spawn(program)).wait() == ["first", "second"]


async def test_a_chat_models_429_becomes_rate_limited_with_its_retry_after() -> None:
    class Limited(Exception):
        status_code = 429

        class response:
            headers = {"retry-after": "1.5"}

    class Failing(GenericFakeChatModel):
        async def ainvoke(self, *args: Any, **kwargs: Any) -> Any:  # type: ignore[override]
            raise Limited("slow down")

    with pytest.raises(RateLimited) as caught:
        await ChatModelProvider(Failing(messages=iter([]))).complete(LLMRequest(messages=()))
    assert caught.value.retry_after == 1.5


@pytest.mark.parametrize(("raised", "expected", "retryable"), [
    (TypeError("a bug in the model's code"), ProviderError, False),
    (ValueError("a bad argument"), ProviderError, False),
    (ConnectionResetError("peer reset"), ProviderUnavailable, True),
    (type("APIConnectionError", (Exception,), {})("no route"), ProviderUnavailable, True),
    (type("APITimeoutError", (Exception,), {})("took too long"), ProviderUnavailable, True),
    (type("RateLimitError", (Exception,), {})("quota"), RateLimited, True),
])
async def test_a_chat_models_exception_is_mapped_by_kind_and_only_transient_ones_are_retried(
        raised: Exception, expected: type[ProviderError], retryable: bool) -> None:
    attempts = 0

    class Failing(GenericFakeChatModel):
        async def ainvoke(self, *args: Any, **kwargs: Any) -> Any:  # type: ignore[override]
            nonlocal attempts
            attempts += 1
            raise raised

    with pytest.raises(expected) as caught:
        await ChatModelProvider(Failing(messages=iter([]))).complete(LLMRequest(messages=()))
    assert type(caught.value) is expected and caught.value.retryable is retryable
    assert type(raised).__name__ in str(caught.value)

    async def program(ctx: Context) -> str:
        return (await ctx.llm("hi")).content

    attempts = 0
    gate = LLMGate(ChatModelProvider(Failing(messages=iter([]))), retry=RetryPolicy(max_retries=2, base_delay=0.0))
    async with Kernel(checkpointer=MemoryCheckpointer(), llm=gate) as kernel:
        with pytest.raises(ProcessFailed):
            await (await kernel.spawn(program)).wait()
    assert attempts == (3 if retryable else 1)
