"""How ringzero calls a host tool: the one place that decides how a tool runs.

A coroutine function is awaited; a plain function runs in a worker thread (its context is the
caller's, so a kernel process's ``ctx`` is seen there), so a slow tool stalls only its caller,
never the event loop. A tool that exits (``SystemExit``, ``KeyboardInterrupt``) fails that call
only. Used by ``ctx.tool`` and by every executor's tool calls; inside a kernel
process's ``ctx.exec`` each call is journaled on its own (``ringzero.core.effects``).
"""

from __future__ import annotations

import asyncio
import functools
import inspect
from typing import Any

from ringzero.core.effects import NESTED_CALLS
from ringzero.core.protocols import Tool
from ringzero.core.telemetry import exec_tool_span

__all__ = ["call_tool"]


async def call_tool(tool: Tool, args: list[Any], kwargs: dict[str, Any], *, name: str | None = None) -> Any:
    """Call a host tool off the event loop: awaited if it is async, else in a worker thread
    (the thread's context carries the caller's, so a kernel process's ``ctx`` is seen there).

    A keyword the host bound with :func:`functools.partial` (``partial(search, api_key=KEY)``)
    is the host's: the code naming it gets a ``TypeError`` rather than overriding it, so such a
    keyword is a safe place for a secret. Any other parameter, defaults included, is the code's.

    Called by code that a kernel process runs through ``ctx.exec``, the call is journaled under
    the exec (``name`` identifies it there; the tool's own name where not given): a recorded one
    is answered from the journal when the code runs again after a crash."""
    fixed = sorted(set(kwargs) & set(tool.keywords)) if isinstance(tool, functools.partial) else []
    if fixed:
        raise TypeError(f"argument {fixed[0]!r} is fixed by the host and cannot be passed")
    calls = NESTED_CALLS.get()
    if calls is not None:
        return await calls.call(name or str(getattr(tool, "__qualname__", None) or repr(tool)), tool, args, kwargs,
                                _live)
    return await _live(tool, args, kwargs)


async def _live(tool: Tool, args: list[Any], kwargs: dict[str, Any]) -> Any:
    span = exec_tool_span(tool)
    if span is None:
        return await _call(tool, args, kwargs)
    with span:
        return await _call(tool, args, kwargs)


async def _call(tool: Tool, args: list[Any], kwargs: dict[str, Any]) -> Any:
    try:
        if inspect.iscoroutinefunction(tool) or inspect.iscoroutinefunction(getattr(tool, "__call__", None)):  # noqa: B004
            return await tool(*args, **kwargs)
        result = await asyncio.to_thread(tool, *args, **kwargs)
        if inspect.isawaitable(result):
            result = await result
        return result
    except (SystemExit, KeyboardInterrupt, GeneratorExit) as exc:
        # A tool's own exit (argparse given a bad flag by the code exits 2) is that call's error,
        # never the host's: it goes on as an Exception of the same name and arguments.
        raise _as_exception(exc) from None


@functools.cache
def _exception_named(name: str) -> type[Exception]:
    return type(name, (Exception,), {"__module__": "ringzero.core.host_tools"})


def _as_exception(exc: BaseException) -> Exception:
    """An Exception of ``exc``'s name and arguments: what a tool's SystemExit, KeyboardInterrupt
    or GeneratorExit becomes, so that every handler of a tool's failure sees it, and it never
    reaches the event loop (which stops on either of the first two)."""
    return _exception_named(type(exc).__name__)(*exc.args)
