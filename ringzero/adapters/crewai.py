"""CrewAI on the kernel: sandboxed tools, a code tool, Flow persistence and an LLM through the gate.

- ``sandboxed(tool)``: a CrewAI tool (``@tool`` function, ``BaseTool`` subclass, or a plain
  function) whose body runs in a ringzero executor; what cannot be shipped is refused now.
- ``CodeExecutionTool(tools=...)``: programmatic tool calling, a safer replacement for CrewAI's
  code interpreter: the model's Python runs in the sandbox, the listed tools callable inside.
- ``KernelFlowPersistence(checkpointer)``: what ``@persist`` stores Flow state in.
- ``KernelLLM(provider)``: a CrewAI LLM backed by a ringzero provider through an LLM gate.
- ``kickoff(crew_or_flow, inputs)``: run a crew or a flow inside a kernel process.

CrewAI calls tools and models synchronously from worker threads. Inside a kernel process
those threads carry the process's Context, so each call becomes a syscall sent to the
kernel's loop: model calls pass the process's gate and budget, tool runs are journaled (the
kernel's executor by default), and pause and kill take effect at the next call. Under
``kickoff``, every tool an agent runs (a plain ``@tool`` too) is a journaled syscall: a
resumed crew gets its recorded result instead of running it again. Outside a
process the calls run on a private event loop. CrewAI's telemetry is CrewAI's to switch off:
set ``CREWAI_DISABLE_TELEMETRY=true`` (and ``OTEL_SDK_DISABLED=true``) before importing it.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
from collections.abc import Callable, Sequence
from typing import Any

from ringzero.adapters._shipping import (
    ARGUMENTS,
    ExecutorChoice,
    call_code,
    shippable_source,
)
from ringzero.core.context import Context
from ringzero.core.effects import error_record, retry_safe, served
from ringzero.core.errors import InvalidArgument, MissingExtra, RingzeroError, ToolFailed, ToolInDoubt
from ringzero.core.protocols import Executor, Tool
from ringzero.core.routing import route, route_sync
from ringzero.core.types import ExecResult, json_form, json_problem

try:
    from crewai.tools import BaseTool
    from crewai.tools import tool as crewai_tool
    from pydantic import BaseModel, Field, PrivateAttr
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise MissingExtra("ringzero.adapters.crewai", "crewai") from exc

from ringzero.adapters.crewai_flows import KernelFlowPersistence
from ringzero.adapters.crewai_llm import KernelLLM
from ringzero.adapters.crewai_provider import CrewLLMProvider

__all__ = ["CodeExecutionTool", "CrewLLMProvider", "KernelFlowPersistence", "KernelLLM", "SandboxedTool", "kickoff",
           "sandboxed"]


# ---------------------------------------------------------------- tools
class SandboxedTool(BaseTool):
    """A CrewAI tool whose body runs in a ringzero executor (made by ``sandboxed``)."""

    _code: str = PrivateAttr()
    _runner: ExecutorChoice = PrivateAttr()

    def close(self) -> None:
        """Stop the tool's own loop thread and Monty executor, if it started them."""
        self._runner.close()

    async def aclose(self) -> None:
        await self._runner.aclose()

    def _run(self, **arguments: Any) -> Any:
        return self._value(_execute(self._code, {ARGUMENTS: arguments}, {}, self._runner, self._journal_name))

    async def _arun(self, **arguments: Any) -> Any:
        """What CrewAI's async paths (``arun``, ``akickoff``) call: the same run, awaited."""
        return self._value(await _aexecute(self._code, {ARGUMENTS: arguments}, {}, self._runner, self._journal_name))

    @property
    def _journal_name(self) -> str:
        return f"crewai_tool:{self.name}"

    def _value(self, result: ExecResult) -> Any:
        if result.error is not None:
            raise ToolFailed(self.name, result.error.type, result.error.message)
        return result.value


