"""The tool and code syscalls (``ctx.tool``, ``ctx.journaled_tool``, ``ctx.exec``): each records its
intent before it runs, so a call in flight at a crash is in doubt on resume, never repeated
silently; a tool called from sandboxed code is journaled under its exec's slot."""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING

from ringzero.core._engine.syscall import syscall
from ringzero.core._engine.tool_calls import ToolCalls
from ringzero.core.contract.errors import InvalidArgument, NonDeterminismError, ToolInDoubt, ToolNotFound
from ringzero.core.contract.fingerprints import trimmed
from ringzero.core.contract.outcomes import Failure, InDoubt, Outcome, Value, failure, number, tool_exception
from ringzero.core.contract.protocols import Executor, Tool
from ringzero.core.contract.types import JSON, ExecLimits, ExecResult, ensure_json
from ringzero.core.support.effects import retry_safe, takes_idempotency_key, tool_summary
from ringzero.core.support.host_tools import call_tool
from ringzero.core.support.live import NESTED_COST, current_slot
from ringzero.core.support.tool_boundary import bound_tools
from ringzero.core.support.tool_parameters import IDEMPOTENCY_KEY

if TYPE_CHECKING:
    from ringzero.core._engine.process import Process

__all__ = ["Runner", "exec_code", "journaled_tool", "kernel_tool", "resolve_tool", "run_code", "tool"]


Runner = Callable[[str, Mapping[str, JSON], Mapping[str, Tool], "ExecLimits | None"], Awaitable[ExecResult]]
"""How a run of code is made: an executor's ``run``, or a session's next step."""


async def exec_code(
    process: Process,
    code: str,
    *,
    inputs: Mapping[str, JSON] | None = None,
    tools: Mapping[str, Tool] | None = None,
    limits: ExecLimits | None = None,
    executor: Executor | None = None,
) -> ExecResult:
    """``Context.exec`` (see there), for ``process``."""
    running = executor if executor is not None else process.runtime.executor

    async def run(code: str, inputs: Mapping[str, JSON], tools: Mapping[str, Tool],
                  limits: ExecLimits | None) -> ExecResult:
        return await running.run(code, inputs=inputs, tools=tools, limits=limits)

    return await run_code(process, "exec", {}, code, inputs, tools, limits, run, running)


async def run_code(process: Process, kind: str, more: Mapping[str, JSON], code: str,
                   inputs: Mapping[str, JSON] | None, tools: Mapping[str, Tool] | None, limits: ExecLimits | None,
                   run: Runner, running: Executor, *, replayed: Callable[[int], None] | None = None,
                   before_live: Callable[[], Awaitable[None]] | None = None) -> ExecResult:
    """One journaled run of code (``ctx.exec``, a session's step): a syscall of ``kind`` whose
    arguments are the code, its inputs, its tools' names and ``more``; every tool call the code
    makes journaled under its slot. ``replayed(slot)`` is told of a run served from the journal;
    ``before_live`` is awaited before a run made live (a session rebuilt first)."""
    if not isinstance(code, str):
        raise InvalidArgument(f"code must be a string, not {type(code).__name__}")
    inputs = dict(inputs or {})
    ensure_json(inputs, f"{kind} inputs")
    left = process.meter.remaining("exec_seconds")
    if left is not None:  # the run may not outlast what is left of the exec budget
        limits = limits or ExecLimits()
        wall = max(0.0, left) if limits.wall_seconds is None else min(limits.wall_seconds, left)
        limits = dataclasses.replace(limits, wall_seconds=wall)

    ran_live = False

    async def live() -> Outcome:
        nonlocal ran_live
        ran_live = True
        if before_live is not None:
            await before_live()
        nested: dict[str, float] = {}
        if process.journal.resumed:  # read before the run: the code's calls are answered from its thread
            await process.journal.effects()
        calls = ToolCalls(process.journal, process.pid, current_slot(), process.idempotency_key(""), process)
        token = NESTED_COST.set(nested)
        try:
            handed = bound_tools(tools or {}, limits, calls)
            result = await run(code, inputs, handed, limits)
        finally:
            NESTED_COST.reset(token)
        if isinstance(calls.problem, ToolInDoubt):  # the program decides, now and on every replay
            return InDoubt(calls.problem.slot, str(calls.problem), calls.problem.tool)
        if calls.problem is not None:  # diverged from its recorded calls, or the store failed
            raise calls.problem
        beside: dict[str, JSON] = {"nested": dict(nested)} if nested else {}
        if calls.served or calls.rerun:
            beside["calls"] = {"served": calls.served, "rerun": calls.rerun}
        return Value(result.to_dict(), beside)

    args = {"code": code, "inputs": inputs, "tools": sorted(tools or {}), **more}
    first_line = code.strip().partition("\n")[0]
    slot = process.journal.cursor + 1  # what the syscall takes, before its first await
    outcome = await syscall(process, kind, args, f"{len(code)} chars: {trimmed(first_line, 50)}", live,
                            needs=(("exec_seconds", 1e-9),), slotted=True,
                            about=lambda: {"ringzero.executor": type(running).__name__,
                                           "ringzero.isolation": running.capabilities.isolation})
    if isinstance(outcome, InDoubt):
        raise ToolInDoubt(process.pid, str(outcome.tool), outcome.slot)
    value = outcome.value if isinstance(outcome, Value) else None
    if not isinstance(value, dict):
        raise NonDeterminismError(f"pid {process.pid}: the {kind} recorded here holds no run: {outcome!r:.200}")
    result = ExecResult.from_dict(value)
    nested = outcome.beside.get("nested")
    if not ran_live:
        if isinstance(nested, dict):  # replayed: charge what its nested calls cost
            process.meter.charge(**{str(k): number(v) for k, v in nested.items()})
        if replayed is not None:
            replayed(slot)
    process.meter.charge(exec_seconds=result.duration)
    process.check_budget()
    return result


