"""One converter between an exception and a recorded failure: what the journal keeps of an
exception a tool (or the code that called it, or a provider) raised, and the exception a
replay raises again from it.

A failure record is ``{"type": name, "message": text, "args": [...]}``: the type's name, its
text and, where they are not just that text, its arguments, each clipped to ``ERROR_CHARS``
(a tool's exception may carry megabytes). Records written before ``message`` existed (a tool
called from code kept ``args`` alone) read as well.
"""

from __future__ import annotations

import builtins
from collections.abc import Mapping
from typing import Any

from ringzero.core.contract import errors
from ringzero.core.contract.types import JSON

__all__ = ["ERROR_CHARS", "clip", "exception_of", "failure", "message_of"]

ERROR_CHARS = 2000
"""The most of a tool's error text the host keeps (in a run's record, in the journal) or shows
the code."""


def clip(text: str, limit: int = ERROR_CHARS) -> str:
    """``text`` cut to ``limit`` characters, with a note of how many more there were."""
    return text if len(text) <= limit else text[:limit] + f"... [{len(text) - limit} more characters]"


def failure(exc: BaseException, **extra: JSON) -> dict[str, JSON]:
    """``exc`` as the journal keeps it (see the module docstring), with ``extra`` fields. Its
    arguments are kept where they are more than its message (most exceptions have one, their
    message: it is kept once)."""
    message = clip(str(exc))
    record: dict[str, JSON] = {"type": type(exc).__name__, "message": message, **extra}
    if len(exc.args) == 1 and isinstance(exc.args[0], str) and clip(exc.args[0]) == message:
        return record
    args: list[JSON] = []
    room = ERROR_CHARS
    for arg in exc.args:
        if isinstance(arg, (int, bool)) or arg is None:
            args.append(arg)
        else:
            text = clip(str(arg), room)
            room = max(0, room - len(text))
            args.append(text)
    record["args"] = args
    return record


def message_of(record: Mapping[str, Any]) -> str:
    """A failure record's text."""
    message = record.get("message")
    if message is None:
        message = " ".join(str(a) for a in record.get("args") or ())
    return str(message)


def exception_of(record: Mapping[str, Any]) -> Exception:
    """The exception a failure record stands for: the built-in or ringzero error of that name
    (so that a ``ToolError``'s message reads on replay as it did live), else an exception class
    of that name, made with the recorded arguments."""
    name = str(record.get("type") or "Exception")
    args = record.get("args")
    if args is None:
        args = [message_of(record)]
    for home in (builtins, errors):
        cls = getattr(home, name, None)
        if isinstance(cls, type) and issubclass(cls, Exception):
            try:
                return cls(*args)
            except TypeError:  # an error whose constructor takes other arguments
                continue
    return errors.exception_named(name)(*args)
