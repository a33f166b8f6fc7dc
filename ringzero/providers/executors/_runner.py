"""Runs one piece of agent code inside a sandbox, with host tools as plain functions.

Standard library only: the process executor imports it, and the microVM executor ships
this file's source into the guest, where nothing of ringzero is installed. Messages are
length-prefixed JSON: ``run`` arrives, ``call`` goes out for each host tool call and is
answered by ``result`` or ``error``, and ``done`` carries the value, stdout and any error.
Run as a script, it speaks that protocol on stdin/stdout.

What the code makes travels beside its message, not in it: a message the sandbox sends names
the lengths of its data (``"data": [n, ...]``), and each follows as a frame of raw bytes:
a ``call``'s arguments as the JSON text ``[args, kwargs]``, a ``done``'s value as JSON text and
its stdout as UTF-8. So the host parses only small messages, and judges each piece of data by
its length before anything parses it (``boundary.FrameBuffer``). JSON text here is compact and
ASCII, as the host's journal stores it: its length is what the host's limits count.
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

__all__ = ["CONTROL_BYTES", "HEADER", "MAX_DEPTH", "CappedOutput", "deeper_than", "frame", "json_text", "read_frame",
           "run_code"]

HEADER = struct.Struct("!I")
"""A frame's header: the body's length, 4 bytes, network order. The one framing codec: this
file writes and reads frames in the sandbox; the host reads them with ``boundary.FrameBuffer``."""

MAX_DEPTH = 100
"""How deeply lists and dicts may nest in anything that crosses the sandbox boundary. The
sandbox refuses a deeper value itself (a ``ValueError`` the code can catch, or an
``OutputLimitExceeded`` final value), so that only a sandbox that breaks the protocol sends one;
the host refuses it again (``boundary``). ``json`` alone does not stop one: its recursion limit
refused 5,000 levels up to Python 3.12, and 3.13 encodes them."""


def deeper_than(value: Any, limit: int = MAX_DEPTH) -> bool:
    """Whether lists and dicts in ``value`` nest more than ``limit`` levels (iterative: a
    hostile value cannot exhaust the stack here)."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, (list, tuple, dict)):
            if depth > limit:
                return True
            stack.extend((child, depth + 1) for child in (item.values() if isinstance(item, dict) else item))
    return False


CONTROL_BYTES = 256 * 1024
"""The largest message a sandbox may send apart from its data (a ``done``'s error, with an 8 KB
message and traceback, is the largest)."""


def frame(message: Any, *data: bytes) -> bytes:
    """One length-prefixed message, compact UTF-8 JSON (a lone surrogate travels as its JSON
    escape, so any Python str survives), followed by its ``data``, each a frame of raw bytes
    whose lengths the message names."""
    if data:
        message = {**message, "data": [len(d) for d in data]}
    text = json.dumps(message, separators=(",", ":"), ensure_ascii=False).encode("utf-8", "backslashreplace")
    return b"".join([HEADER.pack(len(text)), text, *(HEADER.pack(len(d)) + d for d in data)])


def json_text(value: Any) -> bytes:
    """``value`` as compact ASCII JSON, as the host's journal stores it (NaN travels as its
    literal, for the host to refuse)."""
    return json.dumps(value, separators=(",", ":")).encode("ascii")


def read_frame(read: Callable[[int], bytes]) -> Any:
    """One message, with ``read(n)`` returning exactly n bytes (EOFError at the end)."""
    (length,) = HEADER.unpack(read(HEADER.size))
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


def _tool_proxy(name: str, send: Callable[[bytes], None], receive: Callable[[], Any],
                message_bytes: int) -> Callable[..., Any]:
    def call(*args: Any, **kwargs: Any) -> Any:
        if deeper_than([args, kwargs]):  # the host's own check (``boundary``), and its words
            raise ValueError(f"the arguments to {name}() nests lists or dicts more than {MAX_DEPTH} levels deep")
        arguments = json_text([list(args), kwargs])
        if len(arguments) > message_bytes:
            raise ValueError(f"the arguments to {name}() are too large to send to the host "
                             f"(the limit is {message_bytes} bytes)")
        send(frame({"op": "call", "name": name}, arguments))
        reply = receive()
        if reply["op"] == "error":
            cls = getattr(builtins, reply["type"], None)
            if not (isinstance(cls, type) and issubclass(cls, Exception)):
                cls = type(reply["type"], (Exception,), {})
            raise cls(*reply["args"])
        return reply["value"]

    call.__name__ = name
    return call


