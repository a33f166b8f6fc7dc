"""The records that cross the protocols: LLM messages, exec results, checkpoints, budgets.

Every record is a frozen dataclass with ``to_dict``/``from_dict`` so that the kernel can
journal it as JSON and serve it back unchanged after a restart.
"""

from __future__ import annotations

import enum
import functools
import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from types import MappingProxyType
from typing import Any, Literal, Union

from ringzero.core.errors import InvalidArgument, InvalidLimits, NotSerializable

JSON = Union[None, bool, int, float, str, list["JSON"], dict[str, "JSON"]]
Role = Literal["system", "user", "assistant", "tool"]

__all__ = [
    "JSON",
    "Checkpoint",
    "ExecError",
    "ExecLimits",
    "ExecResult",
    "LLMRequest",
    "LLMResponse",
    "Limits",
    "Message",
    "PendingWrite",
    "ProcessStatus",
    "Role",
    "StopReason",
    "ToolCall",
    "ToolCallRecord",
    "ToolSchema",
    "Usage",
    "ensure_json",
    "json_encoder",
    "json_form",
    "json_problem",
    "json_size",
]


def _not_serializable(value: Any) -> Any:
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


def json_encoder(*, sort_keys: bool = False, allow_nan: bool = True,
                 default: Callable[[Any], Any] | None = None) -> Callable[[Any], str]:
    """Compact JSON text (``separators=(",", ":")``, ASCII), exactly as ``json.JSONEncoder``
    with these options writes it, a microsecond faster a call: the encoder's ``encode`` sets up
    its C encoder again at every call in Python (a closure, a call with nine arguments, the
    top-level checks), and the kernel encodes several records at every syscall and lifecycle
    step. This calls one C encoder made once, which keeps no table of the containers being
    encoded (making an encoder with a fresh table at every call cost 0.3 µs, and keeping the
    table a microsecond more for a status row). A value that contains itself then ends in a
    ``RecursionError`` instead; any error is answered by encoding the value again with a fresh
    table, so that what is raised is exactly what ``json.dumps`` raises (a value that contains
    itself is refused with its ValueError). Where the interpreter has no C encoder, it is
    ``json.JSONEncoder(...).encode``."""
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None:  # pragma: no cover - CPython always has it
        return json.JSONEncoder(separators=(",", ":"), sort_keys=sort_keys, allow_nan=allow_nan,
                                default=default).encode
    fallback = default or _not_serializable
    ascii_string = json.encoder.encode_basestring_ascii
    unchecked = make(None, fallback, ascii_string, None, ":", ",", sort_keys, False, allow_nan)

    def encode(value: Any) -> str:
        if type(value) is str:
            return ascii_string(value)
        try:
            return "".join(unchecked(value, 0))
        except Exception:  # again, checked, for the standard library's own error
            return "".join(make({}, fallback, ascii_string, None, ":", ",", sort_keys, False, allow_nan)(value, 0))

    return encode


strict_json = json_encoder(allow_nan=False)
"""Compact JSON text of a value, refusing NaN and infinities (not JSON), a value that contains
itself (ValueError) and anything that is not JSON (TypeError)."""


def ensure_json(value: Any, what: str) -> JSON:
    """Return ``value`` if it survives a JSON round trip unchanged in kind, else raise.

    ``what`` names the value in the error, e.g. ``"message to pid 3"``.
    """
    json_size(value, what)
    return value  # type: ignore[no-any-return]


def json_size(value: Any, what: str) -> int:
    """The length of ``value``'s compact JSON text, as the store keeps it; NotSerializable,
    naming ``what``, if it has none. (``json.dumps(value, allow_nan=False)`` builds a new
    encoder at every call: 2 to 3 µs more, at every message sent and every value returned.)"""
    try:
        return len(strict_json(value))
    except (TypeError, ValueError) as exc:
        raise NotSerializable(
            f"{what} must be JSON-compatible (dict, list, str, int, float, bool, None): {exc}"
        ) from exc


def json_problem(value: Any, path: str) -> str | None:
    """Why ``value`` would not come back from the store as it is, naming where in it (``path``
    is its name, e.g. ``ctx.state``); None when it would. Stricter than ``ensure_json``: a tuple
    (read back as a list), a key that is not a string (read back as one) and NaN or infinity
    (not JSON) are refused too, since a resumed program would see something else."""
    if value is None or isinstance(value, (str, bool, int)):
        return None
    if isinstance(value, float):
        return None if math.isfinite(value) else f"{path} is {value!r}, which JSON cannot hold"
    if isinstance(value, list):
        for i, item in enumerate(value):
            problem = json_problem(item, f"{path}[{i}]")
            if problem is not None:
                return problem
        return None
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                return (f"{path} has the key {key!r}, a {type(key).__name__}, which would be read back as a string "
                        "(or not stored at all); use string keys")
            problem = json_problem(item, f"{path}[{key!r}]")
            if problem is not None:
                return problem
        return None
    if isinstance(value, tuple):
        return f"{path} is a tuple, which would be read back as a list; store a list"
    return (f"{path} is a {type(value).__name__} ({value!r:.60}), which is not JSON (dict, list, str, int, float, "
            "bool, None); store a JSON form of it")


