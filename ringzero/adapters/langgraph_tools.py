"""``KernelToolNode``: LangGraph's own ``ToolNode``, whose tool calls inside a kernel process are
journaled, budgeted syscalls.

It is a subclass of ``langgraph.prebuilt.ToolNode`` and changes one thing: where ToolNode runs a
tool call (after its ``wrap_tool_call``/``awrap_tool_call`` interceptors, with state, store and
runtime injected and ``handle_tool_errors`` applied), a KernelToolNode inside a kernel process
runs that call as one ``tool`` syscall. Its outcome (the ``ToolMessage``, ``Command`` or list
the call produced, encoded with LangGraph's own serializer) is in the journal before the graph
sees it, so a resumed graph gets the recorded answer without running the tool again, and each
call counts against the process's step budget. Outside a kernel process it is ToolNode.

What a record cannot carry, it does not pretend to:
- An interrupt (``interrupt()`` in a tool) or an invalid resume value is not recorded: the call
  runs again when the graph is resumed, as LangGraph requires.
- An error the node's ``handle_tool_errors`` lets through reaches the graph as itself when the
  call runs live; replayed, as the same class where it imports and is rebuilt from the recorded
  arguments (``outcomes.rebuilt``), else as ``ToolFailed`` naming the original type and message.
- Output written with the stream writer is emitted when the call runs live, not on replay.
- Sync tool calls (``graph.invoke`` run from a worker thread, or a sync ``wrap_tool_call`` on the
  async path) run one at a time, in call order, so that their journal slots follow program
  order on every run; async calls keep ToolNode's concurrency.
- A tool that takes an ``idempotency_key`` parameter gets the kernel's key on every live call
  (the same key when an in-doubt call runs again after a crash), whatever the model passed;
  the node hides the parameter from the schema the model is shown (build the node before
  ``bind_tools``, or annotate it ``Annotated[str, InjectedToolArg]`` yourself).
- An in-doubt call (running when the host died, its tool neither keyed nor idempotent) raises
  ``ToolInDoubt`` out of the graph to the program (``in_doubt="raise"``, the default), or, with
  ``in_doubt="report"``, becomes the ``ToolMessage`` of an error (``status="error"``) telling
  the model the call's outcome is unknown, so the graph goes on.
- A sync ``invoke`` on the process's own event loop thread is refused with ``WrongEventLoop``:
  it would block the loop that its journal writes need. ``ainvoke`` there, or run the sync
  graph in a worker thread; a graph on a loop of its own in another thread works too.
"""

from __future__ import annotations

import asyncio
import base64
import contextvars
import functools
from collections.abc import Callable, Coroutine
from typing import Annotated, Any

from ringzero.adapters._graph_guard import refuse_persistent_checkpointer
from ringzero.core.context import Context
from ringzero.core.contract.errors import (
    MissingExtra,
    NonDeterminismError,
    NotSerializable,
    ToolInDoubt,
    WrongEventLoop,
)
from ringzero.core.contract.outcomes import Failure, Outcome, Value, failure, tool_exception
from ringzero.core.support.effects import check_in_doubt, in_doubt_report, retry_safe, takes_idempotency_key
from ringzero.core.support.loops import forward, running_loop
from ringzero.core.support.tool_parameters import IDEMPOTENCY_KEY

try:
    from langchain_core.messages import ToolMessage
    from langchain_core.runnables import RunnableConfig
    from langchain_core.tools import BaseTool, InjectedToolArg
    from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer
    from langgraph.errors import GraphBubbleUp
    from langgraph.prebuilt import ToolNode
    from langgraph.prebuilt.tool_node import ToolCallRequest
    from langgraph.runtime import Runtime
    from pydantic import BaseModel, create_model
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise MissingExtra("ringzero.adapters.langgraph", "langgraph") from exc

try:
    from langgraph.errors import is_invalid_resume
except ImportError:  # pragma: no cover - a LangGraph from before resume validation

    def is_invalid_resume(error: BaseException) -> bool:
        return False


__all__ = ["KernelToolNode"]

