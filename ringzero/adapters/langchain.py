"""LangChain chat models and ringzero providers, both ways.

- ``KernelChatModel(provider)``: a LangChain ``BaseChatModel`` (``bind_tools``, sync and async)
  backed by a ringzero LLMProvider through an LLM gate, so LangGraph agents share the kernel's
  rate limits, retries and usage accounting.
- ``ChatModelProvider(chat_model)``: any LangChain chat model as a ringzero LLMProvider, with
  its failures translated into the kernel's typed errors.
"""

from __future__ import annotations

import asyncio
import contextvars
import json
import queue
import threading
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any, ClassVar

from ringzero.adapters import _unseen  # noqa: F401 - the warning for models and tools the kernel cannot see
from ringzero.adapters._graph_guard import refuse_persistent_checkpointer
from ringzero.core.context import Context
from ringzero.core.contract import errors
from ringzero.core.contract.errors import MissingExtra
from ringzero.core.contract.llm_types import stop_reason_of
from ringzero.core.contract.protocols import LLMProvider, ProviderCapabilities, TextSink
from ringzero.core.contract.types import LLMRequest, LLMResponse, Message, ToolCall, ToolSchema, Usage
from ringzero.core.routing import route, route_sync
from ringzero.core.support.gate import LLMGate
from ringzero.core.support.loops import Closing, LoopHome, on_this_loop, running_loop
from ringzero.providers.llm import error_of_exception

try:
    from langchain_core.callbacks import AsyncCallbackManagerForLLMRun, CallbackManagerForLLMRun
    from langchain_core.language_models import BaseChatModel
    from langchain_core.messages import (
        AIMessage,
        AIMessageChunk,
        BaseMessage,
        HumanMessage,
        SystemMessage,
        ToolMessage,
    )
    from langchain_core.messages.tool import tool_call_chunk
    from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult
    from langchain_core.utils.function_calling import convert_to_openai_tool
    from pydantic import ConfigDict, Field, PrivateAttr
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise MissingExtra("ringzero.adapters.langchain", "langgraph") from exc

__all__ = ["ChatModelProvider", "KernelChatModel", "from_langchain", "to_langchain"]

def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    return "".join(part.get("text", "") if isinstance(part, dict) else str(part) for part in content or [])


def from_langchain(message: BaseMessage) -> Message:
    """A LangChain message as a ringzero Message."""
    if isinstance(message, SystemMessage):
        return Message("system", _text(message.content))
    if isinstance(message, ToolMessage):
        return Message("tool", _text(message.content), tool_call_id=message.tool_call_id, name=message.name)
    if isinstance(message, AIMessage):
        calls = tuple(ToolCall(str(c.get("id") or ""), c["name"], dict(c.get("args") or {}))
                      for c in message.tool_calls)
        return Message("assistant", _text(message.content), tool_calls=calls)
    return Message("user", _text(message.content))


def to_langchain(message: Message) -> BaseMessage:
    """A ringzero Message as a LangChain message."""
    if message.role == "system":
        return SystemMessage(message.content)
    if message.role == "tool":
        return ToolMessage(message.content, tool_call_id=message.tool_call_id or "", name=message.name)
    if message.role == "assistant":
        return AIMessage(message.content, tool_calls=[
            {"id": c.id, "name": c.name, "args": dict(c.arguments), "type": "tool_call"} for c in message.tool_calls])
    return HumanMessage(message.content)


def _schema(tool: dict[str, Any]) -> ToolSchema:
    function = tool.get("function", tool)
    return ToolSchema(function["name"], function.get("description", ""),
                      function.get("parameters") or {"type": "object", "properties": {}})


