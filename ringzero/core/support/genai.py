"""The OpenTelemetry GenAI semantic conventions' shapes for what a model call carries.

The conventions name finish reasons their own way (``stop``, ``length``, ``tool_call``,
``content_filter``), record messages as a role and a list of typed parts (``text``,
``tool_call``, ``tool_call_response``), an output message with its ``finish_reason``, and the
server a client called as ``server.address`` and ``server.port``. This module turns ringzero's
records into those shapes; ``telemetry`` puts them on spans.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any
from urllib.parse import urlsplit

__all__ = ["FINISH_REASONS", "finish_reason", "input_messages", "output_messages", "provider_name", "server_of"]

FINISH_REASONS = {
    "end_turn": "stop", "stop_sequence": "stop", "stop": "stop", "max_tokens": "length", "length": "length",
    "tool_use": "tool_call", "tool_calls": "tool_call", "refusal": "content_filter", "content_filter": "content_filter",
}
"""A response's stop reason (ringzero's, the Anthropic API's) as the GenAI conventions name it
(``stop``, ``length``, ``tool_call``, ``content_filter``); a reason they do not name passes as it is."""

_DEFAULT_PORTS = {"https": 443, "http": 80}


def finish_reason(stop_reason: object) -> str:
    reason = str(stop_reason)
    return FINISH_REASONS.get(reason, reason)


def provider_name(provider: Any) -> str:
    """``gen_ai.provider.name`` of an LLM provider: its ``provider_name``, else its class's name."""
    return str(getattr(provider, "provider_name", None) or type(provider).__name__)


def server_of(provider: Any) -> dict[str, Any]:
    """``server.address`` and ``server.port`` of a provider that calls a server at ``base_url``
    (the scheme's port where the URL names none); nothing for one that calls no server."""
    base_url = getattr(provider, "base_url", None)
    if not isinstance(base_url, str):
        return {}
    parts = urlsplit(base_url)
    if not parts.hostname:
        return {}
    port = parts.port or _DEFAULT_PORTS.get(parts.scheme)
    return {"server.address": parts.hostname, **({"server.port": port} if port else {})}


def _parts(message: Mapping[str, Any]) -> list[dict[str, Any]]:
    if message.get("role") == "tool":
        return [{"type": "tool_call_response", "id": message.get("tool_call_id"), "response": message.get("content")}]
    parts: list[dict[str, Any]] = []
    if message.get("content"):
        parts.append({"type": "text", "content": message["content"]})
    parts += [{"type": "tool_call", "id": call.get("id"), "name": call.get("name"), "arguments": call.get("arguments")}
              for call in message.get("tool_calls") or ()]
    return parts


def input_messages(messages: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """``gen_ai.input.messages``: each message (as ``Message.to_dict`` writes it) as a role and parts."""
    return [{"role": m.get("role"), "parts": _parts(m), **({"name": m["name"]} if m.get("name") else {})}
            for m in messages]


def output_messages(message: Mapping[str, Any], stop_reason: object) -> list[dict[str, Any]]:
    """``gen_ai.output.messages``: the answer as a role, parts and the conventions' finish reason."""
    return [{"role": message.get("role", "assistant"), "parts": _parts(message),
             "finish_reason": finish_reason(stop_reason)}]
