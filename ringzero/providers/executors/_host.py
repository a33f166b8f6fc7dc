"""Host-side pieces shared by the executors that run code in another process or VM."""

from __future__ import annotations

import dataclasses
import inspect
import json
from typing import Any

from ringzero.core.protocols import Tool
from ringzero.core.types import ExecLimits, ToolCallRecord

__all__ = ["ProtocolViolation", "answer_tool_call", "merge_limits"]


class ProtocolViolation(Exception):
    """The sandbox sent something that is not the protocol: it is killed, the host carries on."""


def merge_limits(limits: ExecLimits | None, defaults: ExecLimits) -> ExecLimits:
    """``limits`` with each unset field taken from ``defaults``."""
    if limits is None:
        return defaults
    return dataclasses.replace(limits, **{f.name: getattr(defaults, f.name) for f in dataclasses.fields(limits)
                                          if getattr(limits, f.name) is None})


async def answer_tool_call(
    message: dict[str, Any], tools: dict[str, Tool], calls: list[ToolCallRecord]
) -> dict[str, Any]:
    """Run the host tool a ``call`` message names; the reply carries its result or its error."""
    name, args, kwargs = message.get("name"), message.get("args"), message.get("kwargs")
    if message.get("op") != "call" or not isinstance(name, str) or not isinstance(args, list) \
            or not isinstance(kwargs, dict):
        raise ProtocolViolation("a malformed tool call")
    if name not in tools:
        return {"op": "error", "type": "NameError", "args": [f"no host tool named {name!r}"]}
    try:
        result = tools[name](*args, **kwargs)
        if inspect.isawaitable(result):
            result = await result
        json.dumps(result)
    except Exception as exc:
        calls.append(ToolCallRecord(name, args, kwargs, None, f"{type(exc).__name__}: {exc}"))
        exc_args = [a if isinstance(a, (str, int, float, bool)) or a is None else str(a) for a in exc.args]
        return {"op": "error", "type": type(exc).__name__, "args": exc_args}
    calls.append(ToolCallRecord(name, args, kwargs, result))
    return {"op": "result", "value": result}