class KernelChatModel(Closing, BaseChatModel):
    """A LangChain chat model whose calls pass a ringzero LLM gate."""

    model_config = ConfigDict(arbitrary_types_allowed=True)
    _ringzero_journaled: ClassVar[bool] = True  # inside a process its calls are ctx.llm syscalls (see _unseen)

    gate: LLMGate | None = Field(default=None, description="the gate calls pass outside a kernel process")
    kernel_provider: str = "default"
    model: str | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    priority: int = 10
    _owns_gate: bool = PrivateAttr(default=False)

    def __init__(self, provider: LLMProvider | LLMGate | None = None, **kwargs: Any) -> None:
        """Inside a kernel process every call is ``ctx.llm`` (journaled, budgeted, through the
        kernel's gate named ``kernel_provider``); outside one, it passes ``provider``'s gate
        (a provider gets a gate of its own, which ``close()`` closes; a gate given is the
        caller's to close). Sync and async calls, from any thread or loop, run on the gate's
        one loop (see ``ringzero.core.support.loops``)."""
        gate = provider if isinstance(provider, LLMGate) or provider is None else LLMGate(provider)
        super().__init__(gate=gate, **kwargs)  # type: ignore[call-arg]  # pydantic fields as keywords
        self._owns_gate = gate is not None and gate is not provider

    def close(self) -> None:
        """Close the gate this model made (its private loop thread and connections)."""
        if self._owns_gate and self.gate is not None:
            self.gate.close()

    async def aclose(self) -> None:
        if self._owns_gate and self.gate is not None:
            await self.gate.aclose()

    @property
    def _llm_type(self) -> str:
        return "ringzero"

    def bind_tools(self, tools: Sequence[Any], **kwargs: Any) -> Any:
        """Offer these tools (LangChain tools, functions or schemas) to the model."""
        return self.bind(tools=[convert_to_openai_tool(t) for t in tools], **kwargs)

    def _request(self, messages: list[BaseMessage], stop: list[str] | None, **kwargs: Any) -> LLMRequest:
        return LLMRequest(
            messages=tuple(from_langchain(m) for m in messages),
            tools=tuple(_schema(t) for t in kwargs.get("tools") or ()),
            model=kwargs.get("model", self.model), max_tokens=kwargs.get("max_tokens", self.max_tokens),
            temperature=kwargs.get("temperature", self.temperature), stop=tuple(stop or ()),
        )

    def _check(self) -> None:
        """Refuse a call that cannot be made, before anything is sent."""
        ctx = Context.current()
        if ctx is not None:
            refuse_persistent_checkpointer(ctx.pid)  # here, where the graph's config is the current one
        elif self.gate is None:
            raise errors.NoProvider("KernelChatModel has no provider and is not running inside a kernel process")

    async def _respond(self, request: LLMRequest, on_text: TextSink | None = None) -> LLMResponse:
        """The answer: inside a kernel process a ``ctx.llm`` syscall, outside one through the gate."""

        async def in_process(ctx: Context) -> LLMResponse:
            return await ctx.llm(list(request.messages), tools=request.tools, model=request.model,
                                 max_tokens=request.max_tokens, temperature=request.temperature,
                                 stop=request.stop, provider=self.kernel_provider, on_text=on_text)

        async def elsewhere() -> LLMResponse:
            assert self.gate is not None
            return await self.gate.complete(request, priority=self.priority, on_text=on_text)  # on its own loop

        return await route(in_process, elsewhere)

    async def _agenerate(self, messages: list[BaseMessage], stop: list[str] | None = None,
                         run_manager: AsyncCallbackManagerForLLMRun | None = None, **kwargs: Any) -> ChatResult:
        self._check()
        response = await self._respond(self._request(messages, stop, **kwargs))
        reply = to_langchain(response.message)
        assert isinstance(reply, AIMessage)
        reply.usage_metadata = _usage(response)
        reply.response_metadata = _metadata(response)
        return ChatResult(generations=[ChatGeneration(message=reply)])

    def _generate(self, messages: list[BaseMessage], stop: list[str] | None = None,
                  run_manager: CallbackManagerForLLMRun | None = None, **kwargs: Any) -> ChatResult:
        if Context.current() is None and self.gate is None:
            raise errors.NoProvider("KernelChatModel has no provider and is not running inside a kernel process")
        return route_sync(lambda ctx: self._agenerate(messages, stop, **kwargs),
                          lambda: self._agenerate(messages, stop, **kwargs), lambda: self._gate_home(),
                          "KernelChatModel.invoke")

    async def _astream(self, messages: list[BaseMessage], stop: list[str] | None = None,
                       run_manager: AsyncCallbackManagerForLLMRun | None = None,
                       **kwargs: Any) -> AsyncIterator[ChatGenerationChunk]:
        """The answer's text as the provider streams it, then a last chunk with the tool calls,
        usage and any text not streamed: all of it where the call was replayed from the journal
        or the provider does not stream."""
        self._check()
        request = self._request(messages, stop, **kwargs)
        pieces: asyncio.Queue[str | None] = asyncio.Queue()
        call = asyncio.ensure_future(self._respond(request, on_this_loop(pieces.put_nowait)))
        call.add_done_callback(lambda _: pieces.put_nowait(None))
        streamed: list[str] = []
        try:
            while (piece := await pieces.get()) is not None:
                streamed.append(piece)
                yield ChatGenerationChunk(message=AIMessageChunk(content=piece))
            yield _last_chunk(await call, "".join(streamed))
        finally:
            if not call.done():
                call.cancel()

    def _stream(self, messages: list[BaseMessage], stop: list[str] | None = None,
                run_manager: CallbackManagerForLLMRun | None = None, **kwargs: Any) -> Iterator[ChatGenerationChunk]:
        """``_astream`` for sync callers: the call runs where ``invoke``'s would, from a helper
        thread, and its text comes to this thread as it arrives."""
        if running_loop() is not None:  # blocking here would block the loop the call may need
            result = self._generate(messages, stop, **kwargs)  # raises WrongEventLoop where it must
            yield ChatGenerationChunk(message=_as_chunk(result.generations[0].message))
            return
        self._check()
        request = self._request(messages, stop, **kwargs)
        pieces: queue.SimpleQueue[str | None] = queue.SimpleQueue()
        answer: list[LLMResponse | BaseException] = []

        def call() -> None:
            try:
                answer.append(route_sync(lambda ctx: self._respond(request, pieces.put),
                                         lambda: self._respond(request, pieces.put), lambda: self._gate_home(),
                                         "KernelChatModel.stream"))
            except BaseException as exc:  # handed to the caller's thread below
                answer.append(exc)
            finally:
                pieces.put(None)

        helper = threading.Thread(target=contextvars.copy_context().run, args=(call,), daemon=True,
                                  name="ringzero-chat-stream")
        helper.start()
        streamed: list[str] = []
        while (piece := pieces.get()) is not None:
            streamed.append(piece)
            yield ChatGenerationChunk(message=AIMessageChunk(content=piece))
        helper.join()
        if isinstance(answer[0], BaseException):
            raise answer[0]
        yield _last_chunk(answer[0], "".join(streamed))

    def _gate_home(self) -> LoopHome:
        assert self.gate is not None
        return self.gate.home


