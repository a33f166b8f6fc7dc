"""``AnthropicProvider``: Anthropic's Messages API (``POST /v1/messages``) over httpx.

The kernel's messages map onto Anthropic's shape: system messages become the ``system``
field, an assistant's tool calls become ``tool_use`` blocks, tool results become
``tool_result`` blocks in a user turn (consecutive results share one turn, as the API
requires), and turns of the same role are merged. Failures become the kernel's typed errors:
429 ``RateLimited`` with its ``retry-after``, 529 "overloaded" and 5xx ``ProviderUnavailable``,
"prompt is too long" ``ContextTooLong``.

    AnthropicProvider("claude-sonnet-4-5")       # ANTHROPIC_API_KEY from the environment
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

from ringzero.core.contract.errors import InvalidArgument, ProviderUnavailable
from ringzero.core.contract.llm_types import stop_reason_of
from ringzero.core.contract.protocols import ProviderCapabilities, TextSink
from ringzero.core.contract.types import LLMRequest, LLMResponse, Message, ToolCall, Usage
from ringzero.providers.llm._client import ClientPerLoop
from ringzero.providers.llm._http import event_json, post_events, post_json, provider_error

__all__ = ["AnthropicProvider"]

OFFICIAL_URL = "https://api.anthropic.com"
API_VERSION = "2023-06-01"
_ERROR_STATUS = {"invalid_request_error": 400, "authentication_error": 401, "permission_error": 403,
                 "not_found_error": 404, "request_too_large": 413, "rate_limit_error": 429, "api_error": 500,
                 "overloaded_error": 529}
"""The HTTP status each of Anthropic's error types stands for, for an error sent mid-stream."""


class AnthropicProvider:
    """An LLMProvider for Anthropic's Messages API.

    ``base_url`` defaults to ``ANTHROPIC_BASE_URL`` or Anthropic's own; ``api_key`` to
    ``ANTHROPIC_API_KEY``. The API requires an output limit: ``max_tokens`` is used when a
    request sets none.
    """

    provider_name = "anthropic"
    """``gen_ai.provider.name`` on this provider's spans (OpenTelemetry GenAI conventions)."""

    capabilities = ProviderCapabilities(tool_calls=True, streaming=True, counts_tokens=True)

    def __init__(self, model: str, base_url: str | None = None, api_key: str | None = None, *,
                 max_tokens: int = 4096, timeout: float = 120.0, headers: Mapping[str, str] | None = None) -> None:
        if not isinstance(model, str) or not model:
            raise InvalidArgument(f"AnthropicProvider needs a model name, not {model!r}")
        if not isinstance(max_tokens, int) or max_tokens < 1:
            raise InvalidArgument(f"max_tokens must be a positive integer, not {max_tokens!r}")
        self.model = model
        self.base_url = (base_url or os.environ.get("ANTHROPIC_BASE_URL") or OFFICIAL_URL).rstrip("/")
        self.api_key = api_key if api_key is not None else os.environ.get("ANTHROPIC_API_KEY")
        if not self.api_key:
            raise InvalidArgument("AnthropicProvider needs an API key: pass api_key= or set ANTHROPIC_API_KEY")
        self.max_tokens = max_tokens
        self.headers = {"x-api-key": self.api_key, "anthropic-version": API_VERSION, **(headers or {})}
        self._clients = ClientPerLoop(timeout)

    async def complete(self, request: LLMRequest) -> LLMResponse:
        url = f"{self.base_url}/v1/messages"
        data = await post_json(self._clients.get(), url, self.headers, self.payload(request), "Anthropic")
        return self.parse(data, request)

    async def stream(self, request: LLMRequest, on_text: TextSink) -> LLMResponse:
        """``complete``, with the answer's text handed to ``on_text`` as its deltas arrive."""
        url = f"{self.base_url}/v1/messages"
        answer = _Events()
        async for event, data in post_events(self._clients.get(), url, self.headers,
                                             {**self.payload(request), "stream": True}, "Anthropic"):
            text = answer.add(event, event_json(data, "Anthropic"))
            if text:
                on_text(text)
        return self.parse(answer.whole(), request)

    async def aclose(self) -> None:
        await self._clients.aclose()

    # ------------------------------------------------------------------ wire format
    def payload(self, request: LLMRequest) -> dict[str, Any]:
        """The Messages API request body for ``request``."""
        body: dict[str, Any] = {"model": request.model or self.model,
                                "max_tokens": request.max_tokens or self.max_tokens,
                                "messages": _turns(request.messages)}
        system = "\n\n".join(m.content for m in request.messages if m.role == "system" and m.content)
        if system:
            body["system"] = system
        if request.tools:
            body["tools"] = [{"name": t.name, "description": t.description, "input_schema": t.parameters}
                             for t in request.tools]
        if request.temperature is not None:
            body["temperature"] = request.temperature
        if request.stop:
            body["stop_sequences"] = list(request.stop)
        return body

    def parse(self, data: dict[str, Any], request: LLMRequest) -> LLMResponse:
        """The kernel's LLMResponse for a Messages API answer."""
        blocks = data.get("content")
        if data.get("type") != "message" or not isinstance(blocks, list):
            raise ProviderUnavailable(f"Anthropic answered with something other than a message: "
                                      f"{json.dumps(data)[:300]}")
        text = "".join(b.get("text", "") for b in blocks if b.get("type") == "text")
        calls = tuple(ToolCall(str(b["id"]), str(b["name"]), dict(b.get("input") or {}))
                      for b in blocks if b.get("type") == "tool_use")
        # Blocks the message fields cannot hold (thinking, redacted_thinking, server tool use)
        # are kept, with the whole turn in order, so that the next request sends them back.
        kept = tuple(dict(b) for b in blocks) if any(
            isinstance(b, dict) and b.get("type") not in ("text", "tool_use") for b in blocks) else ()
        usage = data.get("usage") or {}
        read = sum(int(usage.get(k) or 0) for k in ("input_tokens", "cache_creation_input_tokens",
                                                    "cache_read_input_tokens"))
        return LLMResponse(
            message=Message("assistant", text, tool_calls=calls, blocks=kept),
            usage=Usage(read, int(usage.get("output_tokens") or 0)),
            stop_reason=stop_reason_of(data.get("stop_reason"), tool_calls=bool(calls)),
            model=data.get("model") or request.model or self.model,
            id=str(data["id"]) if data.get("id") else None,
        )


