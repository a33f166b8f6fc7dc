"""What a syscall's record says happened, as four frozen types (named tuples: one is made at
every syscall, where a frozen dataclass costs twice as much; each equal only to its own kind),
with the one codec to and from the store's JSON and the one converter between an exception and
a recorded failure.

================  ================================================  ===============================
type              what happened                                     stored as
================  ================================================  ===============================
``Value``         it returned ``value``                             ``{"value": ..., **beside}``
``Failure``       it raised (a tool's exception, a provider's       ``{"error": {"type", "message",
                  error): its type's name, text and arguments       "args"?, **details}, **beside}``
``Stopped``       the child it waited for ended without exiting     ``{"error": {"status", "reason",
                                                                    "detail"}, **beside}``
``InDoubt``       an effect in flight at a crash, not safe to       ``{"in_doubt": {"slot", "summary",
                  repeat                                            "tool"?}, **beside}``
================  ================================================  ===============================

``beside`` holds what a syscall keeps next to its outcome: a checkpoint's ``state``, an exec's
``nested`` costs and ``calls`` served, ``rerun: "in_doubt"`` for an effect run again. The stored
shapes are those the journal always had: records written before these types read as they were.

A failure's text is clipped to ``ERROR_CHARS`` (a tool's exception may carry megabytes); its
arguments are kept only where they are more than that text. Records written before ``message``
existed (a tool called from code kept ``args`` alone) read as well.
"""

from __future__ import annotations

import builtins
import importlib
import sys
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, NamedTuple, Union

from ringzero.core.contract import errors
from ringzero.core.contract.json_data import JSON

__all__ = ["ERROR_CHARS", "NONE", "Failure", "InDoubt", "Outcome", "Stopped", "Value", "clip", "decode", "exception_of",
           "failure", "number", "rebuilt", "tool_exception", "with_beside"]

NOTHING: Mapping[str, JSON] = MappingProxyType({})
"""The empty mapping most outcomes keep beside them: one, read-only."""

def _same_kind_eq(self: tuple[Any, ...], other: object) -> bool:
    """An outcome equals only an outcome of its own kind (a named tuple alone equals any tuple)."""
    return type(other) is type(self) and tuple.__eq__(self, other)


def _same_kind_ne(self: tuple[Any, ...], other: object) -> bool:
    return not _same_kind_eq(self, other)


ERROR_CHARS = 2000
"""The most of a tool's error text the host keeps (in a run's record, in the journal) or shows
the code."""


class Value(NamedTuple):
    """The syscall returned ``value``."""

    value: JSON = None
    beside: Mapping[str, JSON] = NOTHING

    def to_json(self) -> dict[str, JSON]:
        return {"value": self.value, **self.beside} if self.beside else {"value": self.value}



class Failure(NamedTuple):
    """The syscall raised: the exception's type name, text and (where they are more than its
    text) arguments; ``details``: what else its kind records (an LLM call's ``retry_after``)."""

    type: str
    message: str
    args: tuple[JSON, ...] | None = None
    details: Mapping[str, JSON] = NOTHING
    beside: Mapping[str, JSON] = NOTHING

    def to_json(self) -> dict[str, JSON]:
        error: dict[str, JSON] = {"type": self.type, "message": self.message}
        if self.args is not None:
            error["args"] = list(self.args)
        return {"error": {**error, **self.details}, **self.beside}



class Stopped(NamedTuple):
    """The child process a ``wait`` waited for ended without exiting: its status, why, and what
    it raised."""

    status: str
    reason: str | None
    detail: dict[str, str] | None = None
    beside: Mapping[str, JSON] = NOTHING

    def to_json(self) -> dict[str, JSON]:
        detail: JSON = None if self.detail is None else dict(self.detail)
        return {"error": {"status": self.status, "reason": self.reason, "detail": detail}, **self.beside}



class InDoubt(NamedTuple):
    """An effect that was in flight when its host died, and may not run again: ``slot`` is its
    place in the journal; ``tool`` names the tool where sandboxed code called it."""

    slot: str
    summary: str
    tool: str | None = None
    beside: Mapping[str, JSON] = NOTHING

    def to_json(self) -> dict[str, JSON]:
        body: dict[str, JSON] = {"slot": self.slot, "summary": self.summary}
        if self.tool is not None:
            body["tool"] = self.tool
        return {"in_doubt": body, **self.beside}



Outcome = Union[Value, Failure, Stopped, InDoubt]

for _kind in (Value, Failure, Stopped, InDoubt):  # equal only to their own kind (a named tuple alone is not)
    setattr(_kind, "__eq__", _same_kind_eq)  # noqa: B010  (a NamedTuple's body may hold fields and methods only)
    setattr(_kind, "__ne__", _same_kind_ne)  # noqa: B010

NONE = Value(None)
"""The outcome of a syscall that returns nothing (a send, a sleep): one object for all of them."""


