"""LangChain tools whose code runs in a ringzero executor, not in the host.

- ``sandboxed(tool_or_function)``: a copy of the tool, of its own class, with every field it
  had; its body's source is shipped into the executor and run there, so it cannot read the
  host's files or reach its network. What cannot be shipped (closures, module-level names
  other than modules, code without source, host objects, arguments that are not JSON) is
  refused when wrapping, not when the model calls it.
- ``code_tool(tools)``: one ``run_python(code)`` tool for programmatic tool calling: the model
  writes Python, the listed tools are plain functions inside it (their calls cross back to the
  host), and only stdout and the final value return to the model, capped in size.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from ringzero.adapters._shipping import ExecutorChoice, raise_as_raised, run_shipped, shippable_call, shippable_source
from ringzero.core.context import Context
from ringzero.core.contract.errors import InvalidArgument, MissingExtra, ToolFailed
from ringzero.core.contract.protocols import Executor
from ringzero.core.routing import route, route_sync
from ringzero.core.support.loops import Closing
from ringzero.core.support.tool_parameters import schema_tool

try:
    from langchain_core.runnables import RunnableConfig
    from langchain_core.tools import BaseTool, StructuredTool, Tool, ToolException
    from pydantic import PrivateAttr
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise MissingExtra("ringzero.adapters.langgraph tools", "langgraph") from exc

__all__ = ["ExecutorTool", "ShippedTool", "code_tool", "sandboxed", "shippable_source"]


def _host_types() -> tuple[Any, ...]:
    """What LangChain and LangGraph fill in with host objects: a RunnableConfig, LangGraph's
    ToolRuntime, its injected state and store (an InjectedToolArg that carries JSON, such as a
    user id, crosses into the sandbox as it is)."""
    found: list[Any] = [RunnableConfig]
    try:
        from langgraph.prebuilt import InjectedState, InjectedStore, ToolRuntime
    except ImportError:  # langchain-core without LangGraph
        pass
    else:
        found += [InjectedState, InjectedStore, ToolRuntime]
    return tuple(found)


_HOST_TYPES = _host_types()


class ExecutorTool(Closing, StructuredTool):
    """The ``run_python`` tool ``code_tool`` makes: model code runs in a ringzero executor.

    Outside a kernel process its executor lives on one loop of its own (a private thread once
    it is called synchronously): ``close()``/``aclose()``, or ``with``, stop it and the Monty
    executor the tool started; an executor you passed is yours to close.
    """

    _runner: ExecutorChoice = PrivateAttr()

    def close(self) -> None:
        self._runner.close()

    async def aclose(self) -> None:
        await self._runner.aclose()


def _executor_tool(runner: ExecutorChoice, **fields: Any) -> ExecutorTool:
    tool = ExecutorTool(**fields)
    tool._runner = runner
    return tool


if TYPE_CHECKING:  # what it is to its users: a tool that can be closed
    _Base = BaseTool
else:  # at run time a plain mixin: the tool's own class keeps its fields and serializers
    _Base = object


class ShippedTool(Closing, _Base):
    """What ``sandboxed`` mixes into a copy of a tool's own class: the tool's body runs in an
    executor. Everything else is the original tool's, unchanged: its class, name, description
    and argument schema (a model or a JSON-schema dict, single-input ``Tool``s included),
    ``func`` and ``coroutine``, ``return_direct``, ``response_format`` (content and artifact),
    error handling, injected arguments, callbacks, tags and metadata."""

    _ringzero_shipped: Any

    def _run(self, *args: Any, config: Any = None, run_manager: Any = None, **kwargs: Any) -> Any:
        shipped: _Shipped = self._ringzero_shipped
        if shipped.sync is None:  # an async-only tool: the original's own refusal of a sync call
            return super()._run(*args, config=config, run_manager=run_manager, **kwargs)  # type: ignore[safe-super]
        code = shipped.sync
        return shipped.runner.run_sync(lambda: shipped.call(code, args, kwargs), f"the sandboxed tool {self.name!r}")

    async def _arun(self, *args: Any, config: Any = None, run_manager: Any = None, **kwargs: Any) -> Any:
        shipped: _Shipped = self._ringzero_shipped
        return await shipped.runner.run(lambda: shipped.call(shipped.asynchronous, args, kwargs))

    def close(self) -> None:
        self._ringzero_shipped.runner.close()

    async def aclose(self) -> None:
        await self._ringzero_shipped.runner.aclose()

    def __reduce__(self) -> Any:
        """Pickled as the original tool's class and state with the shipped code; unpickled, it
        runs in the default executor (an executor object does not travel)."""
        shipped: _Shipped = self._ringzero_shipped
        own = next(original for original, copy in _SHIPPED_CLASSES.items() if copy is type(self))
        state = dict(self.__getstate__())
        state["__pydantic_private__"] = {k: v for k, v in (state.get("__pydantic_private__") or {}).items()
                                         if k != "_ringzero_shipped"}
        return _unpickled, (own, state, shipped.name, shipped.sync, shipped.asynchronous, shipped.pair)


def _unpickled(own: type[BaseTool], state: Any, name: str, sync: str | None, asynchronous: str,
               pair: bool) -> ShippedTool:
    cls = _shipped_class(own)
    tool = cls.__new__(cls)
    tool.__setstate__(state)
    tool._ringzero_shipped = _Shipped(name, sync, asynchronous, ExecutorChoice(None, f"the sandboxed tool {name!r}"),
                                      pair=pair)
    return tool


class _Shipped:
    """One sandboxed tool's code (what a sync call runs, and what an async one runs), and where."""

    def __init__(self, name: str, sync: str | None, asynchronous: str, runner: ExecutorChoice, *,
                 pair: bool) -> None:
        self.name, self.sync, self.asynchronous, self.runner = name, sync, asynchronous, runner
        self.pair = pair
        """The tool answers (content, artifact): the pair the sandbox hands back as JSON's list
        is a tuple again, as LangChain requires."""

    async def call(self, code: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        try:
            value = await run_shipped(self.runner.get(), code, kwargs, self.name, args)
        except ToolFailed as exc:
            try:
                raise_as_raised(exc)  # a built-in exception as itself
            except ToolFailed:  # any other as a ToolException, which handle_tool_error governs
                raise ToolException(f"{exc.error_type}: {exc.error_message}") from exc
        return tuple(value) if self.pair and isinstance(value, list) and len(value) == 2 else value


_SHIPPED_CLASSES: dict[type[BaseTool], type[ShippedTool]] = {}


def _shipped_class(cls: type[BaseTool]) -> type[ShippedTool]:
    """``cls`` with ``ShippedTool`` before it, under the same name (one class per tool class)."""
    made = _SHIPPED_CLASSES.get(cls)
    if made is None:

        # LangChain reads a tool class's argument schema and injected arguments from the
        # signature and annotations of its _run (and _arun): the copy's are the original's.
        @functools.wraps(cls._run)
        def _run(self: ShippedTool, *args: Any, **kwargs: Any) -> Any:
            return ShippedTool._run(self, *args, **kwargs)

        @functools.wraps(cls._arun)
        async def _arun(self: ShippedTool, *args: Any, **kwargs: Any) -> Any:
            return await ShippedTool._arun(self, *args, **kwargs)

        made = _SHIPPED_CLASSES[cls] = type(cls.__name__, (ShippedTool, cls), {
            "__module__": cls.__module__, "__qualname__": cls.__qualname__, "_run": _run, "_arun": _arun,
            "__annotations__": {"_ringzero_shipped": Any}, "_ringzero_shipped": PrivateAttr(default=None)})
    return made


def _ship(fn: Callable[..., Any], *, method: bool = False) -> str:
    """``shippable_call`` with LangChain's host objects; a class's ``run_manager=None`` is never passed."""
    return shippable_call(fn, method=method, host_types=_HOST_TYPES, optional=("run_manager",) if method else ())


def _codes(tool: BaseTool) -> tuple[str | None, str]:
    """What a sync call and an async call of ``tool`` run in the sandbox. A tool made from a
    function ships its ``func`` and ``coroutine`` (an async call of a sync-only tool runs
    ``func``, as LangChain's does; a sync call of an async-only one is refused, as LangChain's
    is); a ``BaseTool`` subclass ships its ``_run`` and its own ``_arun`` (else ``_run`` again)."""
    if isinstance(tool, (StructuredTool, Tool)):
        func, coroutine = tool.func, tool.coroutine
        sync = None if func is None else _ship(func)
        if coroutine is None:
            if sync is None:
                raise InvalidArgument(f"tool {tool.name!r} has neither a function nor a coroutine to ship")
            return sync, sync
        return sync, _ship(coroutine)
    cls = type(tool)
    sync = _ship(cls._run, method=True)
    return sync, (_ship(cls._arun, method=True) if cls._arun is not BaseTool._arun else sync)


def sandboxed(tool_or_function: BaseTool | Callable[..., Any], executor: Executor | str | None = None) -> ShippedTool:
    """A LangChain tool like ``tool_or_function`` whose body runs in ``executor`` (by default the
    kernel's executor inside a kernel process, Monty elsewhere): a copy of the tool, of its own
    class, with every field it had; only where its body runs differs. A function, sync or async;
    a tool made from one (``@tool``, ``StructuredTool``, ``Tool``); a ``BaseTool`` subclass whose
    ``_run`` (and ``_arun``) use only their arguments.

    Raises InvalidArgument now if the body cannot run on its own in a sandbox: see
    ``shippable_source`` and ``check_parameters`` for what is refused and why.
    """
    if isinstance(tool_or_function, ShippedTool):
        raise InvalidArgument(f"tool {tool_or_function.name!r} is sandboxed already")
    if isinstance(tool_or_function, BaseTool):
        template = tool_or_function
        sync, asynchronous = _codes(template)  # refuse what cannot be shipped before anything else
    elif callable(tool_or_function):
        fn = tool_or_function
        code = _ship(fn)
        sync, asynchronous = (None if inspect.iscoroutinefunction(fn) else code), code
        description = fn.__doc__ or getattr(fn, "__name__", "tool")
        # an async function is the tool's coroutine, as @tool makes it
        template = StructuredTool.from_function(coroutine=fn, description=description) if sync is None else \
            StructuredTool.from_function(fn, description=description)
    else:
        raise InvalidArgument(f"sandboxed() needs a LangChain tool or a function, not {tool_or_function!r}")
    runner = ExecutorChoice(executor, f"the sandboxed tool {template.name!r}")
    cls = _shipped_class(type(template))
    fields = {name: getattr(template, name) for name in template.model_fields_set}
    copy = cls(**fields)
    copy._ringzero_shipped = _Shipped(template.name, sync, asynchronous, runner,
                                      pair=template.response_format == "content_and_artifact")
    return copy


def code_tool(tools: Sequence[BaseTool | Callable[..., Any]], executor: Executor | str | None = None,
              max_output: int = 4000) -> ExecutorTool:
    """A ``run_python(code)`` tool: the model's code calls ``tools`` as functions in the sandbox."""
    host: dict[str, Callable[..., Any]] = {}
    lines = []
    for item in tools:
        tool = item if isinstance(item, BaseTool) else StructuredTool.from_function(
            item, description=item.__doc__ or item.__name__)
        host[tool.name] = _host_call(tool)
        fields = inspect.signature(host[tool.name]).parameters
        lines.append(f"- {tool.name}({', '.join(fields)}): {tool.description.strip().splitlines()[0]}")
    runner = ExecutorChoice(executor, "the run_python tool")
    description = ("Run Python code. These functions are available inside it and return their results "
                   "directly:\n" + "\n".join(lines) + "\nOnly what the code prints and the value of its last "
                   "expression come back; keep large data inside the code and print summaries.")

    async def call(code: str) -> str:
        return (await runner.get().run(code, tools=host)).for_model(max_output)

    async def in_process(ctx: Context, code: str) -> str:
        # ctx.exec: the code's tool calls and requests journaled under this call's slot
        return (await ctx.exec(code, tools=host, executor=runner.given)).for_model(max_output)

    async def arun(code: str) -> str:
        return await route(lambda ctx: in_process(ctx, code), lambda: call(code), runner.home)

    def run(code: str) -> str:
        return route_sync(lambda ctx: in_process(ctx, code), lambda: call(code), runner.home, "run_python")

    template = StructuredTool.from_function(func=run, coroutine=arun, name="run_python", description=description)
    return _executor_tool(runner, name=template.name, description=template.description,
                          args_schema=template.args_schema, func=run, coroutine=arun)


def _host_call(tool: BaseTool) -> Callable[..., Any]:
    """A host function that calls ``tool``, whose parameters are the fields its schema lets the
    model set (injected arguments are the host's), positional or by keyword."""
    schema: Any = tool.tool_call_schema
    if not isinstance(schema, dict):
        schema = schema.model_json_schema()

    async def call(given: dict[str, Any]) -> Any:
        return await tool.ainvoke(given)

    return schema_tool(tool.name, list(schema.get("properties", {})), schema.get("required", ()), call)
