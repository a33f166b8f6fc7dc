"""The records an LLM call is made of: messages, tool calls and schemas, requests, responses."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from ringzero.core.contract.errors import InvalidArgument
from ringzero.core.contract.json_data import JSON, canonical_json

Role = Literal["system", "user", "assistant", "tool"]

__all__ = ["LLMRequest", "LLMResponse", "Message", "Role", "ToolCall", "ToolSchema", "Usage", "coerce_messages",
           "stop_reason_of"]

_ascii = json.encoder.encode_basestring_ascii


@dataclass(frozen=True)
class ToolCall:
    """A model's request to call one tool."""

    id: str
    name: str
    arguments: dict[str, JSON] = field(default_factory=dict)


@dataclass(frozen=True)
class Message:
    """One chat message: system, user, assistant (maybe with tool calls) or a tool result."""

    role: Role
    content: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None
    name: str | None = None
    blocks: tuple[dict[str, JSON], ...] = field(default=(), compare=False)
    """The provider's own content blocks for this turn, as it sent them, where it sent some
    the fields above cannot hold (Anthropic's ``thinking``, ``redacted_thinking``, server tool
    results). A provider that reads them sends the turn back exactly so: a model that thinks
    between tool calls needs its thinking back. Others ignore them."""

    def __post_init__(self) -> None:
        if self.role not in ("system", "user", "assistant", "tool"):
            raise InvalidArgument(f"message role must be system, user, assistant or tool, not {self.role!r}")
        if not isinstance(self.content, str):
            raise InvalidArgument(f"message content must be a string, not {type(self.content).__name__}")
        if self.role == "tool" and not self.tool_call_id:
            raise InvalidArgument("a tool message needs the tool_call_id of the call it answers")

    def to_dict(self) -> dict[str, JSON]:
        out: dict[str, JSON] = {"role": self.role, "content": self.content}
        if self.tool_calls:
            out["tool_calls"] = [
                {"id": c.id, "name": c.name, "arguments": c.arguments} for c in self.tool_calls
            ]
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        if self.name is not None:
            out["name"] = self.name
        if self.blocks:
            out["blocks"] = [dict(b) for b in self.blocks]
        return out

    def canonical(self) -> str:
        """The message's canonical JSON (``canonical_json(self.to_dict())``), made once and kept
        on the message (it is immutable): a conversation sends the same messages again at every
        call, and each call's fingerprint holds them (``fingerprints.llm_fingerprint``). A
        message of a role and text alone (a prompt: a new one at every call that passes a
        string) is written by hand, its keys in canonical order. (Not a ``cached_property``,
        whose lock costs a microsecond at every call on Python 3.11.)"""
        made = self.__dict__.get("_canonical")
        if made is None:
            if not self.tool_calls and self.tool_call_id is None and self.name is None and not self.blocks:
                made = f'{{"content":{_ascii(self.content)},"role":{_ascii(self.role)}}}'
            else:
                made = canonical_json(self.to_dict())
            self.__dict__["_canonical"] = made
        return made

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Message:
        """Build a message from a plain ``{"role", "content", ...}`` dict."""
        if not isinstance(data, Mapping) or "role" not in data:
            raise InvalidArgument(f"a message must be a Message or a dict with a 'role', got {data!r}")
        calls = tuple(
            ToolCall(id=str(c["id"]), name=str(c["name"]), arguments=dict(c.get("arguments") or {}))
            for c in data.get("tool_calls") or ()
        )
        return cls(
            role=data["role"],
            content=data.get("content") or "",
            tool_calls=calls,
            tool_call_id=data.get("tool_call_id"),
            name=data.get("name"),
            blocks=tuple(dict(b) for b in data.get("blocks") or ()),
        )

    @classmethod
    def coerce(cls, value: Message | Mapping[str, Any]) -> Message:
        return value if isinstance(value, Message) else cls.from_dict(value)


@dataclass(frozen=True)
class ToolSchema:
    """A tool the model may call: its name, what it does and a JSON Schema of its arguments."""

    name: str
    description: str = ""
    parameters: dict[str, JSON] = field(default_factory=lambda: {"type": "object", "properties": {}})

    def to_dict(self) -> dict[str, JSON]:
        return {"name": self.name, "description": self.description, "parameters": self.parameters}


