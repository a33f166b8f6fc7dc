"""How ringzero calls a host tool: the one place that decides how a tool runs.

A coroutine function is awaited; a plain function runs in a thread of a bounded
:class:`~ringzero.core.tool_pool.ToolPool` (its context is the caller's, so a kernel process's
``ctx`` is seen there), so a slow tool stalls only its caller, never the event loop; one
declared :func:`~ringzero.core.tool_pool.cpu_bound` runs in a worker process. A tool that
exits (``SystemExit``, ``KeyboardInterrupt``) fails that call only. Used by ``ctx.tool`` and
by every executor's tool calls; inside a kernel process's ``ctx.exec`` each call is journaled
on its own (``ringzero.core.effects``).
"""

from __future__ import annotations

import functools
import inspect
from typing import Any

from ringzero.core.effects import NESTED_CALLS
from ringzero.core.protocols import Tool
from ringzero.core.telemetry import exec_tool_span
from ringzero.core.tool_pool import ToolPool, as_exception, shared_pool

__all__ = ["call_tool"]


async def call_tool(tool: Tool, args: list[Any], kwargs: dict[str, Any], *, name: str | None = None,
                    pool: ToolPool | None = None) -> Any:
    """Call a host tool off the event loop: awaited if it is async, else in a thread of ``pool``
    (the host's shared pool where not given; the thread's context carries the caller's, so a
    kernel process's ``ctx`` is seen there).

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
                                functools.partial(_live, pool=pool, name=name))
    return await _live(tool, args, kwargs, pool, name)


async def _live(tool: Tool, args: list[Any], kwargs: dict[str, Any], pool: ToolPool | None = None,
                name: str | None = None) -> Any:
    span = exec_tool_span(tool, name)
    if span is None:
        return await _call(tool, args, kwargs, pool)
    with span:
        return await _call(tool, args, kwargs, pool)


async def _call(tool: Tool, args: list[Any], kwargs: dict[str, Any], pool: ToolPool | None) -> Any:
    try:
        if inspect.iscoroutinefunction(tool) or inspect.iscoroutinefunction(getattr(tool, "__call__", None)):  # noqa: B004
            return await tool(*args, **kwargs)
        result = await (pool or shared_pool()).run(tool, args, kwargs)
        if inspect.isawaitable(result):
            result = await result
        return result
    except (SystemExit, KeyboardInterrupt, GeneratorExit) as exc:
        # A tool's own exit (argparse given a bad flag by the code exits 2) is that call's error,
        # never the host's: it goes on as an Exception of the same name and arguments.
        raise as_exception(exc) from None