class _Events:
    """A streamed message's events, put back together as the message the API would have sent whole."""

    def __init__(self) -> None:
        self.message: dict[str, Any] = {}
        self.blocks: dict[int, dict[str, Any]] = {}
        self.json: dict[int, list[str]] = {}
        self.ended = False

    def add(self, event: str, data: dict[str, Any]) -> str:
        """Take in one event; the text it adds to the answer."""
        kind = data.get("type", event)
        if kind == "error":
            error = data.get("error") or {}
            status = _ERROR_STATUS.get(str(error.get("type")), 500)
            raise provider_error(status, {}, json.dumps(data), "Anthropic (mid-stream)")
        if kind == "message_start":
            self.message = dict(data.get("message") or {})
        elif kind == "content_block_start":
            self.blocks[int(data["index"])] = dict(data.get("content_block") or {})
        elif kind == "content_block_delta":
            block, delta = self.blocks.setdefault(int(data["index"]), {"type": "text", "text": ""}), data["delta"]
            step = delta.get("type")
            if step == "text_delta":
                block["text"] = block.get("text", "") + delta["text"]
                return str(delta["text"])
            if step == "input_json_delta":
                self.json.setdefault(int(data["index"]), []).append(delta.get("partial_json", ""))
            elif step == "thinking_delta":
                block["thinking"] = block.get("thinking", "") + delta.get("thinking", "")
            elif step == "signature_delta":
                block["signature"] = block.get("signature", "") + delta.get("signature", "")
        elif kind == "message_delta":
            self.message.update({k: v for k, v in (data.get("delta") or {}).items() if v is not None})
            self.message["usage"] = {**(self.message.get("usage") or {}), **(data.get("usage") or {})}
        elif kind == "message_stop":
            self.ended = True
        return ""

    def whole(self) -> dict[str, Any]:
        if not self.message or not self.ended:
            raise ProviderUnavailable("Anthropic's stream ended before its message_stop")
        for index, parts in self.json.items():
            try:
                self.blocks[index]["input"] = json.loads("".join(parts) or "{}")
            except ValueError as exc:
                raise ProviderUnavailable(f"Anthropic streamed tool input that is not JSON: {''.join(parts)[:200]!r}"
                                          ) from exc
        return {**self.message, "content": [self.blocks[i] for i in sorted(self.blocks)]}


def _turns(messages: tuple[Message, ...]) -> list[dict[str, Any]]:
    """User and assistant turns of content blocks, same-role neighbours merged."""
    turns: list[dict[str, Any]] = []
    for message in messages:
        if message.role == "system":
            continue
        role, blocks = _blocks(message)
        if not blocks:
            continue  # the API refuses empty turns and empty text blocks
        if turns and turns[-1]["role"] == role:
            turns[-1]["content"].extend(blocks)
        else:
            turns.append({"role": role, "content": blocks})
    return turns


def _blocks(message: Message) -> tuple[str, list[dict[str, Any]]]:
    if message.role == "tool":
        return "user", [{"type": "tool_result", "tool_use_id": message.tool_call_id, "content": message.content}]
    if message.role == "assistant" and message.blocks:
        return "assistant", [dict(b) for b in message.blocks]  # as the model sent them
    blocks: list[dict[str, Any]] = [{"type": "text", "text": message.content}] if message.content else []
    if message.role == "assistant":
        blocks += [{"type": "tool_use", "id": c.id, "name": c.name, "input": c.arguments} for c in message.tool_calls]
    return message.role, blocks
