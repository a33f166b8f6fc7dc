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

Why the answer stopped (an answer cut at the token limit is ``max_tokens``, what a loop checks to
ask for the rest) is not in what ``call`` returns: CrewAI hands the vendor's finish reason only to
its event bus, in an ``LLMCallCompletedEvent`` whose handlers run on the bus's thread pool, in a
copy of the calling thread's context. So the call runs with a ``_Finish`` in a context variable
that a handler of ours fills in, and the answer waits for it (at most ``HEAR_WITHIN``). An LLM
not yet heard from is waited for only ``HEAR_FIRST``, once: one that never emits the event (a
``BaseLLM`` of your own may not) costs that once, and one whose event comes late is waited for
from its next call on.
"""

from __future__ import annotations

import asyncio
import contextvars
import json
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ringzero.core.contract.errors import InvalidArgument, MissingExtra
from ringzero.core.contract.llm_types import stop_reason_of
from ringzero.core.contract.protocols import ProviderCapabilities, TextSink
from ringzero.core.contract.types import JSON, LLMRequest, LLMResponse, Message, ToolCall, Usage
from ringzero.core.support.loops import on_this_loop
from ringzero.providers.llm import error_of_exception

try:
    from crewai.events.event_bus import crewai_event_bus
    from crewai.events.types.llm_events import LLMCallCompletedEvent
    from crewai.llms.base_llm import BaseLLM
    from crewai.utilities.types import LLMMessage
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise MissingExtra("ringzero.adapters.crewai", "crewai") from exc

__all__ = ["CrewLLMProvider"]

HEAR_WITHIN = 2.0
"""Seconds an answer waits for its LLMCallCompletedEvent to reach our handler (the bus runs it at
once on its thread pool; the bound is for a bus that is busy or shutting down)."""
HEAR_FIRST = 0.2
"""Seconds the first answer of an LLM not yet heard from waits for the event."""


@dataclass
class _Finish:
    """One call's finish reason, filled in by ``_heard`` on the event bus's thread."""

    provider: CrewLLMProvider
    reason: str | None = None
    heard: threading.Event = field(default_factory=threading.Event)


_WAITING: contextvars.ContextVar[_Finish | None] = contextvars.ContextVar("ringzero_crew_finish", default=None)
_listening = threading.Lock()
_listener: list[Callable[[Any, Any], None]] = []


def _heard(source: Any, event: Any) -> None:
    """CrewAI's bus runs this in a copy of the emitting thread's context: the call's ``_Finish``."""
    finish = _WAITING.get()
    if finish is not None and source is finish.provider.llm:
        finish.reason = event.finish_reason
        finish.heard.set()
        finish.provider._heard_from()


def _listen() -> None:
    """Register ``_heard`` on CrewAI's event bus, once per process."""
    with _listening:
        if not _listener:
            crewai_event_bus.register_handler(LLMCallCompletedEvent, _heard)
            _listener.append(_heard)


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
        self._emits_finish: bool | None = None
        """Whether this LLM's calls emit an LLMCallCompletedEvent (None: not known yet)."""
        _listen()

    def _heard_from(self) -> None:
        """A call's completed event reached us (``_heard``): its next calls wait for theirs."""
        self._emits_finish = True

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
            answer, finish = await asyncio.to_thread(self._call_heard, call)
        except Exception as exc:
            raise error_of_exception(exc, "the CrewAI LLM") from exc
        used = llm.get_token_usage_summary().delta_since(before)
        calls = _tool_calls(answer)
        stop = stop_reason_of(finish, tool_calls=bool(calls))
        if calls and stop == "end_turn":  # a finish word that does not say "tool calls" for an answer that makes them
            stop = "tool_use"
        return LLMResponse(Message("assistant", "" if calls else _text(answer), tool_calls=calls),
                           Usage(used.prompt_tokens, used.completion_tokens), stop_reason=stop, model=self.model)

    def _call_heard(self, call: Callable[[], Any]) -> tuple[Any, str | None]:
        """On the worker thread: ``call()``, and the finish reason its completed event carried."""
        finish = _Finish(self)
        token = _WAITING.set(finish)
        try:
            answer = call()
        finally:
            _WAITING.reset(token)
        emits = self._emits_finish
        if emits is not False and not finish.heard.wait(HEAR_WITHIN if emits else HEAR_FIRST) and emits is None \
                and not finish.heard.is_set():  # set before ``_heard_from``: a late event still turns this back
            self._emits_finish = False
        return answer, finish.reason


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
