"""The records that cross the protocols: LLM messages, exec results, checkpoints, budgets.

Every record is a frozen dataclass with ``to_dict``/``from_dict`` so that the kernel can
journal it as JSON and serve it back unchanged after a restart. JSON values and their checks
are in ``json_data``, an LLM call's records in ``llm_types``; this module names them all.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field, fields
from types import MappingProxyType
from typing import Any, Literal

from ringzero.core.contract.egress import Egress, EgressRecord
from ringzero.core.contract.errors import InvalidLimits
from ringzero.core.contract.json_data import (
    JSON,
    ensure_json,
    json_encoder,
    json_form,
    json_problem,
    json_size,
    strict_json,
)
from ringzero.core.contract.llm_types import (
    LLMRequest,
    LLMResponse,
    Message,
    Role,
    ToolCall,
    ToolSchema,
    Usage,
    coerce_messages,
)
from ringzero.core.contract.states import ProcessStatus, StopReason

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
    "Program",
    "Role",
    "StopReason",
    "ToolCall",
    "ToolCallRecord",
    "ToolSchema",
    "Usage",
    "coerce_messages",
    "ensure_json",
    "json_encoder",
    "json_form",
    "json_problem",
    "json_size",
    "strict_json",
]

Program = Callable[..., Awaitable[Any]]
"""What the kernel runs as a process: an ``async def`` whose first argument is its Context and
whose others are JSON."""


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
    egress: Egress | None = None
    """What the run may reach on the network, through the host, and with which secrets
    (``ringzero.Egress``); None: no network."""

    def __post_init__(self) -> None:
        _check_non_negative(self, "ExecLimits")
        if self.egress is not None and not isinstance(self.egress, Egress):
            raise InvalidLimits(f"ExecLimits.egress must be a ringzero.Egress or None, not {self.egress!r}")


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
    egress: tuple[EgressRecord, ...] = ()
    """The requests the run made (or tried) through the host, in order (``ExecLimits.egress``)."""

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
            **({"egress": [dict(vars(r)) for r in self.egress]} if self.egress else {}),
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
            egress=tuple(EgressRecord(**r) for r in data.get("egress") or ()),
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

    @classmethod
    def without_writes(cls, thread_id: str, namespace: str, id: str, parent_id: str | None, payload: bytes,
                       metadata: Mapping[str, JSON]) -> Checkpoint:
        """``Checkpoint(...)`` without the frozen dataclass's ``__init__``, which sets each field
        through ``object.__setattr__``: a microsecond less for each of the rows a process writes
        at every step (its status, state, transitions, mail, journal)."""
        self = object.__new__(cls)
        self.__dict__.update(thread_id=thread_id, namespace=namespace, id=id, parent_id=parent_id, payload=payload,
                             metadata=metadata, writes=())
        return self


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
    cls: type = type(obj)
    whole = _whole_fields(cls)
    for name in _field_names(cls):
        value = getattr(obj, name)
        if value is None or name == "egress":
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
            raise InvalidLimits(f"{kind}.{name} must be a number or None, not {value!r}")
        if value < 0:
            raise InvalidLimits(f"{kind}.{name} must not be negative, got {value}")
        if name in whole and not isinstance(value, int):
            raise InvalidLimits(f"{kind}.{name} counts whole {name.replace('_', ' ')}: a whole number or None, "
                                f"not {value!r}")