def decode(record: Mapping[str, Any]) -> Outcome:
    """The outcome a stored record (the JSON object of its ``outcome``) stands for."""
    beside = NOTHING if len(record) == 1 else \
        {k: v for k, v in record.items() if k not in ("value", "error", "in_doubt")}
    if "in_doubt" in record:
        doubt = record["in_doubt"]
        tool = doubt.get("tool")
        return InDoubt(str(doubt.get("slot")), str(doubt.get("summary", "")), None if tool is None else str(tool),
                       beside)
    error = record.get("error")
    if isinstance(error, Mapping):
        if "type" not in error and "status" in error:
            reason, detail = error.get("reason"), error.get("detail")
            return Stopped(str(error["status"]), None if reason is None else str(reason),
                           {str(k): str(v) for k, v in detail.items()} if isinstance(detail, Mapping) else None, beside)
        args = error.get("args")
        details = {k: v for k, v in error.items() if k not in ("type", "message", "args")}
        message = error.get("message")
        if message is None:
            message = " ".join(str(a) for a in args or ())
        return Failure(str(error.get("type") or "Exception"), str(message), None if args is None else tuple(args),
                       details or NOTHING, beside)
    return Value(record.get("value"), beside)


def with_beside(outcome: Outcome, **beside: JSON) -> Outcome:
    """``outcome`` with ``beside`` added to what it keeps beside it."""
    return outcome._replace(beside={**outcome.beside, **beside})


def clip(text: str, limit: int = ERROR_CHARS) -> str:
    """``text`` cut to ``limit`` characters, with a note of how many more there were."""
    return text if len(text) <= limit else text[:limit] + f"... [{len(text) - limit} more characters]"


def failure(exc: BaseException, **details: JSON) -> Failure:
    """``exc`` as the journal keeps it (see the module docstring), with ``details``; an
    exception of a class found neither among the built-ins nor among ringzero's errors keeps its
    class's import path (``"class": "module:QualName"``, where it has one), so that it is raised
    again as itself (``rebuilt``)."""
    reference = _class_reference(type(exc))
    if reference is not None:
        details = {**details, CLASS: reference}
    message = clip(str(exc))
    if len(exc.args) == 1 and isinstance(exc.args[0], str) and clip(exc.args[0]) == message:
        return Failure(type(exc).__name__, message, None, details or NOTHING)
    args: list[JSON] = []
    room = ERROR_CHARS
    for arg in exc.args:
        if isinstance(arg, (int, bool)) or arg is None:
            args.append(arg)
        else:
            text = clip(str(arg), room)
            room = max(0, room - len(text))
            args.append(text)
    return Failure(type(exc).__name__, message, tuple(args), details or NOTHING)


def exception_of(failed: Failure) -> Exception:
    """The exception a failure stands for: ``rebuilt``, else an exception class of that name,
    made with the recorded arguments (its text where none were kept)."""
    rebuilt_one = rebuilt(failed)
    if rebuilt_one is not None:
        return rebuilt_one
    return errors.exception_named(failed.type)(*_arguments(failed))


def rebuilt(failed: Failure) -> Exception | None:
    """The exception a failure recorded, as its own class, where that class imports and takes
    the recorded arguments: the class of the recorded import path (``failure``), else the
    built-in or ringzero error of that name (so that a ``ToolError``'s message reads on replay
    as it did live). None where neither is so: a class defined in a function or in
    ``__main__``, one that is gone, one whose constructor takes other arguments."""
    args = _arguments(failed)
    reference = failed.details.get(CLASS)
    if isinstance(reference, str):
        cls = _imported_class(reference)
        return None if cls is None else _made(cls, args)
    for home in (builtins, errors):
        cls = getattr(home, failed.type, None)
        if isinstance(cls, type) and issubclass(cls, Exception):
            made = _made(cls, args)
            if made is not None:
                return made
    return None


def tool_exception(tool: str, failed: Failure, original: BaseException | None = None) -> Exception:
    """What a program's tool call that failed raises: the tool's exception as its own class
    where it is ``rebuilt`` from the record, else ``ToolFailed`` naming its type. Live and on
    replay alike (made from the record both times, its text clipped as the journal keeps it),
    so that ``except CardDeclined:`` matches both or neither; live, it carries the traceback of
    ``original``, the exception the tool raised."""
    error = rebuilt(failed) or errors.ToolFailed(tool, failed.type, failed.message)
    return error if original is None else error.with_traceback(original.__traceback__)


CLASS = "class"
"""The key of a failure's details that holds its exception's ``module:QualName``."""


def _arguments(failed: Failure) -> tuple[JSON, ...]:
    return failed.args if failed.args is not None else (failed.message,)


def _made(cls: type[Exception], args: tuple[JSON, ...]) -> Exception | None:
    try:
        return cls(*args)
    except Exception:  # a constructor that takes other arguments (or fails on these)
        return None


def _class_reference(cls: type[BaseException]) -> str | None:
    """``module:QualName`` of an exception class that a resumed host can import, where the
    built-ins and ringzero's errors do not already name it; None for those and for a class that
    does not import back (defined in a function, in ``__main__``, made at run time)."""
    module, qualname = cls.__module__, cls.__qualname__
    if module in ("builtins", "__main__", errors.__name__) or "<" in qualname:
        return None
    return f"{module}:{qualname}" if _imported_class(f"{module}:{qualname}") is cls else None


def _imported_class(reference: str) -> type[Exception] | None:
    """The Exception class at ``module:QualName`` (imported where it is not yet), or None."""
    module_name, _, qualname = reference.partition(":")
    module = sys.modules.get(module_name)
    if module is None:
        try:
            module = importlib.import_module(module_name)
        except Exception:
            return None
    found: Any = module
    for part in qualname.split("."):
        found = getattr(found, part, None)
    return found if isinstance(found, type) and issubclass(found, Exception) else None


def number(value: JSON) -> float:
    """A recorded number (0 for none): what a budget or a metric reads from a record."""
    return float(value) if isinstance(value, (int, float)) else 0.0
