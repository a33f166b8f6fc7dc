"""LangChain tools whose code runs in a ringzero executor, not in the host.

- ``sandboxed(tool_or_function)``: the same name, description and argument schema; the
  function's source is shipped into the executor and run there, so it cannot read the host's
  files or reach its network. What cannot be shipped (closures, module-level names, async
  functions, code without source) is refused when wrapping, not when the model calls it.
- ``code_tool(tools)``: one ``run_python(code)`` tool for programmatic tool calling: the model
  writes Python, the listed tools are plain functions inside it (their calls cross back to the
  host), and only stdout and the final value return to the model, capped in size.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from ringzero.adapters._shipping import ExecutorChoice, call_code, run_shipped, shippable_source
from ringzero.core.errors import InvalidArgument, MissingExtra, ToolFailed
from ringzero.core.loops import Closing
from ringzero.core.protocols import Executor

try:
    from langchain_core.tools import BaseTool, StructuredTool, ToolException
    from pydantic import PrivateAttr
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise MissingExtra("ringzero.adapters.langgraph tools", "langgraph") from exc

__all__ = ["ExecutorTool", "code_tool", "sandboxed", "shippable_source"]


class ExecutorTool(Closing, StructuredTool):
    """A LangChain tool that runs in a ringzero executor (made by ``sandboxed``/``code_tool``).

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


def sandboxed(tool_or_function: BaseTool | Callable[..., Any], executor: Executor | str | None = None) -> ExecutorTool:
    """A LangChain tool like ``tool_or_function`` whose body runs in ``executor`` (by default the
    kernel's executor inside a kernel process, Monty elsewhere).

    Raises InvalidArgument now if the function cannot run on its own in a sandbox.
    """
    if isinstance(tool_or_function, BaseTool):
        fn = getattr(tool_or_function, "func", None)
        if fn is None:
            raise InvalidArgument(f"tool {tool_or_function.name!r} has no Python function to ship "
                                  "(only tools made from a function, e.g. with @tool, can be sandboxed)")
    elif callable(tool_or_function):
        fn = tool_or_function
    else:
        raise InvalidArgument(f"sandboxed() needs a LangChain tool or a function, not {tool_or_function!r}")
    source = shippable_source(fn)  # refuse what cannot be shipped before anything else
    template = tool_or_function if isinstance(tool_or_function, BaseTool) else StructuredTool.from_function(
        fn, description=fn.__doc__ or fn.__name__)
    code = call_code(source, fn.__name__)
    runner = ExecutorChoice(executor, f"the sandboxed tool {template.name!r}")

    async def call(**kwargs: Any) -> Any:
        try:
            return await run_shipped(runner.get(), code, kwargs, template.name)
        except ToolFailed as exc:
            raise ToolException(f"{exc.error_type}: {exc.error_message}") from exc

    async def arun(**kwargs: Any) -> Any:
        return await runner.run(lambda: call(**kwargs))

    def run(**kwargs: Any) -> Any:
        return runner.run_sync(lambda: call(**kwargs), f"the sandboxed tool {template.name!r}")

    return _executor_tool(runner, name=template.name, description=template.description,
                          args_schema=template.get_input_schema(), func=run, coroutine=arun,
                          handle_tool_error=getattr(template, "handle_tool_error", False))


def code_tool(tools: Sequence[BaseTool | Callable[..., Any]], executor: Executor | str | None = None,
              max_output: int = 4000) -> ExecutorTool:
    """A ``run_python(code)`` tool: the model's code calls ``tools`` as functions in the sandbox."""
    host: dict[str, Callable[..., Any]] = {}
    lines = []
    for item in tools:
        tool = item if isinstance(item, BaseTool) else StructuredTool.from_function(
            item, description=item.__doc__ or item.__name__)
        host[tool.name] = _host_call(tool)
        fields = _argument_names(tool)
        lines.append(f"- {tool.name}({', '.join(fields)}): {tool.description.strip().splitlines()[0]}")
    runner = ExecutorChoice(executor, "the run_python tool")
    description = ("Run Python code. These functions are available inside it and return their results "
                   "directly:\n" + "\n".join(lines) + "\nOnly what the code prints and the value of its last "
                   "expression come back; keep large data inside the code and print summaries.")

    async def call(code: str) -> str:
        return (await runner.get().run(code, tools=host)).for_model(max_output)

    async def arun(code: str) -> str:
        return await runner.run(lambda: call(code))

    def run(code: str) -> str:
        return runner.run_sync(lambda: call(code), "run_python")

    template = StructuredTool.from_function(func=run, coroutine=arun, name="run_python", description=description)
    return _executor_tool(runner, name=template.name, description=template.description,
                          args_schema=template.args_schema, func=run, coroutine=arun)


def _host_call(tool: BaseTool) -> Callable[..., Any]:
    """A host function that calls ``tool`` with positional or keyword arguments."""
    order = _argument_names(tool)

    async def call(*args: Any, **kwargs: Any) -> Any:
        if len(args) > len(order):
            raise TypeError(f"{tool.name}() takes {len(order)} arguments but {len(args)} were given")
        return await tool.ainvoke({**dict(zip(order, args, strict=False)), **kwargs})

    return call


def _argument_names(tool: BaseTool) -> list[str]:
    """The tool's arguments, in order (positional calls from the sandbox map onto them)."""
    schema: dict[str, Any] = tool.get_input_schema().model_json_schema()  # type: ignore[union-attr]
    return list(schema.get("properties", {}))
