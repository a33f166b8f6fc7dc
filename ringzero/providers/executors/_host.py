"""Host-side pieces shared by the executors that run code in another process or VM.

Everything a sandbox sends is untrusted: frames are size-capped before they are parsed,
values nested deeper than ``MAX_DEPTH`` are refused before any recursive code sees them, and
tool arguments and results are size-capped before the host keeps them. Host tools run off
the event loop: a coroutine function is awaited, a plain function runs in a worker thread,
so a slow tool stalls only its own run (whose wall limit still holds), never the host.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from ringzero.core.host_tools import call_tool
from ringzero.core.protocols import Tool
from ringzero.core.types import JSON, ExecError, ExecLimits, ToolCallRecord
from ringzero.providers.executors._runner import HEADER, MAX_DEPTH, deeper_than

__all__ = ["MAX_DEPTH", "FrameBuffer", "ProtocolViolation", "answer_tool_call", "check_value", "deeper_than",
           "executor_error", "finished", "merge_limits", "message_limit", "run_host_tool"]



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
    if deeper_than(value):
        return f"{what} nests lists or dicts more than {MAX_DEPTH} levels deep"
    try:  # strict: NaN and the infinities are not JSON, and the journal refuses them
        size = len(json.dumps(value, ensure_ascii=False, allow_nan=False).encode())
    except (TypeError, ValueError, RecursionError) as exc:
        return f"{what} {NOT_JSON}: {exc}"
    if max_bytes is not None and size > max_bytes:
        return f"{what} is {size} bytes of JSON, over the limit of {max_bytes}"
    return None


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


async def answer_tool_call(message: dict[str, Any], tools: dict[str, Tool], calls: list[ToolCallRecord],
                           tool_bytes: int | None) -> dict[str, Any]:
    """Run the host tool a ``call`` message names; the reply carries its result or its error.

    What the code sees of a failing tool is the exception's type name and its ``args``, as the
    tool raised them: a tool's error text is shown to the code (and so to the model)."""
    name, args, kwargs = message.get("name"), message.get("args"), message.get("kwargs")
    if message.get("op") != "call" or not isinstance(name, str) or not isinstance(args, list) \
            or not isinstance(kwargs, dict) or not all(isinstance(k, str) for k in kwargs):
        raise ProtocolViolation("a malformed tool call")
    if name not in tools:
        return {"op": "error", "type": "NameError", "args": [f"no host tool named {name!r}"]}
    refused = check_value([args, kwargs], f"the arguments to {name}()", tool_bytes)
    if refused is not None:
        calls.append(ToolCallRecord(name, [], {}, None, f"ValueError: {refused}"))
        return {"op": "error", "type": "ValueError", "args": [refused]}
    ok, outcome = await run_host_tool(name, tools[name], args, kwargs, calls, tool_bytes)
    if ok:
        return {"op": "result", "value": outcome}
    exc_args = [a if isinstance(a, (str, int, float, bool)) or a is None else str(a) for a in outcome.args]
    return {"op": "error", "type": type(outcome).__name__, "args": exc_args}


async def run_host_tool(name: str, tool: Tool, args: list[Any], kwargs: dict[str, Any], calls: list[ToolCallRecord],
                        tool_bytes: int | None) -> tuple[bool, Any]:
    """Call a host tool for code in a sandbox and record the call: ``(True, result)``, or
    ``(False, exception)`` for a tool that raised or a result that may not cross the boundary.
    Every executor's tool calls go through here."""
    try:
        result = await call_tool(tool, args, kwargs, name=name)
    except Exception as exc:
        calls.append(ToolCallRecord(name, args, kwargs, None, f"{type(exc).__name__}: {exc}"))
        return False, exc
    refused = check_value(result, f"the result of {name}()", tool_bytes)
    if refused is not None:
        calls.append(ToolCallRecord(name, args, kwargs, None, f"ValueError: {refused}"))
        return False, ValueError(refused)
    calls.append(ToolCallRecord(name, args, kwargs, result))
    return True, result
