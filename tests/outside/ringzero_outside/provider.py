"""An LLM provider of this package's own, for any OpenAI-compatible chat completions server,
written with httpx from the LLMProvider protocol's docstring."""

from __future__ import annotations

import json
from typing import Any

import httpx

from ringzero import (
    AuthenticationFailed,
    BadRequest,
    ContextTooLong,
    LLMRequest,
    LLMResponse,
    Message,
    ProviderCapabilities,
    ProviderError,
    ProviderUnavailable,
    RateLimited,
    ToolCall,
    Usage,
)

STOP_REASONS = {"stop": "end_turn", "tool_calls": "tool_use", "length": "max_tokens"}


class ChatCompletions:
    """``complete`` as one POST to ``{base_url}/chat/completions``."""

    capabilities = ProviderCapabilities(tool_calls=True)

    def __init__(self, base_url: str, model: str = "gpt-test", api_key: str = "sk-test", timeout: float = 30.0) -> None:
        self.model = model
        self.client = httpx.AsyncClient(base_url=base_url, timeout=timeout,
                                        headers={"authorization": f"Bearer {api_key}"})

    async def complete(self, request: LLMRequest) -> LLMResponse:
        body: dict[str, Any] = {"model": request.model or self.model,
                                "messages": [self.wire_message(m) for m in request.messages]}
        if request.tools:
            body["tools"] = [{"type": "function", "function": {"name": t.name, "description": t.description,
                                                               "parameters": t.parameters}} for t in request.tools]
        try:
            response = await self.client.post("/chat/completions", json=body)
        except (httpx.TimeoutException, httpx.TransportError) as exc:
            raise self.unreachable(exc) from None
        if response.status_code >= 400:
            raise self.error_for(response)
        data = response.json()
        choice = data["choices"][0]
        wire = choice["message"]
        calls = tuple(ToolCall(c["id"], c["function"]["name"], json.loads(c["function"]["arguments"] or "{}"))
                      for c in wire.get("tool_calls") or ())
        usage = data.get("usage") or {}
        finish = choice.get("finish_reason") or "stop"
        return LLMResponse(Message("assistant", wire.get("content") or "", tool_calls=calls),
                           Usage(usage.get("prompt_tokens", 0), usage.get("completion_tokens", 0)),
                           STOP_REASONS.get(finish, finish), data.get("model"))

    @staticmethod
    def wire_message(message: Message) -> dict[str, Any]:
        wire: dict[str, Any] = {"role": message.role, "content": message.content}
        if message.tool_calls:
            wire["tool_calls"] = [{"id": c.id, "type": "function",
                                   "function": {"name": c.name, "arguments": json.dumps(c.arguments)}}
                                  for c in message.tool_calls]
        if message.role == "tool":
            wire["tool_call_id"] = message.tool_call_id
        return wire

    def unreachable(self, exc: Exception) -> ProviderError:
        """The server could not be reached, or did not answer in time."""
        return ProviderUnavailable(f"{type(exc).__name__}: {exc}")

    def error_for(self, response: httpx.Response) -> ProviderError:
        """The typed error for a refusal, from its status and the vendor's error body."""
        try:
            error = response.json().get("error") or {}
        except ValueError:
            error = {}
        text = f"HTTP {response.status_code}: {error.get('message', response.text[:200])}"
        status = response.status_code
        if status == 429:
            after = response.headers.get("retry-after")
            return RateLimited(text, retry_after=float(after) if after else None)
        if status in (401, 403):
            return AuthenticationFailed(text)
        if status >= 500:
            return ProviderUnavailable(text)
        if error.get("code") == "context_length_exceeded":
            return ContextTooLong(text)
        return BadRequest(text)

    async def aclose(self) -> None:
        await self.client.aclose()