def sandboxed(tool: BaseTool | Callable[..., Any], executor: Executor | str | None = None) -> SandboxedTool:
    """A CrewAI tool like ``tool`` (same name, description and ``args_schema``) whose body runs in
    ``executor``: by default the kernel's inside a kernel process, else Monty.

    Takes a ``@tool`` function, a ``BaseTool`` subclass whose ``_run`` uses only its arguments,
    or a plain function. Raises InvalidArgument now if the body cannot run on its own in a sandbox.
    """
    if isinstance(tool, BaseTool):
        fn = getattr(tool, "func", None)
        if fn is not None:
            code = call_code(shippable_source(fn), fn.__name__)
        else:
            run = type(tool)._run
            code = call_code(shippable_source(run, method=True), run.__name__)
        template = tool
    elif callable(tool):
        code = call_code(shippable_source(tool), tool.__name__)
        template = crewai_tool(tool)
    else:
        raise InvalidArgument(f"sandboxed() needs a CrewAI tool or a function, not {tool!r}")
    # Every field CrewAI reads (cache_function, result_as_answer, max_usage_count, the failure
    # policy, env_vars, result_schema, ...) as the original has it; only the body moves.
    carried = {field: getattr(template, field) for field in BaseTool.model_fields
               if field not in ("name", "description", "args_schema", "description_updated")}
    wrapped = SandboxedTool(name=template.name, description=_plain_description(template),
                            args_schema=template.args_schema, **carried)
    wrapped._code = code
    wrapped._runner = ExecutorChoice(executor, f"the sandboxed tool {template.name!r}")
    return wrapped


class _CodeInput(BaseModel):
    code: str = Field(description="Python code to run; the listed tools are functions inside it")


class CodeExecutionTool(BaseTool):
    """Programmatic tool calling for CrewAI agents: a safer replacement for CrewAI's code interpreter.

    The model writes Python; it runs in a ringzero executor with ``tools`` callable inside as
    plain functions (their calls cross back to the host, so secrets stay there), and only what
    the code prints and the value of its last expression return to the model, capped at
    ``max_output`` characters.
    """

    name: str = "run_python"
    description: str = "Run Python code in a sandbox."
    args_schema: type[BaseModel] = _CodeInput
    max_output: int = 4000
    _host: dict[str, Tool] = PrivateAttr(default_factory=dict)
    _runner: ExecutorChoice = PrivateAttr()

    def __init__(self, tools: Sequence[BaseTool | Callable[..., Any]] = (), executor: Executor | str | None = None,
                 **data: Any) -> None:
        host, lines = {}, []
        for item in tools:
            tool = item if isinstance(item, BaseTool) else crewai_tool(item)
            fields = list(tool.args_schema.model_fields)
            host[tool.name] = _host_call(tool, fields)
            summary = (_plain_description(tool).strip().splitlines() or [""])[0]
            lines.append(f"- {tool.name}({', '.join(fields)}): {summary}")
        data.setdefault("description", "Run Python code in a sandbox. These functions are available inside it "
                        "and return their results directly:\n" + "\n".join(lines) + "\nOnly what the code prints "
                        "and the value of its last expression come back; keep large data inside the code and "
                        "print summaries.")
        super().__init__(**data)
        self._host = host
        self._runner = ExecutorChoice(executor, "the run_python tool")

    def close(self) -> None:
        """Stop the tool's own loop thread and Monty executor, if it started them."""
        self._runner.close()

    async def aclose(self) -> None:
        await self._runner.aclose()

    def _run(self, code: str) -> str:
        return _execute(code, {}, self._host, self._runner, "crewai_code").for_model(self.max_output)


def _host_call(tool: BaseTool, fields: list[str]) -> Tool:
    """The host function the sandbox calls for ``tool``: positional arguments map onto its fields."""
    def call(*args: Any, **kwargs: Any) -> Any:
        if len(args) > len(fields):
            raise TypeError(f"{tool.name}() takes {len(fields)} arguments but {len(args)} were given")
        return tool.run(**dict(zip(fields, args, strict=False)), **kwargs)

    return call


def _execute(code: str, inputs: dict[str, Any], tools: dict[str, Tool], runner: ExecutorChoice,
             journal_name: str) -> ExecResult:
    """Run code from a CrewAI worker thread: inside a kernel process as ``_aexecute`` on the
    process's loop, else on the tool's own loop."""
    return route_sync(lambda ctx: _in_process(ctx, code, inputs, tools, runner, journal_name),
                      lambda: runner.get().run(code, inputs=inputs, tools=tools), runner.home,
                      f"the sandboxed tool {journal_name!r}")


async def _aexecute(code: str, inputs: dict[str, Any], tools: dict[str, Tool], runner: ExecutorChoice,
                    journal_name: str) -> ExecResult:
    """Run code as a journaled syscall inside a kernel process (``ctx.exec`` in the kernel's
    executor, or a tool syscall around a given executor), else on the tool's own loop."""
    return await route(lambda ctx: _in_process(ctx, code, inputs, tools, runner, journal_name),
                       lambda: runner.get().run(code, inputs=inputs, tools=tools), runner.home)