async def tool(process: Process, tool: str | Tool, /, *args: JSON, **kwargs: JSON) -> JSON:
    """``Context.tool`` (see there), for ``process``."""
    name, fn = (tool, None) if isinstance(tool, str) else resolve_tool(tool)
    ensure_json([list(args), kwargs], f"arguments of tool {name!r}")
    if fn is None and name not in process.runtime.tools and not process.journal.replaying \
            and not process.runtime.replay_only:
        kernel_tool(process, name)  # a kernel without the tool stops here, before an intent says it ran

    def target() -> Tool:
        return fn if fn is not None else kernel_tool(process, name)  # a replay needs no tool

    raised: list[Exception] = []

    async def live() -> Outcome:
        call = target()
        given = {**kwargs, IDEMPOTENCY_KEY: process.idempotency_key(current_slot())} \
            if takes_idempotency_key(call) else kwargs
        try:
            value = await call_tool(call, list(args), given)
        except Exception as exc:
            raised.append(exc)
            return failure(exc)
        return Value(ensure_json(value, f"the result of tool {name!r}"))

    outcome = await syscall(process, "tool", {"name": name, "args": list(args), "kwargs": kwargs},
                            tool_summary(name, args, kwargs), live, retry_safe=lambda: retry_safe(target()),
                            about=lambda: {"gen_ai.tool.name": name})
    if isinstance(outcome, InDoubt):
        raise ToolInDoubt(process.pid, name, outcome.slot)
    if isinstance(outcome, Failure):  # the tool's own exception where it can be rebuilt, live and replayed
        raise tool_exception(name, outcome, raised[0] if raised else None)
    return outcome.value if isinstance(outcome, Value) else None


async def journaled_tool(
    process: Process, name: str, request: JSON, live: Callable[[], Awaitable[Outcome]], *,
    retry_safe: bool | Callable[[], bool] = False,
) -> Outcome:
    """``Context.journaled_tool`` (see there), for ``process``."""
    safe = retry_safe if callable(retry_safe) else lambda: retry_safe
    outcome = await syscall(process, "tool", {"name": name, "request": request}, tool_summary(name, [request], {}),
                            live, retry_safe=safe, about=lambda: {"gen_ai.tool.name": name})
    if isinstance(outcome, InDoubt):
        raise ToolInDoubt(process.pid, name, outcome.slot)
    return outcome


def kernel_tool(process: Process, name: str) -> Tool:
    """The kernel's tool ``name``; where it has none, see ``Process.needs``."""
    tools = process.runtime.tools
    if name not in tools:
        known = ", ".join(sorted(tools)) or "none"
        process.needs(ToolNotFound(f"no tool named {name!r}; the kernel has: {known}"))
    return tools[name]


def resolve_tool(tool: Tool) -> tuple[str, Tool]:
    if not callable(tool):
        raise InvalidArgument(f"ctx.tool() needs a tool name or a callable, not {type(tool).__name__}")
    return getattr(tool, "__qualname__", repr(tool)), tool
