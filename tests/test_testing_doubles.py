"""ringzero.testing: ScriptedProvider and InProcessExecutor behave like real backends."""

from __future__ import annotations

import pytest

from ringzero.core.contract.errors import BadRequest, RateLimited
from ringzero.core.contract.protocols import Executor, LLMProvider
from ringzero.core.contract.types import ExecLimits, LLMRequest, LLMResponse, Message, ToolCall, Usage
from ringzero.testing import InProcessExecutor, ScriptedProvider, count_tokens


def ask(text: str) -> LLMRequest:
    return LLMRequest(messages=(Message("user", text),))


async def test_scripted_provider_replays_its_list_in_order_then_says_it_is_exhausted() -> None:
    tool_reply = {"content": "", "tool_calls": [{"id": "c1", "name": "search", "arguments": {"q": "x"}}]}
    fixed = LLMResponse(Message("assistant", "fixed"), Usage(1, 1), "end_turn")
    provider = ScriptedProvider(["plain text", tool_reply, fixed, RateLimited("slow", retry_after=2)])
    assert isinstance(provider, LLMProvider)
    first = await provider.complete(ask("one two three"))
    assert first.content == "plain text" and first.usage == Usage(3, 2) and first.stop_reason == "end_turn"
    second = await provider.complete(ask("again"))
    assert second.tool_calls == (ToolCall("c1", "search", {"q": "x"}),) and second.stop_reason == "tool_use"
    assert await provider.complete(ask("x")) is fixed
    with pytest.raises(RateLimited) as limited:
        await provider.complete(ask("x"))
    assert limited.value.retry_after == 2
    with pytest.raises(BadRequest, match="exhausted after 4 replies"):
        await provider.complete(ask("x"))
    assert provider.calls == 5


async def test_scripted_provider_asks_a_function_sync_or_async() -> None:
    async def answer(request: LLMRequest) -> str:
        return request.messages[-1].content.upper()

    assert (await ScriptedProvider(answer).complete(ask("shout"))).content == "SHOUT"
    assert (await ScriptedProvider(lambda r: "sync").complete(ask("x"))).content == "sync"


def test_count_tokens_counts_words_and_punctuation() -> None:
    assert count_tokens("Hello, world!") == 4 and count_tokens("") == 0


async def test_in_process_executor_returns_the_last_value_and_captured_print() -> None:
    executor = InProcessExecutor()
    assert isinstance(executor, Executor) and executor.capabilities.isolation == "none"
    result = await executor.run("x = a * 2\nprint('x is', x)\nx + 1", inputs={"a": 20})
    assert (result.value, result.stdout, result.error) == (41, "x is 40\n", None)
    assert (await executor.run("y = 1")).value is None


async def test_in_process_executor_reports_user_errors_as_data() -> None:
    executor = InProcessExecutor()
    broken = await executor.run("def f(:\n  pass")
    assert broken.error is not None and broken.error.type == "SyntaxError"
    raised = await executor.run("raise ValueError('bad value')")
    assert raised.error is not None and (raised.error.type, raised.error.message) == ("ValueError", "bad value")
    odd = await executor.run("object()")
    assert isinstance(odd.value, str) and odd.value.startswith("<object object")


async def test_in_process_executor_times_out_by_its_wall_limit() -> None:
    result = await InProcessExecutor().run("import time\ntime.sleep(1)", limits=ExecLimits(wall_seconds=0.05))
    assert result.error is not None and result.error.type == "TimeoutError" and "0.05" in result.error.message


async def test_host_tools_sync_and_async_are_called_and_their_errors_can_be_caught() -> None:
    async def lookup(key: str) -> str:
        return {"a": "alpha"}[key]

    def fail() -> None:
        raise PermissionError("no secrets for you")

    code = "out = [lookup('a')]\ntry:\n    fail()\nexcept PermissionError as e:\n    out.append(str(e))\nout"
    result = await InProcessExecutor().run(code, tools={"lookup": lookup, "fail": fail})
    assert result.value == ["alpha", "no secrets for you"]
    assert [(c.name, c.result, c.error) for c in result.tool_calls] == [
        ("lookup", "alpha", None), ("fail", None, "PermissionError: no secrets for you")]