def _usage(response: LLMResponse) -> Any:
    usage = response.usage
    return {"input_tokens": usage.input_tokens, "output_tokens": usage.output_tokens,
            "total_tokens": usage.total_tokens}


def _metadata(response: LLMResponse) -> dict[str, Any]:
    return {"stop_reason": response.stop_reason, "model_name": response.model}


def _last_chunk(response: LLMResponse, streamed: str) -> ChatGenerationChunk:
    """The chunk that ends a stream: the text not streamed yet, the tool calls, usage and metadata."""
    content = response.content
    rest = content[len(streamed):] if content.startswith(streamed) else ""
    calls = [tool_call_chunk(name=c.name, args=json.dumps(c.arguments), id=c.id, index=i)
             for i, c in enumerate(response.tool_calls)]
    return ChatGenerationChunk(message=AIMessageChunk(
        content=rest, tool_call_chunks=calls, usage_metadata=_usage(response),
        response_metadata=_metadata(response), chunk_position="last"))


def _as_chunk(message: BaseMessage) -> AIMessageChunk:
    assert isinstance(message, AIMessage)
    return AIMessageChunk(content=message.content, tool_call_chunks=[
        tool_call_chunk(name=c["name"], args=json.dumps(c["args"]), id=c["id"], index=i)
        for i, c in enumerate(message.tool_calls)], usage_metadata=message.usage_metadata,
        response_metadata=message.response_metadata, chunk_position="last")


class ChatModelProvider:
    """Any LangChain chat model as a ringzero LLMProvider; it streams through the model's own
    ``astream`` (a model that does not stream answers in one piece)."""

    capabilities = ProviderCapabilities(tool_calls=True, streaming=True, counts_tokens=True)

    def __init__(self, chat_model: BaseChatModel) -> None:
        self.chat_model = chat_model

    async def complete(self, request: LLMRequest) -> LLMResponse:
        model, messages, kwargs = self._call(request)
        try:
            reply = await model.ainvoke(messages, **kwargs)
        except Exception as exc:
            raise error_of_exception(exc, "the chat model") from exc
        return self._response(reply)

    async def stream(self, request: LLMRequest, on_text: TextSink) -> LLMResponse:
        model, messages, kwargs = self._call(request)
        whole: Any = None
        try:
            async for chunk in model.astream(messages, **kwargs):
                text = str(chunk.text)
                if text:
                    on_text(text)
                whole = chunk if whole is None else whole + chunk
        except Exception as exc:
            raise error_of_exception(exc, "the chat model") from exc
        if whole is None:
            raise errors.ProviderUnavailable("the chat model's stream ended without an answer")
        return self._response(whole)

    def _call(self, request: LLMRequest) -> tuple[Any, list[BaseMessage], dict[str, Any]]:
        model: Any = self.chat_model
        if request.tools:
            model = model.bind_tools([{"type": "function", "function": t.to_dict()} for t in request.tools])
        kwargs: dict[str, Any] = {"stop": list(request.stop)} if request.stop else {}
        return model, [to_langchain(m) for m in request.messages], kwargs

    @staticmethod
    def _response(reply: Any) -> LLMResponse:
        usage = getattr(reply, "usage_metadata", None) or {}
        metadata = getattr(reply, "response_metadata", None) or {}  # the vendor's words, as its integration kept them
        message = from_langchain(reply)
        return LLMResponse(message=message, usage=Usage(int(usage.get("input_tokens", 0)),
                                                        int(usage.get("output_tokens", 0))),
                           stop_reason=stop_reason_of(metadata.get("finish_reason") or metadata.get("stop_reason"),
                                                      tool_calls=bool(message.tool_calls)),
                           model=metadata.get("model_name"))
