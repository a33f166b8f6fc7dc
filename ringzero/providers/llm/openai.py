"""``OpenAIProvider``: any server that speaks OpenAI's chat completions API.

OpenAI itself, Azure OpenAI's v1 endpoint, vLLM, Ollama, llama.cpp, LiteLLM: anything with
``POST {base_url}/chat/completions``. Plain httpx, no SDK: the request and answer are mapped
field by field, tool calls both ways, usage from the server's own count, and failures become
the kernel's typed errors (429 with ``Retry-After`` is ``RateLimited``, a context overflow
``ContextTooLong``, 5xx or no answer ``ProviderUnavailable``).

    OpenAIProvider("gpt-4o-mini")                                  # OPENAI_API_KEY from the environment
    OpenAIProvider("qwen2.5", base_url="http://127.0.0.1:11434/v1")  # Ollama: no key needed
"""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ringzero.core.contract.errors import InvalidArgument, ProviderUnavailable
from ringzero.core.contract.llm_types import stop_reason_of
from ringzero.core.contract.protocols import ProviderCapabilities, TextSink
from ringzero.core.contract.tokens import MESSAGE_FRAMING
from ringzero.core.contract.types import JSON, LLMRequest, LLMResponse, Message, ToolCall, Usage
from ringzero.providers.llm._client import ClientPerLoop
from ringzero.providers.llm._http import event_json, post_events, post_json

__all__ = ["OpenAIProvider"]

OFFICIAL_URL = "https://api.openai.com/v1"
VENDOR = "the OpenAI server"


