"""Runs one piece of agent code inside a sandbox, with host tools as plain functions.

Standard library only: the process executor imports it, and the microVM executor ships
this file's source into the guest, where nothing of ringzero is installed. Messages are
length-prefixed JSON: ``run`` arrives, ``call`` goes out for each host tool call and is
answered by ``result`` or ``error``, and ``done`` carries the value, stdout and any error.
Run as a script, it speaks that protocol on stdin/stdout.
"""

from __future__ import annotations

import ast
import builtins
import io
import json
import struct
import sys
import traceback
from collections.abc import Callable
from typing import Any

__all__ = ["CappedOutput", "frame", "read_frame", "run_code"]


def frame(message: Any) -> bytes:
    data = json.dumps(message, separators=(",", ":")).encode()
    return struct.pack("!I", len(data)) + data


def read_frame(read: Callable[[int], bytes]) -> Any:
    """One message, with ``read(n)`` returning exactly n bytes (EOFError at the end)."""
    (length,) = struct.unpack("!I", read(4))
    return json.loads(read(length))


class CappedOutput(io.TextIOBase):
    """print() output, cut at ``limit`` characters with a note."""

    def __init__(self, limit: int) -> None:
        self.limit, self.size, self.truncated = limit, 0, False
        self.parts: list[str] = []

    def write(self, text: str) -> int:
        if self.size + len(text) <= self.limit:
            self.parts.append(text)
            self.size += len(text)
        elif not self.truncated:
            self.parts.append(text[: self.limit - self.size])
            self.size, self.truncated = self.limit, True
        return len(text)

    def value(self) -> str:
        return "".join(self.parts) + ("\n[output truncated]" if self.truncated else "")


def _tool_proxy(name: str, send: Callable[[Any], None], receive: Callable[[], Any]) -> Callable[..., Any]:
    def call(*args: Any, **kwargs: Any) -> Any:
        send({"op": "call", "name": name, "args": list(args), "kwargs": kwargs})
        reply = receive()
        if reply["op"] == "error":
            cls = getattr(builtins, reply["type"], None)
            if not (isinstance(cls, type) and issubclass(cls, Exception)):
                cls = type(reply["type"], (Exception,), {})
            raise cls(*reply["args"])
        return reply["value"]

    call.__name__ = name
    return call


def run_code(request: dict[str, Any], send: Callable[[Any], None], receive: Callable[[], Any],
             output_limit: int) -> dict[str, Any]:
    """Execute ``request["code"]``; the value of a final expression is the result."""
    out = CappedOutput(output_limit)
    sys.stdout = sys.stderr = out
    namespace: dict[str, Any] = {"__name__": "__main__", **request["inputs"]}
    for name in request["tools"]:
        namespace[name] = _tool_proxy(name, send, receive)
    value, error = None, None
    try:
        tree = ast.parse(request["code"], "<sandbox>", "exec")
        last = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) else None
        exec(compile(tree, "<sandbox>", "exec"), namespace)
        if last is not None:
            value = eval(compile(ast.Expression(last.value), "<sandbox>", "eval"), namespace)
    except BaseException as exc:  # the user's error, SystemExit and MemoryError included, is data
        error = {"type": type(exc).__name__, "message": str(exc),
                 "traceback": "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))}
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        value = repr(value)
    return {"op": "done", "value": value, "stdout": out.value(), "error": error}


def _main() -> None:  # pragma: no cover - runs inside the microVM guest
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer

    def read(n: int) -> bytes:
        data = stdin.read(n)
        if len(data) < n:
            raise EOFError("the host closed stdin")
        return data

    def send(message: Any) -> None:
        stdout.write(frame(message))
        stdout.flush()

    request = read_frame(read)
    send(run_code(request, send, lambda: read_frame(read), int(request.get("output_bytes", 1 << 20))))


if __name__ == "__main__":  # pragma: no cover
    _main()