def _clip(text: str, limit: int = 8192) -> str:
    return text if len(text) <= limit else text[:limit] + f"... [{len(text) - limit} more characters]"


def _shown(value: Any) -> str:
    """``repr(value)``, or what stands for it where the code made that fail (a raising
    ``__repr__``, ``10 ** 5000``, a value nested too deeply): the code's choice stays its own."""
    try:
        return str(repr(value))
    except RecursionError:
        return "<a value nested too deeply to show>"
    except BaseException as exc:  # whatever the code's __repr__ raises
        return f"<a {type(value).__name__} that cannot be shown: {type(exc).__name__}>"


def _error_of(exc: BaseException) -> dict[str, str]:
    """The code's exception as data; where its text or traceback cannot be made (a raising
    ``__str__``, no memory left to format it), what can be said of it."""
    try:
        message = _clip(str(exc))
    except BaseException:  # the code's own __str__
        message = "<a message that cannot be shown>"
    try:
        trace = _clip("".join(traceback.format_exception(type(exc), exc, exc.__traceback__)))
    except BaseException:  # MemoryError, or the code's __str__ again
        trace = ""
    return {"type": type(exc).__name__, "message": message, "traceback": trace}


def run_code(request: dict[str, Any], send: Callable[[bytes], None], receive: Callable[[], Any],
             output_limit: int, namespace: dict[str, Any] | None = None) -> bytes:
    """Execute ``request["code"]``; the value of a final expression is the result. Returns the
    ``done`` frame: the value's JSON is capped at ``output_limit`` bytes like stdout, and the
    whole at the host's ``message_bytes`` (stdout is cut further if it must be). ``namespace``:
    a session's globals, kept by the caller from one step to the next (a fresh one if None)."""
    message_bytes = int(request.get("message_bytes") or 1 << 62)
    out = CappedOutput(output_limit)
    sys.stdout = sys.stderr = out
    if namespace is None:
        namespace = {"__name__": "__main__"}
    namespace.update(request["inputs"])
    for name in request["tools"]:
        namespace[name] = _tool_proxy(name, send, receive, message_bytes)
    value, error = None, None
    try:
        tree = ast.parse(request["code"], "<sandbox>", "exec")
        last = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) else None
        exec(compile(tree, "<sandbox>", "exec"), namespace)
        if last is not None:
            value = eval(compile(ast.Expression(last.value), "<sandbox>", "eval"), namespace)
    except BaseException as exc:  # the user's error, SystemExit and MemoryError included, is data
        error = _error_of(exc)
    try:
        if deeper_than(value):
            raise RecursionError
        encoded = json_text(value)
    except RecursionError:
        encoded = b"null"
        error = error or {"type": "OutputLimitExceeded", "traceback": "",
                          "message": "the final value nests too deeply to leave the sandbox"}
    except (TypeError, ValueError):  # not JSON (an object; an int past Python's 4,300 digits): its repr
        encoded = json_text(_shown(value))
    if len(encoded) > output_limit:
        message = f"the final value is {len(encoded)} bytes of JSON, over the limit of {output_limit}"
        encoded, error = b"null", {"type": "OutputLimitExceeded", "traceback": "", "message": message}
    stdout = out.value().encode("utf-8", "backslashreplace")
    room = message_bytes - len(encoded) - 65536
    if len(stdout) > room:  # escapes made stdout longer than it counted: keep what fits
        stdout = stdout[:max(0, room)].decode("utf-8", "ignore").encode() + b"\n[output truncated]"
    return frame({"op": "done", "error": error}, encoded, stdout)


def _main() -> None:  # pragma: no cover - runs inside the microVM guest
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer

    def read(n: int) -> bytes:
        data = stdin.read(n)
        if len(data) < n:
            raise EOFError("the host closed stdin")
        return data

    def send(data: bytes) -> None:
        stdout.write(data)
        stdout.flush()

    request = read_frame(read)
    send(run_code(request, send, lambda: read_frame(read), int(request.get("output_bytes", 1 << 20))))


if __name__ == "__main__":  # pragma: no cover
    _main()