class OpenAIProvider:
    """An LLMProvider for OpenAI-compatible chat completion servers.

    ``base_url`` defaults to ``OPENAI_BASE_URL`` or OpenAI's own; ``api_key`` to
    ``OPENAI_API_KEY`` (servers on your own machine usually need none). OpenAI's own server
    takes the output limit as ``max_completion_tokens``, others as ``max_tokens``;
    ``max_tokens_field`` overrides that choice. ``headers`` are sent with every request
    (e.g. ``{"api-key": ...}`` for Azure).
    """

    provider_name = "openai"
    """``gen_ai.provider.name`` on this provider's spans (OpenTelemetry GenAI conventions)."""

    capabilities = ProviderCapabilities(tool_calls=True, streaming=True, counts_tokens=True)

    def __init__(self, model: str, base_url: str | None = None, api_key: str | None = None, *,
                 timeout: float = 120.0, headers: Mapping[str, str] | None = None,
                 max_tokens_field: str | None = None) -> None:
        if not isinstance(model, str) or not model:
            raise InvalidArgument(f"OpenAIProvider needs a model name, not {model!r}")
        self.model = model
        self.base_url = (base_url or os.environ.get("OPENAI_BASE_URL") or OFFICIAL_URL).rstrip("/")
        self.api_key = api_key if api_key is not None else os.environ.get("OPENAI_API_KEY")
        if self.base_url == OFFICIAL_URL and not self.api_key and not headers:
            raise InvalidArgument("OpenAIProvider for api.openai.com needs an API key: pass api_key= or set "
                                  "OPENAI_API_KEY (servers on your own machine take base_url= and no key)")
        official = self.base_url == OFFICIAL_URL
        self.max_tokens_field = max_tokens_field or ("max_completion_tokens" if official else "max_tokens")
        self.headers = {**({"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}), **(headers or {})}
        self._clients = ClientPerLoop(timeout)
        self.count_tokens: Callable[[Sequence[Message]], int] | None = _tokenizer(model)
        """OpenAI's own tokenizer for this model when ``ringzero[tokenizers]`` is installed (None
        otherwise, and the kernel estimates): content tokens plus four a message for its framing."""

    async def complete(self, request: LLMRequest) -> LLMResponse:
        url = f"{self.base_url}/chat/completions"
        data = await post_json(self._clients.get(), url, self.headers, self.payload(request), VENDOR)
        return self.parse(data, request)

    async def stream(self, request: LLMRequest, on_text: TextSink) -> LLMResponse:
        """``complete``, with the answer's text handed to ``on_text`` as its chunks arrive.

        Asks for the usage in a last chunk (``stream_options.include_usage``), so the gate
        counts the server's own tokens as for a whole answer."""
        url = f"{self.base_url}/chat/completions"
        body = {**self.payload(request), "stream": True, "stream_options": {"include_usage": True}}
        answer = _Chunks()
        async for _event, data in post_events(self._clients.get(), url, self.headers, body, VENDOR):
            if data.strip() == "[DONE]":
                break
            text = answer.add(event_json(data, VENDOR))
            if text:
                on_text(text)
        return self.parse(answer.whole(), request)

    async def aclose(self) -> None:
        await self._clients.aclose()

    # ------------------------------------------------------------------ wire format
    def payload(self, request: LLMRequest) -> dict[str, Any]:
        """The chat completions request body for ``request``."""
        body: dict[str, Any] = {"model": request.model or self.model,
                                "messages": [_wire_message(m) for m in request.messages]}
        if request.tools:
            body["tools"] = [{"type": "function", "function": {"name": t.name, "description": t.description,
                                                               "parameters": t.parameters}} for t in request.tools]
        if request.max_tokens is not None:
            body[self.max_tokens_field] = request.max_tokens
        if request.temperature is not None:
            body["temperature"] = request.temperature
        if request.stop:
            body["stop"] = list(request.stop)
        return body

    def parse(self, data: dict[str, Any], request: LLMRequest) -> LLMResponse:
        """The kernel's LLMResponse for a chat completions answer."""
        choices = data.get("choices")
        if not choices or not isinstance(choices[0], dict) or "message" not in choices[0]:
            raise ProviderUnavailable(f"the OpenAI server answered without a choice: {json.dumps(data)[:300]}")
        choice = choices[0]
        wire = choice["message"] or {}
        calls = tuple(_tool_call(c) for c in wire.get("tool_calls") or ())
        usage = data.get("usage") or {}
        return LLMResponse(
            message=Message("assistant", _text(wire.get("content")), tool_calls=calls),
            usage=Usage(int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0)),
            stop_reason=stop_reason_of(choice.get("finish_reason"), tool_calls=bool(calls)),
            model=data.get("model") or request.model or self.model,
            id=str(data["id"]) if data.get("id") else None,
        )


class _Chunks:
    """A streamed answer's chunks, put back together as the whole answer the server would have sent."""

    def __init__(self) -> None:
        self.head: dict[str, Any] = {}
        self.text: list[str] = []
        self.calls: dict[int, dict[str, Any]] = {}
        self.finish: str | None = None
        self.usage: dict[str, Any] | None = None

    def add(self, chunk: dict[str, Any]) -> str:
        """Take in one chunk; the text it adds to the answer."""
        if "error" in chunk:  # a server that fails mid-answer says so in a chunk of its own
            raise ProviderUnavailable(f"{VENDOR} failed mid-answer: {json.dumps(chunk['error'])[:300]}")
        for key in ("id", "model", "created"):
            if chunk.get(key) is not None:
                self.head.setdefault(key, chunk[key])
        if chunk.get("usage"):
            self.usage = chunk["usage"]
        text = ""
        for choice in chunk.get("choices") or ():
            if choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta") or {}
            text = _text(delta.get("content"))
            if text:
                self.text.append(text)
            for part in delta.get("tool_calls") or ():
                call = self.calls.setdefault(int(part.get("index", len(self.calls))),
                                             {"id": "", "type": "function", "function": {"name": "", "arguments": ""}})
                call["id"] = part.get("id") or call["id"]
                function = part.get("function") or {}
                call["function"]["name"] += function.get("name") or ""
                call["function"]["arguments"] += function.get("arguments") or ""
            self.finish = choice.get("finish_reason") or self.finish
        return text

    def whole(self) -> dict[str, Any]:
        if not self.head and not self.text and not self.calls:
            raise ProviderUnavailable(f"{VENDOR} ended its stream without an answer")
        message: dict[str, Any] = {"role": "assistant", "content": "".join(self.text)}
        if self.calls:
            message["tool_calls"] = [self.calls[i] for i in sorted(self.calls)]
        return {**self.head, "choices": [{"index": 0, "message": message, "finish_reason": self.finish or "stop"}],
                "usage": self.usage or {}}


def _tokenizer(model: str) -> Callable[[Sequence[Message]], int] | None:
    if importlib.util.find_spec("bpe_openai") is None:  # ringzero[tokenizers] is not installed
        return None
    newer = model.startswith(("gpt-4o", "gpt-4.1", "gpt-5", "o1", "o3", "o4", "chatgpt-4o"))
    name = "o200k_base" if newer else "cl100k_base"

    def count(messages: Sequence[Message]) -> int:
        encoding = _encoding(name)
        total = 0
        for message in messages:
            total += len(encoding.encode(message.content)) + MESSAGE_FRAMING
            total += sum(len(encoding.encode(c.name + json.dumps(c.arguments))) for c in message.tool_calls)
        return total

    return count


@functools.lru_cache(maxsize=4)
def _encoding(name: str) -> Any:
    with warnings.catch_warnings():  # bpe-openai 0.1.4 loads its tables with a deprecated importlib call
        warnings.simplefilter("ignore", DeprecationWarning)
        import bpe_openai

        return bpe_openai.get_encoding(name)


def _wire_message(message: Message) -> dict[str, Any]:
    if message.role == "tool":
        return {"role": "tool", "tool_call_id": message.tool_call_id, "content": message.content}
    out: dict[str, Any] = {"role": message.role, "content": message.content}
    if message.tool_calls:
        out["content"] = message.content or None
        out["tool_calls"] = [{"id": c.id, "type": "function",
                              "function": {"name": c.name, "arguments": json.dumps(c.arguments)}}
                             for c in message.tool_calls]
    return out


def _tool_call(wire: dict[str, Any]) -> ToolCall:
    function = wire.get("function") or {}
    raw = function.get("arguments") or "{}"
    arguments: dict[str, JSON]
    try:
        parsed = json.loads(raw) if isinstance(raw, str) else raw
        arguments = parsed if isinstance(parsed, dict) else {"value": parsed}
    except ValueError:
        # The model wrote arguments that are not JSON; the tool gets them as they are and its
        # error goes back to the model, which can try again (the call is not lost).
        arguments = {"_unparsed_arguments": raw}
    return ToolCall(str(wire.get("id") or ""), str(function.get("name") or ""), arguments)


def _text(content: Any) -> str:
    """Message content as text (some servers send a list of parts)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "".join(part.get("text", "") for part in content if isinstance(part, dict))