_SERDE = JsonPlusSerializer()
"""Encodes what a tool call produced for the journal, as LangGraph encodes it for checkpoints."""

_SYNC_TURNS: contextvars.ContextVar[asyncio.Lock | None] = contextvars.ContextVar("ringzero_sync_turns", default=None)
"""Within one async run of the node, the turn of each call that a sync interceptor runs."""

_KEY: contextvars.ContextVar[str | None] = contextvars.ContextVar("ringzero_idempotency_key", default=None)
"""The kernel's idempotency key for the tool call running live here, if its tool takes one."""


class KernelToolNode(ToolNode):
    """``langgraph.prebuilt.ToolNode`` (same arguments, same behaviour) whose tool calls are
    journaled, budgeted kernel syscalls when the graph runs inside a kernel process.

    ``in_doubt``: ``"raise"`` (``ToolInDoubt`` leaves the graph) or ``"report"`` (the model is
    told, in an error ``ToolMessage``, that the call's outcome is unknown); see the module."""

    def __init__(self, tools: Any, *args: Any, in_doubt: str = "raise", **kwargs: Any) -> None:
        super().__init__(tools, *args, **kwargs)
        self.in_doubt = check_in_doubt(in_doubt)
        for tool in self.tools_by_name.values():
            hide_key(tool)

    # ------------------------------------------------------------------ async path
    async def _execute_tool_async(self, request: ToolCallRequest, input_type: Any, config: Any) -> Any:
        ctx = Context.current()
        if ctx is None:
            return await super()._execute_tool_async(request, input_type, config)
        refuse_persistent_checkpointer(ctx.pid, config)
        run = functools.partial(super()._execute_tool_async, input_type=input_type, config=config)
        return await _journaled(ctx, request, run, self.in_doubt)

    def _inject_tool_args(self, tool_call: Any, tool_runtime: Any, tool: Any = None) -> Any:
        injected = super()._inject_tool_args(tool_call, tool_runtime, tool)
        key = _KEY.get()
        if key is None:
            return injected
        return {**injected, "args": {**injected["args"], IDEMPOTENCY_KEY: key}}

    async def _afunc(self, input: Any, config: RunnableConfig, runtime: Runtime) -> Any:
        if Context.current() is None or self._awrap_tool_call is not None or self._wrap_tool_call is None:
            return await super()._afunc(input, config, runtime)
        token = _SYNC_TURNS.set(asyncio.Lock())  # seen by the tasks ToolNode gathers below
        try:
            return await super()._afunc(input, config, runtime)
        finally:
            _SYNC_TURNS.reset(token)

    async def _arun_one(self, call: Any, input_type: Any, tool_runtime: Any) -> Any:
        turns = _SYNC_TURNS.get()
        if turns is None or Context.current() is None:
            return await super()._arun_one(call, input_type, tool_runtime)
        # ToolNode runs a sync interceptor, and the tool, on the loop's thread; a journaled call
        # must await its record there, so the call runs as the sync path does, in a worker
        # thread, one at a time in the order the calls were started.
        async with turns:
            return await asyncio.to_thread(super()._run_one, call, input_type, tool_runtime)

    # ------------------------------------------------------------------ sync path
    def _func(self, input: Any, config: RunnableConfig, runtime: Runtime) -> Any:
        ctx = Context.current()
        if ctx is not None:
            if running_loop() is ctx.loop:
                raise WrongEventLoop(
                    "KernelToolNode was invoked synchronously on its kernel process's own event loop: its tool "
                    "calls are journaled on that loop, which this call blocks. Use ainvoke there, or run the "
                    "sync graph in a worker thread (await asyncio.to_thread(graph.invoke, ...))")
            config = RunnableConfig(**{**config, "max_concurrency": 1})  # one call at a time, in call order
        return super()._func(input, config, runtime)

    def _execute_tool_sync(self, request: ToolCallRequest, input_type: Any, config: Any) -> Any:
        ctx = Context.current()
        if ctx is None:
            return super()._execute_tool_sync(request, input_type, config)
        refuse_persistent_checkpointer(ctx.pid, config)
        sync = super()._execute_tool_sync

        def run(keyed: ToolCallRequest) -> Coroutine[Any, Any, Any]:
            return asyncio.to_thread(sync, keyed, input_type, config)

        return ctx.call_from_thread(_journaled(ctx, request, run, self.in_doubt), "KernelToolNode's sync tool call")