@dataclass(frozen=True)
class LLMRequest:
    """What a program asks of the model."""

    messages: tuple[Message, ...]
    tools: tuple[ToolSchema, ...] = ()
    model: str | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    stop: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, JSON]:
        return {
            "messages": [m.to_dict() for m in self.messages],
            "tools": [t.to_dict() for t in self.tools],
            "model": self.model,
            "max_tokens": self.max_tokens,
            "temperature": self.temperature,
            "stop": list(self.stop),
        }


@dataclass(frozen=True)
class Usage:
    """Tokens a call consumed, and its cost in dollars when the provider or gate knows it."""

    input_tokens: int = 0
    output_tokens: int = 0
    cost: float | None = None

    @property
    def total_tokens(self) -> int:
        return self.input_tokens + self.output_tokens

    def __add__(self, other: Usage) -> Usage:
        cost = None if self.cost is None and other.cost is None else (self.cost or 0.0) + (other.cost or 0.0)
        return Usage(self.input_tokens + other.input_tokens, self.output_tokens + other.output_tokens, cost)


_VENDOR_STOP_WORDS = {"stop": "end_turn", "end_turn": "end_turn", "tool_calls": "tool_use", "function_call": "tool_use",
                      "tool_use": "tool_use", "length": "max_tokens", "max_tokens": "max_tokens",
                      "stop_sequence": "stop_sequence"}


def stop_reason_of(word: object, *, tool_calls: bool = False) -> str:
    """The kernel's word (``LLMResponse.stop_reason``) for a vendor's: OpenAI's ``stop``,
    ``tool_calls`` and ``length`` are ``end_turn``, ``tool_use`` and ``max_tokens``; Anthropic's
    words are the kernel's already; another passes as it is (lower case). With no word, the
    answer's own shape says: ``tool_use`` where it calls tools, else ``end_turn``."""
    if not word:
        return "tool_use" if tool_calls else "end_turn"
    text = str(word).lower()
    return _VENDOR_STOP_WORDS.get(text, text)


@dataclass(frozen=True)
class LLMResponse:
    """The model's answer: the assistant message, what it cost, and why it stopped."""

    message: Message
    usage: Usage = field(default_factory=Usage)
    stop_reason: str = "end_turn"
    """``end_turn``, ``tool_use``, ``max_tokens`` or ``stop_sequence`` whatever the vendor's
    words (another reason the vendor gives passes as it is)."""
    model: str | None = None
    id: str | None = None
    """The provider's id for this answer (``gen_ai.response.id``), where it gave one."""

    @property
    def content(self) -> str:
        return self.message.content

    @property
    def tool_calls(self) -> tuple[ToolCall, ...]:
        return self.message.tool_calls

    def to_dict(self) -> dict[str, JSON]:
        out: dict[str, JSON] = {
            "message": self.message.to_dict(),
            "usage": {
                "input_tokens": self.usage.input_tokens,
                "output_tokens": self.usage.output_tokens,
                "cost": self.usage.cost,
            },
            "stop_reason": self.stop_reason,
            "model": self.model,
        }
        if self.id is not None:
            out["id"] = self.id
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> LLMResponse:
        usage = data.get("usage") or {}
        return cls(
            message=Message.from_dict(data["message"]),
            usage=Usage(int(usage.get("input_tokens", 0)), int(usage.get("output_tokens", 0)), usage.get("cost")),
            stop_reason=str(data.get("stop_reason", "end_turn")),
            model=data.get("model"),
            id=data.get("id"),
        )


def coerce_messages(messages: Sequence[Message | Mapping[str, Any]] | str) -> tuple[Message, ...]:
    """Accept typed messages, plain dicts, or a bare string (one user message)."""
    if isinstance(messages, str):
        return (Message("user", messages),)
    if not isinstance(messages, Sequence):
        raise InvalidArgument(f"messages must be a list of messages, not {type(messages).__name__}")
    coerced = []
    for message in messages:
        if isinstance(message, str):
            raise InvalidArgument(f"a message must be a Message or a dict with a 'role', got {message!r:.60}")
        coerced.append(Message.coerce(message))
    return tuple(coerced)
