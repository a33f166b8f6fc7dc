"""Where an adapter's call runs: the one routing helper every adapter uses.

A framework object (a chat model, a sandboxed tool, a saver) may be called inside a kernel
process or outside any. Inside, its work is the process's syscall and runs on the process's
loop: awaited directly there, forwarded there from another loop of the process (CrewAI runs one
in a thread), or sent there from a worker thread (``Context.call_from_thread``). Outside, it
runs on the object's own home loop (``LoopHome``), or where the caller is when it has none.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from ringzero.core._engine.context import Context
from ringzero.core.support.loops import LoopHome, forward, running_loop

__all__ = ["route", "route_sync"]

T = TypeVar("T")


async def route(in_process: Callable[[Context], Coroutine[Any, Any, T]],
                elsewhere: Callable[[], Coroutine[Any, Any, T]], home: LoopHome | None = None) -> T:
    """Await ``in_process(ctx)`` on the current process's loop, or ``elsewhere()`` on ``home``
    (here where ``home`` is None) outside any process."""
    ctx = Context.current()
    if ctx is None:
        return await (elsewhere() if home is None else home.run(elsewhere()))
    if running_loop() is ctx.loop:
        return await in_process(ctx)
    return await forward(ctx.loop, in_process(ctx))


def route_sync(in_process: Callable[[Context], Coroutine[Any, Any, T]],
               elsewhere: Callable[[], Coroutine[Any, Any, T]], home: LoopHome | Callable[[], LoopHome],
               what: str) -> T:
    """``route`` for sync callers (any thread): block until it is done. ``home`` may be given
    as a function, called only outside a process; ``what`` names the call in the error a call
    on the loop it would block gets."""
    ctx = Context.current()
    if ctx is not None:
        return ctx.call_from_thread(in_process(ctx), what)
    return (home if isinstance(home, LoopHome) else home()).run_sync(elsewhere(), what)