def hide_key(tool: Any) -> None:
    """Mark ``tool``'s ``idempotency_key`` parameter as injected (LangChain's ``InjectedToolArg``),
    so that the schema a model is shown leaves it out: the kernel fills it."""
    schema = getattr(tool, "args_schema", None)
    if not (isinstance(tool, BaseTool) and isinstance(schema, type) and issubclass(schema, BaseModel)):
        return
    field = schema.model_fields.get(IDEMPOTENCY_KEY)
    if field is None or InjectedToolArg in field.metadata or not takes_idempotency_key(tool):
        return
    default = "" if field.is_required() else field.default
    hidden: Any = (Annotated[field.annotation, InjectedToolArg], default)
    tool.args_schema = create_model(schema.__name__, __base__=schema, **{IDEMPOTENCY_KEY: hidden})


async def _journaled(ctx: Context, request: ToolCallRequest, run: Callable[[ToolCallRequest], Coroutine[Any, Any, Any]],
                     in_doubt: str) -> Any:
    """Run one tool call through the journal: live once, served from the record after.

    The journal lives on the process's loop. A graph run on a loop of its own inside the process
    (a framework's thread) reaches it there, and its tool still runs on the graph's loop, where
    whatever the tool holds (clients, locks) belongs.
    """
    here = asyncio.get_running_loop()
    if here is not ctx.loop:
        return await forward(ctx.loop, _journaled(ctx, request, lambda call: forward(here, run(call)), in_doubt))
    call = request.tool_call
    raised: list[BaseException] = []
    fresh: list[Any] = []  # the live result, handed back as itself rather than decoded from its record

    async def live() -> Outcome:
        # The kernel's key, the same on a re-run, whatever the model passed: added where ToolNode
        # injects what the model may not set (``_inject_tool_args``).
        keyed = takes_idempotency_key(getattr(request, "tool", None))  # asked only of a live call
        token = _KEY.set(ctx.idempotency_key() if keyed else None)
        try:
            produced = await run(request)
        except GraphBubbleUp:
            raise  # an interrupt: not an outcome, the call runs again when the graph resumes
        except Exception as exc:
            if is_invalid_resume(exc):
                raise  # the resume value is answered again, so the call must run again
            raised.append(exc)
            return failure(exc)
        finally:
            _KEY.reset(token)
        try:
            kind, data = _SERDE.dumps_typed(produced)
        except Exception as exc:
            raise NotSerializable(f"tool {call['name']!r} returned {type(produced).__name__}, which cannot be "
                                  f"journaled ({exc}); return what LangGraph can checkpoint") from exc
        fresh.append(produced)
        return Value({"kind": kind, "data": base64.b64encode(data).decode("ascii")})

    try:
        outcome = await ctx.journaled_tool(call["name"], {"id": call.get("id"), "args": call["args"]}, live,
                                           retry_safe=lambda: retry_safe(getattr(request, "tool", None)))
    except ToolInDoubt:
        if in_doubt == "raise":
            raise
        return ToolMessage(in_doubt_report(call["name"]), tool_call_id=call.get("id") or "", name=call["name"],
                           status="error")
    if isinstance(outcome, Failure):
        if raised:
            raise raised[0]
        raise tool_exception(call["name"], outcome)  # on replay, the class raised live where it is rebuilt
    if fresh:
        return fresh[0]
    value = outcome.value if isinstance(outcome, Value) else None
    kind, data = (value.get("kind"), value.get("data")) if isinstance(value, dict) else (None, None)
    if not (isinstance(kind, str) and isinstance(data, str)):
        raise NonDeterminismError(f"the record of tool call {call['name']!r} holds no LangGraph value: {value!r:.200}")
    return _SERDE.loads_typed((kind, base64.b64decode(data)))
