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
under their exec's slot (``ringzero.core._engine.tool_calls.ToolCalls``, which ``ctx.exec`` hands the
executor as ``calls``): when the code runs again after a crash, each call already recorded is
answered from the journal, in order, and only the one in flight can be in doubt.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any, TypeVar

from ringzero.core.contract.errors import InvalidArgument
from ringzero.core.contract.fingerprints import canonical_json
from ringzero.core.contract.json_data import JSON
from ringzero.core.contract.outcomes import Failure, Outcome, Value, exception_of
from ringzero.core.support.tool_parameters import IDEMPOTENCY_KEY, declare, declared

__all__ = ["IN_DOUBT_CHOICES", "check_in_doubt", "idempotent", "in_doubt_report", "retry_safe", "served",
           "takes_idempotency_key", "tool_summary"]

F = TypeVar("F", bound=Callable[..., Any])


def idempotent(tool: F) -> F:
    """Mark ``tool`` as safe to run again: a call of it that was in flight when its host died
    is run again on resume rather than raised as ``ToolInDoubt``. Use it for reads, and for
    writes that the other side deduplicates by their own arguments."""
    return declare(tool, "__ringzero_idempotent__", True)


def takes_idempotency_key(tool: Any) -> bool:
    """Whether ``tool`` has a keyword parameter named ``idempotency_key`` that nobody bound: a
    function, or a framework's tool object whose body does (a LangChain tool's ``func`` or
    ``coroutine``, a CrewAI ``@tool``'s ``func``, a ``BaseTool`` subclass's ``_run``)."""
    if isinstance(tool, functools.partial) and IDEMPOTENCY_KEY in tool.keywords:
        return False
    if not inspect.isroutine(tool) and not isinstance(tool, functools.partial):
        bodies = [getattr(tool, name, None) for name in ("func", "coroutine", "_run")]
        if any(body is not None and _has_key(body) for body in bodies):
            return True
    return _has_key(tool)


def _has_key(tool: Any) -> bool:
    try:
        parameter = inspect.signature(tool).parameters.get(IDEMPOTENCY_KEY)
    except (TypeError, ValueError):
        return False
    return parameter is not None and parameter.kind in (parameter.POSITIONAL_OR_KEYWORD, parameter.KEYWORD_ONLY)


IN_DOUBT_CHOICES = ("raise", "report")
"""What a framework's tool node does with an in-doubt call (``KernelToolNode(in_doubt=)``,
``kickoff(in_doubt=)``): raise ``ToolInDoubt`` out of the graph or crew to the program, or
report it to the model as the call's error, so that the run goes on."""


def check_in_doubt(choice: Any) -> str:
    """``choice`` if it is one of ``IN_DOUBT_CHOICES``; InvalidArgument naming them otherwise."""
    if choice not in IN_DOUBT_CHOICES:
        raise InvalidArgument(f"in_doubt must be one of {', '.join(map(repr, IN_DOUBT_CHOICES))}, not {choice!r}")
    return str(choice)


def in_doubt_report(name: str) -> str:
    """The text a model is given for an in-doubt call of tool ``name`` (``in_doubt="report"``):
    the same live and on every replay."""
    return (f"Error: the outcome of this {name} call is unknown. It was running when its host stopped, so it may "
            "or may not have taken effect, and it was not run again. Check whether it took effect before you call "
            "it again.")


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


def served(outcome: Outcome) -> JSON:
    """A recorded call's outcome (as ``ctx.journaled_tool`` returns it) for the code: its value,
    or its exception raised again (``ringzero.core.contract.outcomes.exception_of``)."""
    if isinstance(outcome, Failure):
        raise exception_of(outcome)
    return outcome.value if isinstance(outcome, Value) else None
