"""The host side of the sandbox boundary, shared by every executor (and open to executors
outside ringzero: ``HostTools`` is what a third-party executor calls for its tool calls).

Everything a sandbox sends is untrusted: frames are size-capped before they are parsed,
values nested deeper than ``MAX_DEPTH`` are refused before any recursive code sees them, and
tool arguments and results are size-capped before the host keeps them, one call and the whole
run (``HostTools``). Host tools run off the event loop: a coroutine function is awaited, a
plain function runs in the executor's bounded tool pool, so a slow tool stalls only its own
run (whose wall limit still holds), never the host.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import dataclasses
import inspect
import json
import re
from collections.abc import Mapping
from typing import Any

from ringzero.core.errors import ToolError
from ringzero.core.host_tools import call_tool
from ringzero.core.protocols import Tool
from ringzero.core.tool_pool import ToolPool
from ringzero.core.types import JSON, ExecError, ExecLimits, ToolCallRecord
from ringzero.providers.executors._runner import HEADER, MAX_DEPTH, deeper_than

__all__ = ["MAX_DEPTH", "FrameBuffer", "HostTools", "ProtocolViolation", "ShownError", "check_value", "clip",
           "deeper_than", "executor_error", "finished", "measure", "merge_limits", "message_limit"]



class ProtocolViolation(Exception):
    """The sandbox sent something that is not the protocol: it is killed, the host carries on."""


def executor_error(type_: str, message: str) -> ExecError:
    """An outcome the executor itself decided (a limit, a kill, a broken protocol): its
    ``origin`` tells it from anything the code could have reported."""
    return ExecError(type_, message, origin="executor")


def merge_limits(limits: ExecLimits | None, defaults: ExecLimits) -> ExecLimits:
    """``limits`` with each unset field taken from ``defaults``."""
    if limits is None:
        return defaults
    return dataclasses.replace(limits, **{f.name: getattr(defaults, f.name) for f in dataclasses.fields(limits)
                                          if getattr(limits, f.name) is None})


def message_limit(limits: ExecLimits) -> int:
    """The largest frame a run may send: a ``done`` carries stdout and the value (each capped at
    ``output_bytes``), a ``call`` its arguments (capped at ``tool_bytes``)."""
    return 2 * (limits.output_bytes or 0) + (limits.tool_bytes or 0) + 64 * 1024


NOT_JSON = "is not JSON-compatible"
"""What ``check_value`` says of a value that JSON cannot hold (a set, NaN, an infinity)."""


def check_value(value: Any, what: str, max_bytes: int | None) -> str | None:
    """Why ``value`` may not cross the boundary (too deep, too large, not JSON), or None."""
    return measure(value, what, max_bytes)[1]


def measure(value: Any, what: str, max_bytes: int | None) -> tuple[int, str | None]:
    """The size of ``value``'s JSON in bytes, and why it may not cross the boundary (too deep,
    too large, not JSON) or None."""
    if max_bytes is not None and json_floor(value, max_bytes) > max_bytes:
        # said before the JSON is made: a million-key dict is refused in milliseconds, and the
        # encoder (which holds the GIL throughout) never sees it
        return max_bytes + 1, f"{what} is more than {max_bytes} bytes of JSON, the limit"
    if deeper_than(value):
        return 0, f"{what} nests lists or dicts more than {MAX_DEPTH} levels deep"
    try:  # strict: NaN and the infinities are not JSON, and the journal refuses them
        size = len(json.dumps(value, ensure_ascii=False, allow_nan=False).encode())
    except (TypeError, ValueError, RecursionError) as exc:
        return 0, f"{what} {NOT_JSON}: {clip(str(exc), 200)}"
    if max_bytes is not None and size > max_bytes:
        return size, f"{what} is {size} bytes of JSON, over the limit of {max_bytes}"
    return size, None


def finished(message: dict[str, Any], limits: ExecLimits) -> tuple[JSON, str, ExecError | None]:
    """The run's outcome from its ``done``, re-checked here: the sandbox is not trusted to have
    applied its own limits."""
    error = message.get("error")
    if error is not None and not isinstance(error, dict):
        raise ProtocolViolation("a malformed error")
    stdout = message.get("stdout", "")
    stdout = stdout if isinstance(stdout, str) else str(stdout)
    if limits.output_bytes is not None and len(stdout) > limits.output_bytes + 100:
        stdout = stdout[:limits.output_bytes] + "\n[output truncated]"
    value = message.get("value")
    refused = check_value(value, "the code's final value", limits.output_bytes)
    if refused is not None and NOT_JSON in refused:  # NaN or an infinity: the code's own value, not a limit
        return None, stdout, ExecError("ValueError", refused)
    if refused is not None:
        return None, stdout, executor_error("OutputLimitExceeded", refused)
    exec_error = None if error is None else ExecError(
        str(error.get("type", "Exception")), str(error.get("message", "")), str(error.get("traceback", "")))
    return value, stdout, exec_error


def json_floor(value: Any, stop_at: int) -> int:
    """A lower bound on the bytes of ``value``'s JSON, counted without recursion and without
    making it; the count stops once past ``stop_at``."""
    total, stack = 0, [value]
    while stack and total <= stop_at:
        item = stack.pop()
        if isinstance(item, str):
            total += len(item) + 2
        elif isinstance(item, dict):
            total += 1 + 2 * len(item)  # braces, colons and commas
            stack.extend(item)
            stack.extend(item.values())
        elif isinstance(item, (list, tuple)):
            total += 1 + len(item)  # brackets and commas
            stack.extend(item)
        else:
            total += 1
    return total


class FrameBuffer:
    """Reassembles length-prefixed JSON messages from arbitrary chunks. A frame over ``limit``
    bytes is refused from its header, before it is read; a body that is not a JSON object with
    an ``op``, or nests too deeply, is refused before anyone uses it."""

    def __init__(self, limit: int = 64 * 1024 * 1024) -> None:
        self._buffer = bytearray()
        self.limit = limit

    def feed(self, data: bytes) -> list[dict[str, Any]]:
        self._buffer += data
        messages = []
        size = HEADER.size
        while len(self._buffer) >= size:
            (length,) = HEADER.unpack(self._buffer[:size])
            if length > self.limit:
                raise ProtocolViolation(f"a {length}-byte message (the limit is {self.limit})")
            if len(self._buffer) < size + length:
                break
            payload = bytes(self._buffer[size:size + length])
            del self._buffer[:size + length]
            try:
                message = json.loads(payload)
            except (ValueError, RecursionError) as exc:
                raise ProtocolViolation(f"a malformed message: {type(exc).__name__}: {exc}") from exc
            if not isinstance(message, dict) or not isinstance(message.get("op"), str):
                raise ProtocolViolation("a message without an op")
            if deeper_than(message, MAX_DEPTH + 2):
                raise ProtocolViolation(f"a message nested more than {MAX_DEPTH} levels deep")
            messages.append(message)
        return messages


ERROR_CHARS = 2000
"""The most of a tool's error text the host keeps in a run's record or shows the code."""
_HOST_OWNED = re.compile(r"^(url|uri|endpoint|host|api_base|apikey|token|secret|password|passwd|credentials?"
                         r"|authorization)$|(^|_)(api|access|secret|private|auth)_key$"
                         r"|_(url|uri|endpoint|host|token|secret|password)$", re.IGNORECASE)
"""A defaulted parameter so named keeps the host's default: the code cannot point a tool at
its own server or swap the host's credential."""


