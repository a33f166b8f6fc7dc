"""Effects that must not happen twice: tool calls, their intents, and the tools safe to repeat.

A tool call is an effect on the world (a payment, an e-mail). Before one starts, its intent is
recorded; its result is recorded when it returns. A resumed process that finds an intent
without a result knows the call was in flight when its host died, and that it may or may not
have had its effect: it is *in doubt*. Such a call runs again only where that is safe: the
tool is marked :func:`idempotent`, or it takes an ``idempotency_key`` parameter, which the
kernel fills with the same key on every attempt (``rz-<pid>-<spawn time>-<slot>``: payment
and e-mail APIs deduplicate on such keys). Any other in-doubt call becomes ``ToolInDoubt`` in
the program, which decides.

Tools that sandboxed code calls (``ctx.exec(code, tools=...)``) are journaled one by one
under their exec's slot (:class:`NestedCalls`): when the code runs again after a crash, each
call already recorded is answered from the journal, in order, and only the one in flight can
be in doubt. Every built-in executor calls tools through ``ringzero.core.host_tools.call_tool``,
which hands the call to the exec's ``NestedCalls``; an executor of your own gets the same by
calling its tools through it.
"""

from __future__ import annotations

import builtins
import contextvars
import functools
import inspect
import json
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

from ringzero.core import errors
from ringzero.core.errors import CheckpointerError, RingzeroError, ToolInDoubt
from ringzero.core.journal import canonical_json, diverged, fingerprint
from ringzero.core.tool_parameters import IDEMPOTENCY_KEY, declare, declared
from ringzero.core.types import JSON, strict_json

if TYPE_CHECKING:
    from ringzero.core.journal import Journal

__all__ = ["ERROR_CHARS", "NESTED_CALLS", "NestedCalls", "clip", "error_record", "idempotent", "retry_safe", "served",
           "takes_idempotency_key", "tool_summary"]

F = TypeVar("F", bound=Callable[..., Any])


def idempotent(tool: F) -> F:
    """Mark ``tool`` as safe to run again: a call of it that was in flight when its host died
    is run again on resume rather than raised as ``ToolInDoubt``. Use it for reads, and for
    writes that the other side deduplicates by their own arguments."""
    return declare(tool, "__ringzero_idempotent__", True)


def takes_idempotency_key(tool: Any) -> bool:
    """Whether ``tool`` has a keyword parameter named ``idempotency_key`` that nobody bound."""
    if isinstance(tool, functools.partial) and IDEMPOTENCY_KEY in tool.keywords:
        return False
    try:
        parameter = inspect.signature(tool).parameters.get(IDEMPOTENCY_KEY)
    except (TypeError, ValueError):
        return False
    return parameter is not None and parameter.kind in (parameter.POSITIONAL_OR_KEYWORD, parameter.KEYWORD_ONLY)


def retry_safe(tool: Any) -> bool:
    """Whether an in-doubt call of ``tool`` may run again: marked :func:`idempotent` (itself, or
    the function a ``functools.partial`` wraps), or it takes an idempotency key."""
    return bool(declared(tool, "__ringzero_idempotent__")) or takes_idempotency_key(tool)


def tool_summary(name: str, args: Any, kwargs: Any) -> str:
    """A tool call as its journal record and its errors show it: ``name(arguments…)``, the
    arguments as compact JSON (one encoding each: it runs at every tool call)."""
    shown = canonical_json(list(args))[1:-1]
    if kwargs:
        shown = f"{shown},{canonical_json(kwargs)[1:-1]}" if shown else canonical_json(kwargs)[1:-1]
    shown = " ".join(shown[:160].split())
    return f"{name}({shown if len(shown) <= 80 else shown[:79] + '…'})"


NESTED_CALLS: contextvars.ContextVar[NestedCalls | None] = contextvars.ContextVar("ringzero_nested_calls",
                                                                                  default=None)
"""The journal of the exec whose code is running in this context: set by ``ctx.exec`` around
the executor's run, and unset inside each tool it runs (a tool's own calls are its effect)."""

PlainCall = Callable[[Any, list[Any], dict[str, Any]], Awaitable[Any]]


