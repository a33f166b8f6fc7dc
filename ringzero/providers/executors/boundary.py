"""The host side of the sandbox boundary, shared by every executor (and open to executors
outside ringzero: ``HostTools`` is what a third-party executor calls for its tool calls).

Everything a sandbox sends is untrusted: messages are size-capped before they are parsed, the
data beside them (a call's arguments, the final value) is judged by its length before it is
parsed, values nested deeper than ``MAX_DEPTH`` are refused before any recursive code sees them,
and tool arguments and results are size-capped before the host keeps them, one call and the
whole run (``HostTools``), by a walk that counts what they cost before any JSON is made
(``json_cost``), so that no value the code makes stalls the event loop. Host tools run off the
event loop: a coroutine function is awaited, a plain function runs in the executor's bounded
tool pool, so a slow tool stalls only its own run (whose wall limit still holds), never the host.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from typing import Any

from ringzero.core.contract.egress import EgressRecord
from ringzero.core.contract.errors import InvalidArgument
from ringzero.core.contract.outcomes import clip
from ringzero.core.contract.protocols import Tool
from ringzero.core.contract.types import JSON, ExecError, ExecLimits
from ringzero.core.support.json_cost import NOT_JSON, check_value, measure, measure_async
from ringzero.core.support.tool_boundary import ShownError, ToolBoundary
from ringzero.core.support.tool_pool import ToolPool
from ringzero.providers.egress.engine import TOOL_NAME as EGRESS_TOOL
from ringzero.providers.egress.engine import EgressRun
from ringzero.providers.executors._runner import CONTROL_BYTES, HEADER, MAX_DEPTH, deeper_than

__all__ = ["MAX_DEPTH", "NOT_JSON", "FrameBuffer", "HostTools", "ProtocolViolation", "ShownError", "check_value",
           "clip", "deeper_than", "executor_error", "finished", "measure", "measure_async", "merge_limits",
           "message_limit"]


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


async def finished(message: dict[str, Any], limits: ExecLimits) -> tuple[JSON, str, ExecError | None]:
    """The run's outcome from its ``done`` (its data: the value's JSON text and stdout),
    re-checked here: the sandbox is not trusted to have applied its own limits. The value is
    judged by its length before it is parsed, and walked a piece at a time after."""
    error = message.get("error")
    if error is not None and not (isinstance(error, dict) and all(isinstance(v, str) for v in error.values())):
        raise ProtocolViolation("a malformed error")
    value_text, stdout_bytes = _data(message, 2)
    stdout = stdout_bytes.decode("utf-8", "replace")
    if limits.output_bytes is not None and len(stdout) > limits.output_bytes + 100:
        stdout = stdout[:limits.output_bytes] + "\n[output truncated]"
    limit = limits.output_bytes
    if limit is not None and len(value_text) > limit:
        return None, stdout, executor_error("OutputLimitExceeded", f"the code's final value is {len(value_text)} "
                                            f"bytes of JSON, over the limit of {limit}")
    value = _parsed(value_text, "final value")
    _, refused = await measure_async(value, "the code's final value", limit)
    if refused is not None and NOT_JSON in refused:  # NaN or an infinity: the code's own value, not a limit
        return None, stdout, ExecError("ValueError", refused)
    if refused is not None:
        return None, stdout, executor_error("OutputLimitExceeded", refused)
    exec_error = None if error is None else ExecError(
        str(error.get("type", "Exception")), str(error.get("message", "")), str(error.get("traceback", "")))
    return value, stdout, exec_error


def _data(message: dict[str, Any], count: int) -> list[bytes]:
    data = message.get("data")
    if not isinstance(data, list) or len(data) != count:
        raise ProtocolViolation(f"a {message.get('op')!r} without its {count} piece(s) of data")
    return data


def _parsed(text: bytes, what: str) -> Any:
    """JSON text of known, checked length (its cost is bounded by the run's limit)."""
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise ProtocolViolation(f"a malformed {what}: {type(exc).__name__}") from None


class FrameBuffer:
    """Reassembles length-prefixed JSON messages, and the raw data each names, from arbitrary
    chunks. A message over ``control`` bytes, or data over ``limit`` in all, is refused from its
    header, before it is read; a message that is not a JSON object with an ``op``, or nests too
    deeply, is refused before anyone uses it. Data is never parsed here: its reader judges it by
    its length first (``finished``, ``HostTools.answer``)."""

    def __init__(self, limit: int = 64 * 1024 * 1024, control: int = CONTROL_BYTES) -> None:
        self._buffer = bytearray()
        self.limit = limit
        self.control = control
        self._pending: dict[str, Any] | None = None  # a message whose data is still arriving
        self._expected: list[int] = []

    def feed(self, data: bytes) -> list[dict[str, Any]]:
        self._buffer += data
        messages = []
        size = HEADER.size
        while len(self._buffer) >= size:
            (length,) = HEADER.unpack(self._buffer[:size])
            if self._pending is not None and length != self._expected[0]:
                raise ProtocolViolation(f"{length} bytes of data where {self._expected[0]} were announced")
            limit = self.control if self._pending is None else self.limit
            if length > limit:
                raise ProtocolViolation(f"a {length}-byte message (the limit is {limit})")
            if len(self._buffer) < size + length:
                break
            payload = bytes(self._buffer[size:size + length])
            del self._buffer[:size + length]
            if self._pending is not None:
                self._pending["data"].append(payload)
                self._expected.pop(0)
                if not self._expected:
                    messages.append(self._pending)
                    self._pending = None
                continue
            message = self._message(payload)
            announced = message.get("data")
            if announced is None:
                messages.append(message)
                continue
            if not isinstance(announced, list) or not all(type(n) is int and n >= 0 for n in announced) \
                    or sum(announced) > self.limit:
                raise ProtocolViolation(f"data of {announced!r} bytes (the limit is {self.limit} in all)")
            message["data"] = []
            if announced:
                self._pending, self._expected = message, list(announced)
            else:
                messages.append(message)
        return messages

    @staticmethod
    def _message(payload: bytes) -> dict[str, Any]:
        try:
            message = json.loads(payload)
        except (ValueError, RecursionError) as exc:
            raise ProtocolViolation(f"a malformed message: {type(exc).__name__}: {exc}") from exc
        if not isinstance(message, dict) or not isinstance(message.get("op"), str):
            raise ProtocolViolation("a message without an op")
        if deeper_than(message, MAX_DEPTH + 2):
            raise ProtocolViolation(f"a message nested more than {MAX_DEPTH} levels deep")
        return message


class HostTools(ToolBoundary):
    """One run's host tools as its sandbox reaches them: the ``ToolBoundary`` every executor's
    tool calls cross (see there), with the run's egress (``ExecLimits.egress``: its
    ``http_request`` tool among ``tools``) and the reply to a sandbox's ``call`` frame. Given the
    tools ``ctx.exec`` handed over (``bound_tools``), it calls the tools themselves and
    journals each call through their run's journal."""

    def __init__(self, tools: Mapping[str, Tool], limits: ExecLimits, pool: ToolPool | None = None, *,
                 show_errors: bool = False) -> None:
        super().__init__(tools, limits, pool, show_errors=show_errors)
        self.egress: EgressRun | None = None
        """The run's egress (``ExecLimits.egress``): its ``http_request`` tool is among ``tools``."""
        if limits.egress is not None:
            if EGRESS_TOOL in self.tools:
                raise InvalidArgument(f"a run with egress has the built-in tool {EGRESS_TOOL!r}; give yours "
                                      "another name")
            self.egress = EgressRun(limits.egress)
            self.tools[EGRESS_TOOL] = self.egress.tool

    def ended(self) -> tuple[EgressRecord, ...]:
        """The run ended: its connections upstream close. Returns its requests through the
        host, for its ``ExecResult``."""
        if self.egress is None:
            return ()
        self.egress.close()
        return tuple(self.egress.log)

    async def answer(self, message: dict[str, Any]) -> dict[str, Any]:
        """The reply to a sandbox's ``call`` message: the tool's result or its error. Its
        arguments are its data, the JSON text ``[args, kwargs]`` (as ``FrameBuffer`` reads it),
        judged by length before it is parsed; a message may also carry ``args`` and ``kwargs``
        themselves (an executor that parsed them already)."""
        name = message.get("name")
        if message.get("op") != "call" or not isinstance(name, str):
            raise ProtocolViolation("a malformed tool call")
        if "data" in message:
            [text] = _data(message, 1)
            if self.tool_bytes is not None and len(text) > self.tool_bytes:
                return self._refuse(name, ValueError(f"the arguments to {name}() are {len(text)} bytes of JSON, "
                                                     f"over the limit of {self.tool_bytes}"))[1].reply()
            arguments = _parsed(text, "tool call")
            args, kwargs = arguments if isinstance(arguments, list) and len(arguments) == 2 else (None, None)
        else:
            args, kwargs = message.get("args"), message.get("kwargs")
        if not isinstance(args, list) or not isinstance(kwargs, dict) or not all(isinstance(k, str) for k in kwargs):
            raise ProtocolViolation("a malformed tool call")
        ok, outcome = await self.call(name, args, kwargs)
        return {"op": "result", "value": outcome} if ok else outcome.reply()
