"""How ringzero calls a host tool: the one place that decides how a tool runs.

A coroutine function is awaited; a plain function runs in a thread of a bounded
:class:`~ringzero.core.support.tool_pool.ToolPool` (its context is the caller's, so a kernel process's
``ctx`` is seen there), so a slow tool stalls only its caller, never the event loop; one
declared :func:`~ringzero.core.support.tool_pool.cpu_bound` runs in a worker process. A tool that
exits (``SystemExit``, ``KeyboardInterrupt``) fails that call only. Used by ``ctx.tool`` and
by every executor's tool calls; inside a kernel process's ``ctx.exec`` each call is journaled
on its own, by the ``ToolCallJournal`` the executor was handed (``ringzero.core._engine.tool_calls``).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
from collections.abc import Awaitable, Callable
from typing import Any

from ringzero.core.contract.protocols import Tool, ToolCallJournal
from ringzero.core.support.loop_pool import wait_for_loop
from ringzero.core.support.telemetry import exec_tool_span
from ringzero.core.support.tool_pool import CallHere, ToolPool, as_exception, is_cpu_bound, shared_pool

__all__ = ["ResultCheck", "SyncRunner", "call_tool", "call_tool_here", "is_async", "runs_here"]


SyncRunner = Callable[[Tool, list[Any], dict[str, Any]], Awaitable[Any]]
"""How a sync tool is run off the loop: a pool's ``run``, with its owner and result limit bound."""
ResultCheck = Callable[[Any], Awaitable[None]]
"""Judges a tool's result before anyone keeps it: raises ``ResultRefused`` for one that may not cross."""


async def call_tool(tool: Tool, args: list[Any], kwargs: dict[str, Any], *, name: str | None = None,
                    run: SyncRunner | None = None, check: ResultCheck | None = None,
                    calls: ToolCallJournal | None = None) -> Any:
    """Call a host tool off the event loop: awaited if it is async, else through ``run`` (a
    tool pool's ``run``; the host's shared pool where not given: the thread's context carries
    the caller's, so a kernel process's ``ctx`` is seen there). ``check`` judges the result as
    soon as the tool returns, before the journal keeps it.

    Which arguments sandboxed code may pass is decided before this, at the boundary
    (``ringzero.core.support.tool_parameters``): a call arrives here bound and allowed.

    With ``calls`` (what ``ctx.exec`` hands its executor), the call is journaled under the exec
    (``name`` identifies it there; the tool's own name where not given): a recorded one is
    answered from the journal when the code runs again after a crash."""
    if calls is not None:
        return await calls.call(name or str(getattr(tool, "__qualname__", None) or repr(tool)), tool, args, kwargs,
                                functools.partial(_live, run=run, name=name, check=check), check)
    return await _live(tool, args, kwargs, run, name, check)


def runs_here(tool: Tool) -> bool:
    """True for a tool ``call_tool_here`` may run: a plain sync callable (not a coroutine
    function, not declared ``cpu_bound``)."""
    return not (is_async(tool) or is_cpu_bound(tool))


def is_async(tool: Tool) -> bool:
    """A coroutine function, or an object whose ``__call__`` is one."""
    return inspect.iscoroutinefunction(tool) or inspect.iscoroutinefunction(getattr(tool, "__call__", None))  # noqa: B004


def call_tool_here(tool: Tool, args: list[Any], kwargs: dict[str, Any], *, pool: ToolPool, call: CallHere,
                   loop: asyncio.AbstractEventLoop) -> Any:
    """``call_tool`` for a tool ``runs_here`` in the calling thread, which is not ``loop``'s
    (``pool.run_here``): what an engine that calls host functions from a thread of its own uses
    (Monty's ``feed_run``), with no hop to a pool thread. An awaitable the tool returns is
    awaited on ``loop``. Never journaled: a journaled call's intent and record are written on
    the loop, so it goes through ``call_tool``."""
    span = exec_tool_span(tool, call.name)
    if span is None:
        result = pool.run_here(tool, args, kwargs, call)
    else:
        with span:
            result = pool.run_here(tool, args, kwargs, call)
    if type(result) not in _PLAIN and inspect.isawaitable(result):
        result = wait_for_loop(asyncio.run_coroutine_threadsafe(_awaited(result), loop), loop)
    return result


_PLAIN = frozenset({int, float, str, bool, list, dict, type(None)})
"""What most tools return: never awaitable (``inspect.isawaitable`` costs more than the call)."""


async def _awaited(awaitable: Awaitable[Any]) -> Any:
    return await awaitable


async def _live(tool: Tool, args: list[Any], kwargs: dict[str, Any], run: SyncRunner | None = None,
                name: str | None = None, check: ResultCheck | None = None) -> Any:
    span = exec_tool_span(tool, name)
    with span if span is not None else contextlib.nullcontext():
        result = await _call(tool, args, kwargs, run)
        if check is not None:
            await check(result)
        return result


async def _call(tool: Tool, args: list[Any], kwargs: dict[str, Any], run: SyncRunner | None) -> Any:
    try:
        if is_async(tool):
            return await tool(*args, **kwargs)
        result = await (run or shared_pool().run)(tool, args, kwargs)
        if inspect.isawaitable(result):
            result = await result
        return result
    except (SystemExit, KeyboardInterrupt, GeneratorExit) as exc:
        # A tool's own exit (argparse given a bad flag by the code exits 2) is that call's error,
        # never the host's: it goes on as an Exception of the same name and arguments.
        raise as_exception(exc) from None