class NestedCalls:
    """The tool calls that one exec's code makes, each journaled under the exec's slot.

    The n-th call takes key ``<slot>.<n>`` when it starts, in the order the code makes them.
    A recorded one is answered from the journal (its value, or its error raised again), after
    checking that the code asks for the same tool and arguments; a new one records its intent,
    runs, and records its outcome. Where a call cannot go on (it diverged from its record, it
    is in doubt, the store failed), the run is abandoned: that call and every later one raise
    in the code, and ``ctx.exec`` raises ``problem`` once the executor returns."""

    def __init__(self, journal: Journal, pid: int, slot: str, key_prefix: str) -> None:
        self.journal = journal
        self.pid = pid
        self.slot = slot
        self.key_prefix = key_prefix
        self.problem: RingzeroError | None = None
        self.served = 0
        """Calls answered from the journal."""
        self.rerun = 0
        """In-doubt calls run again because their tool is safe to repeat."""
        self._count = 0

    async def call(self, name: str, tool: Any, args: list[Any], kwargs: dict[str, Any], plain: PlainCall,
                   check: Callable[[Any], Awaitable[None]] | None = None) -> Any:
        """The call's outcome: served from the journal, or ``plain`` run live (which judges the
        result with ``check`` before it is recorded; a served result passes ``check`` too, so the
        run's budget is charged as it was when the call was made)."""
        self._count += 1  # taken before anything is awaited: the order the code made the calls in
        key = f"{self.slot}.{self._count}"
        if self.problem is not None:
            raise self._abandoned()
        fp = fingerprint({"name": name, "args": args, "kwargs": kwargs})
        summary = tool_summary(name, args, kwargs)
        rerun = False
        try:
            if self.journal.resumed:
                effects = await self.journal.effects()
                entry = effects.calls.get(key)
                if entry is not None:
                    if entry.kind != "tool" or entry.fingerprint != fp:
                        raise self._abandon(diverged(self.pid, key, (entry.kind, entry.fingerprint, entry.summary),
                                                     ("tool", fp, summary)))
                    self.served += 1
                    value = served(entry.outcome)
                    if check is not None:
                        await check(value)
                    return value
                if key in effects.intents:
                    if not retry_safe(tool):
                        raise self._abandon(ToolInDoubt(self.pid, name, key, summary))
                    rerun = True
            await self.journal.record_intent(key, "tool", fp, summary)
        except CheckpointerError as exc:
            raise self._abandon(exc) from None
        if takes_idempotency_key(tool):
            kwargs = {**kwargs, IDEMPOTENCY_KEY: self.key_prefix + key}
        marker: dict[str, JSON] = {"rerun": "in_doubt"} if rerun else {}
        self.rerun += rerun
        token = NESTED_CALLS.set(None)
        try:
            value = await plain(tool, args, kwargs)
        except Exception as exc:
            await self._record(key, fp, summary, {"error": error_record(exc), **marker})
            raise
        finally:
            NESTED_CALLS.reset(token)
        try:
            text = strict_json(value)
        except (TypeError, ValueError) as exc:
            error = ValueError(f"the result of {name}() is not JSON-compatible: {exc}")
            await self._record(key, fp, summary, {"error": error_record(error), **marker})
            raise error from None
        # The code gets what a replay would serve it: the result as the journal holds it.
        value = json.loads(text)
        await self._record(key, fp, summary, {"value": value, **marker})
        return value

    async def _record(self, key: str, fp: str, summary: str, outcome: dict[str, JSON]) -> None:
        try:
            await self.journal.record_call(key, "tool", fp, summary, outcome)
        except CheckpointerError as exc:
            raise self._abandon(exc) from None

    def _abandon(self, problem: RingzeroError) -> RuntimeError:
        if self.problem is None:
            self.problem = problem
        return self._abandoned()

    def _abandoned(self) -> RuntimeError:
        return RuntimeError(f"ringzero stops this run: {type(self.problem).__name__} (no further tool runs)")


ERROR_CHARS = 2000
"""The most of a tool's error text the host keeps (in a run's record, in the journal) or shows
the code: a tool's exception may carry megabytes."""


def clip(text: str, limit: int = ERROR_CHARS) -> str:
    """``text`` cut to ``limit`` characters, with a note of how many more there were."""
    return text if len(text) <= limit else text[:limit] + f"... [{len(text) - limit} more characters]"


def error_record(exc: BaseException) -> dict[str, JSON]:
    """A tool's exception as the journal keeps it: its type's name and its arguments, their
    text ``ERROR_CHARS`` in all."""
    args: list[JSON] = []
    room = ERROR_CHARS
    for arg in exc.args:
        if isinstance(arg, (int, bool)) or arg is None:
            args.append(arg)
        else:
            text = clip(str(arg), room)
            room = max(0, room - len(text))
            args.append(text)
    return {"type": type(exc).__name__, "args": args}


def served(outcome: dict[str, Any]) -> Any:
    """A recorded call's outcome for the code: its value, or its exception raised again (the
    built-in or ringzero error of that name, so that a ``ToolError``'s message is shown on replay
    as it was live; else an exception class of that name)."""
    if "error" not in outcome:
        return outcome.get("value")
    error = outcome["error"]
    name = str(error.get("type") or "Exception")
    args = error.get("args", [])
    for home in (builtins, errors):
        cls = getattr(home, name, None)
        if isinstance(cls, type) and issubclass(cls, Exception):
            try:
                exc = cls(*args)
            except TypeError:  # an error whose constructor takes other arguments
                continue
            raise exc
    raise errors.exception_named(name)(*args)
