"""The LLM kit's scenarios acted out by its own servers, in OpenAI's and Anthropic's wire
formats (``ringzero.compat.vendor_servers``), for a provider that speaks either: the kit then
judges it against the vendor's real answers and error bodies, not a fake the implementer wrote.
"""

from __future__ import annotations

import dataclasses
import socket
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from ringzero.compat.vendor_servers import (
    Reply,
    Stream,
    Vendor,
    anthropic_answer,
    anthropic_error,
    anthropic_stream,
    openai_answer,
    openai_error,
    openai_stream,
    vendor_server,
)

__all__ = ["SLOW_SECONDS", "scenario_reply", "scenario_server", "vendor_error"]

SLOW_SECONDS = 2.0
"""How long the ``timeout`` scenario's server waits before it answers: give the provider a
timeout well under it."""


def _last_text(body: dict[str, Any]) -> str:
    """The text of the request's last message, in either vendor's shape (a tool result's text too)."""
    last = body["messages"][-1]
    content = last.get("content")
    if isinstance(content, str):
        return content
    block = content[-1]
    inner = block.get("content", block.get("text", ""))
    return inner if isinstance(inner, str) else "".join(part.get("text", "") for part in inner)


def vendor_error(vendor: Vendor, kind: str, headers: dict[str, str] | None = None) -> Reply:
    """The vendor's own error answer for ``kind``: ``rate_limited`` (429), ``server_error``
    (OpenAI's 503, Anthropic's 529 overload), ``context_overflow``, ``auth_failed`` (401) or
    ``forbidden`` (403), with ``headers``."""
    if vendor == "openai":
        status, message, kind_name, code = {
            "rate_limited": (429, "Rate limit reached for requests", "requests", "rate_limit_exceeded"),
            "server_error": (503, "The server is overloaded or not ready yet.", "server_error", None),
            "context_overflow": (400, "This model's maximum context length is 128000 tokens. However, your messages "
                                 "resulted in 130000 tokens.", "invalid_request_error", "context_length_exceeded"),
            "auth_failed": (401, "Incorrect API key provided: sk-test.", "invalid_request_error", "invalid_api_key"),
            "forbidden": (403, "Project does not have access to model gpt-test", "invalid_request_error",
                          "model_not_found"),
        }[kind]
        return openai_error(status, message, kind_name, code, headers)
    status, kind_name, message = {
        "rate_limited": (429, "rate_limit_error", "Number of request tokens has exceeded your rate limit"),
        "server_error": (529, "overloaded_error", "Overloaded"),
        "context_overflow": (400, "invalid_request_error", "prompt is too long: 210000 tokens > 200000 maximum"),
        "auth_failed": (401, "authentication_error", "invalid x-api-key"),
        "forbidden": (403, "permission_error", "Your API key does not have permission to use the specified "
                      "resource."),
    }[kind]
    return anthropic_error(status, kind_name, message, headers)


def _whole(vendor: Vendor, scenario: str) -> Reply:
    answer = openai_answer if vendor == "openai" else anthropic_answer
    if scenario == "answer":
        return answer("pong", usage=(11, 7))
    if scenario == "tool_call":
        call = [("call_1", "weather", {"city": "Paris"})]
        return openai_answer(None, call) if vendor == "openai" else anthropic_answer("", call)
    if scenario == "truncated":
        return (openai_answer("po", usage=(11, 7), finish="length") if vendor == "openai"
                else anthropic_answer("po", usage=(11, 7), stop="max_tokens"))
    if scenario == "timeout":
        return dataclasses.replace(answer("pong", usage=(11, 7)), delay=SLOW_SECONDS)
    if scenario == "rate_limited_retry_after":
        return vendor_error(vendor, "rate_limited", {"retry-after": "2"})
    return vendor_error(vendor, scenario)


def scenario_reply(vendor: Vendor, scenario: str) -> Reply | Callable[[dict[str, Any]], Reply | Stream]:
    """What the vendor's server answers in ``scenario`` (``ringzero.compat.llm.SCENARIOS``): a
    stream where the request asks for one (``answer``, ``tool_call``)."""
    stream = openai_stream if vendor == "openai" else anthropic_stream
    if scenario in ("answer", "tool_call"):
        whole = _whole(vendor, scenario)
        pieces = stream(["po", "ng"], usage=(11, 7)) if scenario == "answer" else \
            stream([], [("call_1", "weather", {"city": "Paris"})])
        return lambda body: pieces if body.get("stream") else whole
    if scenario == "echo":
        answer = openai_answer if vendor == "openai" else anthropic_answer
        return lambda body: answer(_last_text(body))
    return _whole(vendor, scenario)


@contextmanager
def scenario_server(vendor: Vendor, scenario: str, answers: int = 1) -> Iterator[str]:
    """The base URL of a server on 127.0.0.1 acting out ``scenario`` in ``vendor``'s wire format
    for ``answers`` requests (a client that retries a refusal itself needs more); for
    ``unreachable``, the URL of a port nothing listens on."""
    if scenario == "unreachable":
        with socket.socket() as probe:  # a port the system just handed out and nobody holds now
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        yield f"http://127.0.0.1:{port}" + ("/v1" if vendor == "openai" else "")
        return
    with vendor_server(vendor, [scenario_reply(vendor, scenario)] * answers) as server:
        yield server.url