def clip(text: str, limit: int = ERROR_CHARS) -> str:
    return text if len(text) <= limit else text[:limit] + f"... [{len(text) - limit} more characters]"


@dataclasses.dataclass(frozen=True)
class ShownError:
    """A failed tool call as the code sees it: a type name and, where it may be shown, a
    message (``original`` stays on the host)."""

    type: str
    message: str | None
    original: BaseException

    def reply(self) -> dict[str, Any]:
        """The ``error`` frame a sandbox's tool proxy raises from."""
        return {"op": "error", "type": self.type, "args": [] if self.message is None else [self.message]}

    def as_exception(self) -> Exception:
        """An exception to raise in the code: the built-in of that name, else ``Exception``
        (whose message names the type)."""
        cls = getattr(builtins, self.type, None)
        if isinstance(cls, type) and issubclass(cls, Exception):
            with contextlib.suppress(Exception):
                return cls() if self.message is None else cls(self.message)
        return Exception(self.type if self.message is None else f"{self.type}: {self.message}")


class HostTools:
    """One run's host tools as its code reaches them: the one boundary every executor's tool
    calls cross, in both directions.

    - A call is refused before the tool runs (the code gets a ValueError or TypeError) where
      its arguments are not JSON, nest too deeply or exceed ``tool_bytes``; where they would take
      the run past ``run_tool_bytes`` (arguments and results of all its calls together); or where
      it passes a keyword the host fixed (``functools.partial``) or a defaulted parameter named
      like an endpoint or a credential (``base_url``, ``api_key``, ``token``).
    - A tool runs off the event loop (``call_tool``: sync tools in ``pool``); whatever it raises,
      ``SystemExit`` included, is that call's error. The code sees the type name, and the message
      only for a :class:`~ringzero.core.errors.ToolError` (or with ``show_errors``), clipped.
    - A result is checked the same way as arguments before the host keeps or returns it.
    - Every call is in ``calls``, a call cut short by the run's end too."""

    def __init__(self, tools: Mapping[str, Tool], limits: ExecLimits, pool: ToolPool | None = None, *,
                 show_errors: bool = False) -> None:
        self.tools = dict(tools)
        self.tool_bytes = limits.tool_bytes
        self.budget = limits.run_tool_bytes
        self.spent = 0
        self.pool = pool
        self.show_errors = show_errors
        self.calls: list[ToolCallRecord] = []

    def _refuse(self, name: str, exc: Exception) -> tuple[bool, ShownError]:
        self.calls.append(ToolCallRecord(name, [], {}, None, clip(f"{type(exc).__name__}: {exc}")))
        return False, ShownError(type(exc).__name__, clip(str(exc)), exc)

    def _over_budget(self, size: int, what: str) -> str | None:
        if self.budget is None or self.spent + size <= self.budget:
            self.spent += size
            return None
        return (f"{what} would take this run's tool calls to {self.spent + size} bytes of JSON, over the "
                f"limit of {self.budget} for the whole run")

    async def call(self, name: str, args: list[Any], kwargs: dict[str, Any]) -> tuple[bool, Any]:
        """``(True, result)``, or ``(False, ShownError)`` for a call refused, a tool that raised
        or a result that may not cross the boundary."""
        tool = self.tools.get(name)
        if tool is None:
            return self._refuse(name, NameError(f"no host tool named {name!r}"))
        owned = [k for k in kwargs if _HOST_OWNED.search(k) and _has_default(tool, k)]
        if owned:
            return self._refuse(name, TypeError(
                f"argument {owned[0]!r} keeps the host's default (its name says it is an endpoint or a credential)"))
        size, refused = measure([args, kwargs], f"the arguments to {name}()", self.tool_bytes)
        refused = refused or self._over_budget(size, f"the arguments to {name}()")
        if refused is not None:
            return self._refuse(name, ValueError(refused))
        try:
            result = await call_tool(tool, args, kwargs, name=name, pool=self.pool)
        except asyncio.CancelledError:
            self.calls.append(ToolCallRecord(name, args, kwargs, None,
                                             "Cancelled: the run ended before the tool returned"))
            raise
        except Exception as exc:
            text = clip(f"{type(exc).__name__}: {_text(exc)}")
            self.calls.append(ToolCallRecord(name, args, kwargs, None, text))
            shown = isinstance(exc, ToolError) or self.show_errors or (isinstance(exc, TypeError) and _binds_not(
                tool, args, kwargs))
            return False, ShownError(type(exc).__name__, clip(_text(exc)) if shown else None, exc)
        size, refused = measure(result, f"the result of {name}()", self.tool_bytes)
        refused = refused or self._over_budget(size, f"the result of {name}()")
        if refused is not None:
            self.calls.append(ToolCallRecord(name, args, kwargs, None, f"ValueError: {refused}"))
            return False, ShownError("ValueError", refused, ValueError(refused))
        self.calls.append(ToolCallRecord(name, args, kwargs, result))
        return True, result

    async def answer(self, message: dict[str, Any]) -> dict[str, Any]:
        """The reply to a sandbox's ``call`` frame: the tool's result or its error."""
        name, args, kwargs = message.get("name"), message.get("args"), message.get("kwargs")
        if message.get("op") != "call" or not isinstance(name, str) or not isinstance(args, list) \
                or not isinstance(kwargs, dict) or not all(isinstance(k, str) for k in kwargs):
            raise ProtocolViolation("a malformed tool call")
        ok, outcome = await self.call(name, args, kwargs)
        return {"op": "result", "value": outcome} if ok else outcome.reply()


def _text(exc: BaseException) -> str:
    try:
        return str(exc)
    except Exception:
        return "<a message that cannot be shown>"


def _signature(tool: Tool) -> inspect.Signature | None:
    try:
        return inspect.signature(tool)
    except (TypeError, ValueError):
        return None


def _has_default(tool: Tool, name: str) -> bool:
    signature = _signature(tool)
    parameter = None if signature is None else signature.parameters.get(name)
    return parameter is not None and parameter.default is not inspect.Parameter.empty


def _binds_not(tool: Tool, args: list[Any], kwargs: dict[str, Any]) -> bool:
    """True where the call itself does not fit the tool's parameters: that TypeError is about
    the code's call, not the tool's inside, and is shown."""
    signature = _signature(tool)
    if signature is None:
        return False
    try:
        signature.bind(*args, **kwargs)
    except TypeError:
        return True
    return False
