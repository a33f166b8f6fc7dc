"""Any CrewAI LLM as a ringzero LLMProvider (``CrewLLMProvider``), as ``ChatModelProvider`` is for
a LangChain chat model: a crew's model (``crewai.LLM("openai/gpt-4o")``, a native provider, your
own ``BaseLLM``) serves kernel programs through the kernel's gate, budgets and journal.

The request's messages go in the OpenAI form every CrewAI LLM takes (tool calls and tool results
included) and its tools as function schemas; the LLM answers text, or the tool calls it returns
when given tools and no functions to run (CrewAI's native providers return their SDK's call
objects, or dicts), which become the response's tool calls. The usage is the LLM's own count for
the call (``get_token_usage_summary`` before and after). The LLM's own settings (max tokens,
temperature, stop words) apply: CrewAI's ``call`` takes none of them per call. CrewAI retries a
429 itself (three tries) before the gate sees one; a failure it gives up on becomes the kernel's
typed error (``RateLimited`` with the server's Retry-After, ``BadRequest``, ...). It streams
through the LLM's own ``stream_events``.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

from ringzero.core.contract.errors import InvalidArgument, MissingExtra
from ringzero.core.contract.protocols import ProviderCapabilities, TextSink
from ringzero.core.contract.types import JSON, LLMRequest, LLMResponse, Message, ToolCall, Usage
from ringzero.core.support.loops import on_this_loop
from ringzero.providers.llm import error_of_exception

try:
    from crewai.llms.base_llm import BaseLLM
    from crewai.utilities.types import LLMMessage
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise MissingExtra("ringzero.adapters.crewai", "crewai") from exc

__all__ = ["CrewLLMProvider"]


class CrewLLMProvider:
    """A CrewAI ``BaseLLM`` as a ringzero LLMProvider."""

    capabilities = ProviderCapabilities(tool_calls=True, streaming=True, counts_tokens=True)

    def __init__(self, llm: BaseLLM) -> None:
        if not isinstance(llm, BaseLLM):
            raise InvalidArgument(f"CrewLLMProvider takes a CrewAI LLM (a crewai BaseLLM, such as crewai.LLM(...)), "
                                  f"not {type(llm).__name__} {llm!r:.60}")
        self.llm = llm
        self.model = str(getattr(llm, "model", "") or "") or None
        self.provider_name = str(getattr(llm, "provider", "") or "crewai")
        """``gen_ai.provider.name``: the CrewAI LLM's provider (``openai``, ``anthropic``, ...)."""

    async def complete(self, request: LLMRequest) -> LLMResponse:
        messages, tools = _crew_request(request)
        # Its sync call, on a worker thread: a CrewAI LLM keeps one async SDK client, whose
        # connections belong to the first event loop that used it, and offers no way to close
        # it; its sync client serves any thread.
        return await self._answer(lambda: self.llm.call(messages, tools=tools))

    async def stream(self, request: LLMRequest, on_text: TextSink) -> LLMResponse:
        """``complete`` through the LLM's own ``stream_events``: its text chunks (not the tool
        calls' argument chunks) go to ``on_text`` as they arrive, on the caller's loop."""
        messages, tools = _crew_request(request)
        deliver = on_this_loop(on_text)

        def streamed() -> Any:
            session = self.llm.stream_events(messages, tools=tools)
            for frame in session:
                if frame.type == "llm_stream_chunk" and frame.content and frame.data.get("tool_call") is None:
                    deliver(frame.content)
            return session.result

        return await self._answer(streamed)

    async def _answer(self, call: Callable[[], Any]) -> LLMResponse:
        """Run ``call`` (the LLM's answer) on a worker thread; the response, with its usage."""
        llm = self.llm
        before = llm.get_token_usage_summary()
        try:
            answer = await asyncio.to_thread(call)
        except Exception as exc:
            raise error_of_exception(exc, "the CrewAI LLM") from exc
        used = llm.get_token_usage_summary().delta_since(before)
        calls = _tool_calls(answer)
        return LLMResponse(Message("assistant", "" if calls else _text(answer), tool_calls=calls),
                           Usage(used.prompt_tokens, used.completion_tokens),
                           stop_reason="tool_use" if calls else "end_turn", model=self.model)


def _crew_request(request: LLMRequest) -> tuple[list[LLMMessage], list[dict[str, Any]] | None]:
    """The messages and tools of ``request`` as a CrewAI LLM takes them."""
    tools = [{"type": "function", "function": t.to_dict()} for t in request.tools] or None
    return [_crew_message(m) for m in request.messages], tools


def _crew_message(message: Message) -> LLMMessage:
    """A message in the OpenAI form CrewAI's LLMs take."""
    if message.role == "tool":
        return {"role": "tool", "tool_call_id": message.tool_call_id or "", "content": message.content}
    out: LLMMessage = {"role": message.role, "content": message.content}
    if message.tool_calls:
        out["tool_calls"] = [{"id": c.id, "type": "function",
                              "function": {"name": c.name, "arguments": json.dumps(c.arguments)}}
                             for c in message.tool_calls]
    return out


def _tool_calls(answer: Any) -> tuple[ToolCall, ...]:
    """The tool calls a CrewAI LLM returned (a list of its SDK's call objects or of dicts, in
    OpenAI's or Anthropic's shape); none for a text answer."""
    if not isinstance(answer, list) or not answer:
        return ()
    calls = []
    for item in answer:
        get = item.get if isinstance(item, dict) else lambda key, item=item: getattr(item, key, None)
        function = get("function")
        if function is not None:  # OpenAI's shape: {"id", "function": {"name", "arguments"}}
            fget = function.get if isinstance(function, dict) else lambda key, f=function: getattr(f, key, None)
            name, arguments = fget("name"), fget("arguments")
        else:  # Anthropic's tool_use block, Gemini's and Bedrock's dicts: {"id", "name", "input"}
            name, arguments = get("name"), get("input") if get("input") is not None else get("args")
        if not name:
            return ()  # a list that is not tool calls: the answer is its text
        calls.append(ToolCall(str(get("id") or ""), str(name), _arguments(arguments)))
    return tuple(calls)


def _arguments(raw: Any) -> dict[str, JSON]:
    if isinstance(raw, dict):
        return raw
    try:
        parsed = json.loads(raw or "{}")
    except (TypeError, ValueError):
        return {"_unparsed_arguments": str(raw)}  # the tool's error goes back to the model, as for OpenAIProvider
    return parsed if isinstance(parsed, dict) else {"value": parsed}


def _text(answer: Any) -> str:
    if isinstance(answer, str):
        return answer
    if answer is None:
        return ""
    model_dump_json = getattr(answer, "model_dump_json", None)  # a structured answer (response_model)
    return str(model_dump_json()) if callable(model_dump_json) else str(answer)