async def _in_process(ctx: Context, code: str, inputs: dict[str, Any], tools: dict[str, Tool],
                      runner: ExecutorChoice, journal_name: str) -> ExecResult:
    """``_aexecute`` inside a process, on its loop."""
    if runner.given is None:
        return await ctx.exec(code, inputs=inputs, tools=tools)
    given = runner.given

    async def run_given() -> Any:
        return (await given.run(code, inputs=inputs, tools=tools)).to_dict()

    run_given.__qualname__ = journal_name
    return ExecResult.from_dict(await ctx.tool(run_given))  # type: ignore[arg-type]


def _plain_description(tool: BaseTool) -> str:
    """The tool's own description, without the name/arguments header CrewAI adds to it."""
    text = str(tool.description)
    marker = "Tool Description: "
    return text.split(marker, 1)[1] if marker in text else text


# ---------------------------------------------------------------- crews and flows as processes
async def kickoff(crew_or_flow: Any, inputs: dict[str, Any] | None = None) -> Any:
    """Run ``crew_or_flow.kickoff(inputs=...)`` from a kernel program and return its result.

    It runs in a worker thread that carries the process's Context, so the crew's model calls
    and sandboxed tool runs are the process's syscalls: budgets, pause and kill apply to it,
    and it shows in ``ringzero ps`` as the process.
    """
    if Context.current() is None:
        raise RingzeroError("kickoff() runs a crew inside a kernel process: call it from a program "
                            "started with kernel.spawn(...), or call crew.kickoff() directly")
    _journal_tool_runs()
    try:
        return await asyncio.to_thread(crew_or_flow.kickoff, inputs=inputs)
    except _CrewStopped as stopped:
        raise stopped.error from None


class _CrewStopped(BaseException):
    """Carries a ``ToolInDoubt`` out of a crew: CrewAI catches a tool's exceptions and lets the
    agent try the tool again, which would run an in-doubt call a second time."""

    def __init__(self, error: ToolInDoubt) -> None:
        super().__init__(str(error))
        self.error = error


_JOURNALED = "__ringzero_journaled__"


def _journal_tool_runs() -> None:
    """Make every tool run of a CrewAI agent inside a kernel process a journaled syscall
    (installed once, by the first ``kickoff``). An agent runs its tools through the structured
    form CrewAI makes of each (``BaseTool.to_structured_tool``, on both its text and its native
    function-calling paths): that form's function is wrapped, so the run becomes
    ``ctx.journaled_tool``: recorded, served from the journal when the process is resumed, and
    in doubt (``ToolInDoubt``) if it was in flight at a crash, unless the tool is marked
    ``ringzero.idempotent``. Outside a kernel process the wrapper calls the tool as it is."""
    if getattr(BaseTool.to_structured_tool, _JOURNALED, False):
        return
    original = BaseTool.to_structured_tool

    def to_structured_tool(self: BaseTool) -> Any:
        structured = original(self)
        if not isinstance(self, (SandboxedTool, CodeExecutionTool)):  # those run as journaled execs already
            structured.func = _journaled_run(self, structured.func)
        return structured

    setattr(to_structured_tool, _JOURNALED, True)
    BaseTool.to_structured_tool = to_structured_tool  # type: ignore[method-assign]


def _journaled_run(tool: BaseTool, run: Callable[..., Any]) -> Callable[..., Any]:
    """``run`` (a CrewAI tool's body) as a journaled tool syscall of the process it runs in."""
    if getattr(run, _JOURNALED, False):
        return run
    name = tool.name

    @functools.wraps(run)
    def journaled(*args: Any, **kwargs: Any) -> Any:
        ctx = Context.current()
        if ctx is None:
            return run(*args, **kwargs)
        request = json_form({"args": list(args), "kwargs": kwargs})

        async def live() -> dict[str, Any]:
            try:
                result = await asyncio.to_thread(run, *args, **kwargs)
                if inspect.isawaitable(result):
                    result = await result
            except Exception as exc:
                return {"error": error_record(exc)}
            return {"value": result if json_problem(result, "result") is None else str(result)}

        try:
            outcome = ctx.call_from_thread(ctx.journaled_tool(f"crewai:{name}", request, live,
                                                              retry_safe=lambda: retry_safe(tool)),
                                           f"the CrewAI tool {name!r}")
        except ToolInDoubt as exc:  # the program decides, not the agent
            raise _CrewStopped(exc) from None
        return served(outcome)

    setattr(journaled, _JOURNALED, True)
    return journaled