def json_form(value: Any) -> JSON:
    """A JSON form of ``value`` to keep where the value itself cannot be stored: tuples as
    lists, keys as strings, and anything else that is not JSON (NaN included) as its repr."""
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)
    if value is None or isinstance(value, (str, bool, int, float)):
        return value
    if isinstance(value, (list, tuple)):
        return [json_form(item) for item in value]
    if isinstance(value, dict):
        return {str(key): json_form(item) for key, item in value.items()}
    return repr(value)


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


@dataclass(frozen=True)
class LLMResponse:
    """The model's answer: the assistant message, what it cost, and why it stopped."""

    message: Message
    usage: Usage = field(default_factory=Usage)
    stop_reason: str = "end_turn"
    model: str | None = None

    @property
    def content(self) -> str:
        return self.message.content

    @property
    def tool_calls(self) -> tuple[ToolCall, ...]:
        return self.message.tool_calls

    def to_dict(self) -> dict[str, JSON]:
        return {
            "message": self.message.to_dict(),
            "usage": {
                "input_tokens": self.usage.input_tokens,
                "output_tokens": self.usage.output_tokens,
                "cost": self.usage.cost,
            },
            "stop_reason": self.stop_reason,
            "model": self.model,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> LLMResponse:
        usage = data.get("usage") or {}
        return cls(
            message=Message.from_dict(data["message"]),
            usage=Usage(int(usage.get("input_tokens", 0)), int(usage.get("output_tokens", 0)), usage.get("cost")),
            stop_reason=str(data.get("stop_reason", "end_turn")),
            model=data.get("model"),
        )


@dataclass(frozen=True)
class ExecLimits:
    """Per-run limits an executor enforces. ``None`` means the executor's own default."""

    wall_seconds: float | None = None
    memory_bytes: int | None = None
    output_bytes: int | None = None
    """Caps what the code prints and, separately, the JSON of its final value."""
    tool_bytes: int | None = None
    """Caps the JSON of each host tool call's arguments and of its result: past it, the code
    gets a ValueError instead, and the host keeps nothing of the oversized value."""
    run_tool_bytes: int | None = None
    """Caps the JSON of every host tool call's arguments and results of one run, together
    (what the host keeps, returns and journals for it): a call past it is not made, and the
    code gets a ValueError."""

    def __post_init__(self) -> None:
        _check_non_negative(self, "ExecLimits")


@dataclass(frozen=True)
class ExecError:
    """An exception raised by the user's code: data for the caller, not a host exception.

    ``origin`` is ``"executor"`` when the executor itself ended the run (its wall limit, a
    killed sandbox, a broken protocol, an oversized value): code can raise any exception it
    likes, ``TimeoutError`` included, but it cannot make its error claim that origin."""

    type: str
    message: str
    traceback: str = ""
    origin: Literal["code", "executor"] = "code"


@dataclass(frozen=True)
class ToolCallRecord:
    """One host tool call made from sandboxed code, as the host saw it."""

    name: str
    args: list[JSON]
    kwargs: dict[str, JSON]
    result: JSON = None
    error: str | None = None


@dataclass(frozen=True)
class ExecResult:
    """What running code produced: the last expression's value, stdout, and any error."""

    value: JSON = None
    stdout: str = ""
    error: ExecError | None = None
    duration: float = 0.0
    tool_calls: tuple[ToolCallRecord, ...] = ()

    @property
    def ok(self) -> bool:
        return self.error is None

    def for_model(self, max_chars: int = 4000) -> str:
        """What a model is shown of this run: stdout, then the final value or the error, capped
        at ``max_chars`` with a note saying how much was cut."""
        parts = [self.stdout.rstrip()] if self.stdout.strip() else []
        if self.error is not None:
            parts.append(f"Error: {self.error.type}: {self.error.message}")
        elif self.value is not None:
            parts.append(f"Result: {self.value!r}")
        text = "\n".join(parts) or "(no output)"
        if len(text) > max_chars:
            text = text[:max_chars] + f"\n[... {len(text) - max_chars} more characters truncated]"
        return text

    def to_dict(self) -> dict[str, JSON]:
        return {
            "value": self.value,
            "stdout": self.stdout,
            "error": None if self.error is None else dict(vars(self.error)),
            "duration": self.duration,
            "tool_calls": [dict(vars(c)) for c in self.tool_calls],
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ExecResult:
        error = data.get("error")
        return cls(
            value=data.get("value"),
            stdout=str(data.get("stdout", "")),
            error=None if error is None else ExecError(**error),
            duration=float(data.get("duration", 0.0)),
            tool_calls=tuple(ToolCallRecord(**c) for c in data.get("tool_calls") or ()),
        )


@dataclass(frozen=True)
class PendingWrite:
    """One write a task made against a checkpoint (LangGraph's pending writes)."""

    task_id: str
    channel: str
    value: bytes
    task_path: str = ""
    idx: int = 0


NO_METADATA: Mapping[str, JSON] = MappingProxyType({})
"""Empty metadata nobody can change: a checkpointer may keep it as it is, without a copy (the
kernel's own rows carry it)."""


@dataclass(frozen=True)
class Checkpoint:
    """One durable record: LangGraph checkpoints, process snapshots and journal entries alike.

    Within a (thread_id, namespace), ids must sort lexicographically in creation order: the
    "latest" checkpoint is the one with the greatest id. ``writes`` is filled in by ``get``
    and ``list`` and ignored by ``put``.
    """

    thread_id: str
    namespace: str
    id: str
    payload: bytes
    parent_id: str | None = None
    metadata: Mapping[str, JSON] = field(default_factory=dict)
    writes: tuple[PendingWrite, ...] = ()


class ProcessStatus(str, enum.Enum):
    """A process's place in its lifecycle."""

    CREATED = "created"
    READY = "ready"
    RUNNING = "running"
    WAITING = "waiting"
    PAUSED = "paused"
    EXITED = "exited"
    FAILED = "failed"
    KILLED = "killed"

    @property
    def terminal(self) -> bool:
        """Whether the process has ended (exited, failed or was killed). A set lookup: the
        kernel asks at every transition, send and wait, and the tuple of three members this
        was looked each up on the class first (0.4 µs)."""
        return self in _TERMINAL


_TERMINAL = frozenset({ProcessStatus.EXITED, ProcessStatus.FAILED, ProcessStatus.KILLED})


class StopReason(str, enum.Enum):
    """Why a process stopped."""

    RETURNED = "returned"
    RAISED = "raised"
    KILLED = "killed"
    NON_DETERMINISM = "non_determinism"
    PROGRAM_NOT_FOUND = "program_not_found"
    TOKENS = "budget_tokens"
    COST = "budget_cost"
    LLM_CALLS = "budget_llm_calls"
    STEPS = "budget_steps"
    WALL_SECONDS = "budget_wall_seconds"
    EXEC_SECONDS = "budget_exec_seconds"


@dataclass(frozen=True)
class Limits:
    """A process's budgets; ``None`` means unlimited.

    Crossing one stops the process with the matching ``StopReason``; a ``budget_warning``
    event comes first, at 90%.
    """

    tokens: int | None = None
    cost: float | None = None
    llm_calls: int | None = None
    steps: int | None = None
    wall_seconds: float | None = None
    exec_seconds: float | None = None

    def __post_init__(self) -> None:
        _check_non_negative(self, "Limits")

    def to_dict(self) -> dict[str, JSON]:
        return {name: getattr(self, name) for name in _field_names(Limits)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> Limits:
        return cls(**dict(data or {}))


@functools.cache
def _field_names(cls: type) -> tuple[str, ...]:
    """A dataclass's field names, looked up once (``dataclasses.fields`` costs µs at every call,
    and limits are checked and saved at every spawn)."""
    return tuple(f.name for f in fields(cls))


@functools.cache
def _whole_fields(cls: type) -> frozenset[str]:
    """The fields of a limits dataclass that count whole things (annotated ``int | None``)."""
    return frozenset(f.name for f in fields(cls) if str(f.type).startswith("int"))


def _check_non_negative(obj: object, kind: str) -> None:
    whole = _whole_fields(type(obj))  # type: ignore[arg-type]
    for name in _field_names(type(obj)):  # type: ignore[arg-type]
        value = getattr(obj, name)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
            raise InvalidLimits(f"{kind}.{name} must be a number or None, not {value!r}")
        if value < 0:
            raise InvalidLimits(f"{kind}.{name} must not be negative, got {value}")
        if name in whole and not isinstance(value, int):
            raise InvalidLimits(f"{kind}.{name} counts whole {name.replace('_', ' ')}: a whole number or None, "
                                f"not {value!r}")


def coerce_messages(messages: Sequence[Message | Mapping[str, Any]] | str) -> tuple[Message, ...]:
    """Accept typed messages, plain dicts, or a bare string (one user message)."""
    if isinstance(messages, str):
        return (Message("user", messages),)
    if not isinstance(messages, Sequence):
        raise InvalidArgument(f"messages must be a list of messages, not {type(messages).__name__}")
    return tuple(Message.coerce(m) for m in messages)  # type: ignore[arg-type]  # str was handled above
