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

import ast
import builtins
import inspect
import textwrap
from collections.abc import Callable, Sequence
from typing import Any

from ringzero.adapters._bridge import LoopThread
from ringzero.core.errors import InvalidArgument, MissingExtra
from ringzero.core.protocols import Executor

try:
    from langchain_core.tools import BaseTool, StructuredTool, ToolException
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise MissingExtra("ringzero.adapters.langgraph tools", "langgraph") from exc

__all__ = ["code_tool", "sandboxed"]

_BRIDGE = LoopThread("ringzero-langchain-tools")
_ARGS = "ringzero_tool_arguments"


class _ExecutorChoice:
    """The executor a tool runs in: the one it was given; else, inside a kernel process, the
    kernel's (so ``Kernel(executor=...)`` decides for a whole graph); else a Monty executor of
    its own, started when first needed."""

    def __init__(self, given: Executor | None) -> None:
        self._given = given
        self._own: Executor | None = None

    def get(self) -> Executor:
        if self._given is not None:
            return self._given
        from ringzero.core.context import Context

        ctx = Context.current()
        if ctx is not None:
            return ctx.executor
        if self._own is None:
            from ringzero.providers.executors.monty import MontyExecutor

            self._own = MontyExecutor()
        return self._own


def sandboxed(tool_or_function: BaseTool | Callable[..., Any], executor: Executor | None = None) -> StructuredTool:
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
    code = f"{source}\n{fn.__name__}(**{_ARGS})"
    runner = _ExecutorChoice(executor)

    async def arun(**kwargs: Any) -> Any:
        result = await runner.get().run(code, inputs={_ARGS: kwargs})
        if result.error is not None:
            raise ToolException(f"{result.error.type}: {result.error.message}")
        return result.value

    def run(**kwargs: Any) -> Any:
        return _BRIDGE.run(arun(**kwargs), f"the sandboxed tool {template.name!r}")

    return StructuredTool(name=template.name, description=template.description,
                          args_schema=template.get_input_schema(), func=run, coroutine=arun,
                          handle_tool_error=getattr(template, "handle_tool_error", False))


def shippable_source(fn: Callable[..., Any]) -> str:
    """The function's own source, decorators removed, if it can run with nothing but itself."""
    name = getattr(fn, "__name__", repr(fn))
    if inspect.iscoroutinefunction(fn):
        raise InvalidArgument(f"{name} is async; a sandboxed tool's body must be a plain function")
    if name == "<lambda>":
        raise InvalidArgument("a lambda has no source to ship; define the tool with def")
    closure = getattr(getattr(fn, "__code__", None), "co_freevars", ())
    if closure:
        raise InvalidArgument(f"{name} uses {', '.join(closure)} from an enclosing function; a sandboxed "
                              "tool must be self-contained (pass them as arguments instead)")
    try:
        source = textwrap.dedent(inspect.getsource(fn))
    except (OSError, TypeError) as exc:
        raise InvalidArgument(f"the source of {name} is not available to ship into the sandbox") from exc
    tree = ast.parse(source)
    func = next((n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name), None)
    if func is None:
        raise InvalidArgument(f"could not find the definition of {name} in its source")
    func.decorator_list = []
    _strip_annotations(func)  # types are for the schema (already taken); the sandbox needs none of them
    outside = _module_level_names(func, getattr(fn, "__globals__", {}))
    if outside:
        raise InvalidArgument(f"{name} uses module-level {', '.join(sorted(outside))}, which does not exist in "
                              "the sandbox; import or define it inside the function")
    return ast.unparse(func)


def _strip_annotations(func: ast.FunctionDef) -> None:
    func.returns = None
    every = [*func.args.posonlyargs, *func.args.args, *func.args.kwonlyargs, func.args.vararg, func.args.kwarg]
    for arg in every:
        if arg is not None:
            arg.annotation = None
    for node in ast.walk(func):
        if isinstance(node, ast.AnnAssign) and node.value is not None:
            node.annotation = ast.Constant(None)  # `x: T = v` keeps its value; the type is inert


def _module_level_names(func: ast.FunctionDef, module_globals: dict[str, Any]) -> set[str]:
    """Names the function reads that only its module defines."""
    bound = {a.arg for a in ast.walk(func.args) if isinstance(a, ast.arg)} | {func.name}
    loaded: set[str] = set()
    for node in ast.walk(func):
        if isinstance(node, ast.Name):
            (loaded if isinstance(node.ctx, ast.Load) else bound).add(node.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            bound.update((alias.asname or alias.name).split(".")[0] for alias in node.names)
        elif _defines_a_name(node) and node is not func:
            bound.add(node.name)  # type: ignore[attr-defined]  # inner definitions, `except ... as name`
    return {n for n in loaded - bound if n in module_globals and not hasattr(builtins, n)}


def _defines_a_name(node: ast.AST) -> bool:
    definitions = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.ExceptHandler)
    return isinstance(node, definitions) and bool(getattr(node, "name", None))


def code_tool(tools: Sequence[BaseTool | Callable[..., Any]], executor: Executor | None = None,
              max_output: int = 4000) -> StructuredTool:
    """A ``run_python(code)`` tool: the model's code calls ``tools`` as functions in the sandbox."""
    host: dict[str, Callable[..., Any]] = {}
    lines = []
    for item in tools:
        tool = item if isinstance(item, BaseTool) else StructuredTool.from_function(
            item, description=item.__doc__ or item.__name__)
        host[tool.name] = _host_call(tool)
        fields = _argument_names(tool)
        lines.append(f"- {tool.name}({', '.join(fields)}): {tool.description.strip().splitlines()[0]}")
    runner = _ExecutorChoice(executor)
    description = ("Run Python code. These functions are available inside it and return their results "
                   "directly:\n" + "\n".join(lines) + "\nOnly what the code prints and the value of its last "
                   "expression come back; keep large data inside the code and print summaries.")

    async def arun(code: str) -> str:
        result = await runner.get().run(code, tools=host)
        parts = [result.stdout.rstrip()] if result.stdout.strip() else []
        if result.error is not None:
            parts.append(f"Error: {result.error.type}: {result.error.message}")
        elif result.value is not None:
            parts.append(f"Result: {result.value!r}")
        text = "\n".join(parts) or "(no output)"
        if len(text) > max_output:
            text = text[:max_output] + f"\n[... {len(text) - max_output} more characters truncated]"
        return text

    def run(code: str) -> str:
        return _BRIDGE.run(arun(code), "run_python")

    return StructuredTool.from_function(func=run, coroutine=arun, name="run_python", description=description)


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
