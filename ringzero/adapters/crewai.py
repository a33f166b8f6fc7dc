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
import contextvars
import functools
import inspect
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from ringzero.adapters._shipping import ARGUMENTS, POSITIONAL, ExecutorChoice, raise_as_raised, shippable_call
from ringzero.core.context import Context
from ringzero.core.contract.errors import (
    InvalidArgument,
    MissingExtra,
    RingzeroError,
    ToolFailed,
    ToolInDoubt,
)
from ringzero.core.contract.outcomes import Outcome, Value, failure
from ringzero.core.contract.protocols import Executor, Tool
from ringzero.core.contract.types import ExecResult, json_form, json_problem
from ringzero.core.routing import route_sync
from ringzero.core.support.effects import check_in_doubt, in_doubt_report, retry_safe, served, takes_idempotency_key
from ringzero.core.support.tool_parameters import IDEMPOTENCY_KEY, schema_tool

try:
    from crewai.tools import BaseTool
    from crewai.tools import tool as crewai_tool
    from pydantic import BaseModel, Field, PrivateAttr, create_model
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise MissingExtra("ringzero.adapters.crewai", "crewai") from exc

from ringzero.adapters.crewai_flows import KernelFlowPersistence
from ringzero.adapters.crewai_llm import KernelLLM
from ringzero.adapters.crewai_provider import CrewLLMProvider

__all__ = ["CodeExecutionTool", "CrewLLMProvider", "KernelFlowPersistence", "KernelLLM", "SandboxedTool", "kickoff",
           "sandboxed"]


# ---------------------------------------------------------------- tools
if TYPE_CHECKING:  # what it is to its users: a CrewAI tool that can be closed
    _Base = BaseTool
else:  # at run time a plain mixin: the tool's own class keeps its fields
    _Base = object


class SandboxedTool(_Base):
    """What ``sandboxed`` mixes into a copy of a tool's own class: its body runs in a ringzero
    executor. The rest is the original's: its class (and the class name CrewAI's tool events
    report), name, description, ``args_schema``, ``func``, caching, usage limit, failure policy
    and every other field; ``run`` and ``arun`` validate and count a use as CrewAI's do, and
    ``arun`` of a sync tool refuses as CrewAI's sync tools do."""

    _ringzero_shipped: Any

    def close(self) -> None:
        """Stop the tool's own loop thread and Monty executor, if it started them."""
        self._ringzero_shipped.runner.close()

    async def aclose(self) -> None:
        await self._ringzero_shipped.runner.aclose()

    def run(self, *args: Any, **kwargs: Any) -> Any:
        if not args:
            kwargs = self._validate_kwargs(kwargs)
        refused = self._claim_usage()
        if refused:
            return refused
        result = self._run(*args, **kwargs)
        return asyncio.run(result) if asyncio.iscoroutine(result) else result  # an async body, as CrewAI runs one

    async def arun(self, *args: Any, **kwargs: Any) -> Any:
        if not args:
            kwargs = self._validate_kwargs(kwargs)
        refused = self._claim_usage()
        return refused if refused else await self._arun(*args, **kwargs)

    def _run(self, *args: Any, **kwargs: Any) -> Any:
        """The body's result; for an async body (``async def`` function or ``_run``), a
        coroutine, as the original's ``_run`` returns, that runs it when awaited."""
        shipped: _Shipped = self._ringzero_shipped
        if shipped.code_is_async:
            return asyncio.to_thread(shipped.run, shipped.code, args, kwargs)
        return shipped.run(shipped.code, args, kwargs)

    async def _arun(self, *args: Any, **kwargs: Any) -> Any:
        """The async body (an ``async def`` tool's, or a class's own ``_arun``), from a worker
        thread as a sync run is made. A sync tool refuses, as CrewAI's own sync tools do: its
        async paths run ``_run`` on a worker thread instead."""
        shipped: _Shipped = self._ringzero_shipped
        code = shipped.asynchronous
        if code is None:
            raise NotImplementedError(f"{type(self).__name__} does not implement _arun. Override _arun for async "
                                      "support or use run() for sync execution.")
        return await asyncio.to_thread(shipped.run, code, args, kwargs)


class _Shipped:
    """One sandboxed tool's code, and where it runs."""

    def __init__(self, name: str, code: str, asynchronous: str | None, runner: ExecutorChoice, *,
                 code_is_async: bool) -> None:
        self.name, self.code, self.asynchronous, self.runner = name, code, asynchronous, runner
        self.code_is_async = code_is_async
        self.journal = f"crewai_tool:{name}"

    def run(self, code: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        result = _execute(code, {ARGUMENTS: kwargs, POSITIONAL: list(args)}, {}, self.runner, self.journal)
        if result.error is not None:
            raise_as_raised(ToolFailed(self.name, result.error.type, result.error.message))
        return result.value


_SANDBOXED_CLASSES: dict[type[BaseTool], type[SandboxedTool]] = {}


def _sandboxed_class(cls: type[BaseTool]) -> type[SandboxedTool]:
    """``cls`` with ``SandboxedTool`` before it, under the same name (one class per tool class)."""
    made = _SANDBOXED_CLASSES.get(cls)
    if made is None:
        namespace: dict[str, Any] = {
            "__module__": cls.__module__, "__qualname__": cls.__qualname__,
            "__annotations__": {"_ringzero_shipped": Any}, "_ringzero_shipped": PrivateAttr(default=None)}
        if inspect.iscoroutinefunction(cls._run):  # an async _run stays one: CrewAI awaits what it returns

            @functools.wraps(cls._run)
            async def _run(self: SandboxedTool, *args: Any, **kwargs: Any) -> Any:
                return await SandboxedTool._run(self, *args, **kwargs)

            namespace["_run"] = _run
        made = _SANDBOXED_CLASSES[cls] = type(cls.__name__, (SandboxedTool, cls), namespace)
    return made


def sandboxed(tool: BaseTool | Callable[..., Any], executor: Executor | str | None = None) -> SandboxedTool:
    """A CrewAI tool like ``tool`` whose body runs in ``executor`` (by default the kernel's inside
    a kernel process, else Monty): a copy of the tool, of its own class, with every field it had.

    Takes a ``@tool`` function (sync or async), a ``BaseTool`` subclass whose ``_run`` (and
    ``_arun``) use only their arguments, or a plain function. Raises InvalidArgument now if a
    body cannot run on its own in a sandbox (see ``shippable_source`` and ``check_parameters``).
    """
    if isinstance(tool, SandboxedTool):
        raise InvalidArgument(f"tool {tool.name!r} is sandboxed already")
    if isinstance(tool, BaseTool):
        fn = getattr(tool, "func", None)
        if fn is not None:
            body, code = fn, shippable_call(fn)
            asynchronous = code if inspect.iscoroutinefunction(fn) else None
        else:  # a BaseTool subclass: its _run, and its own _arun where it has one
            cls = type(tool)
            body, code = cls._run, shippable_call(cls._run, method=True)
            asynchronous = shippable_call(cls._arun, method=True) if cls._arun is not BaseTool._arun else None
        template = tool
    elif callable(tool):
        body, code = tool, shippable_call(tool)
        asynchronous = code if inspect.iscoroutinefunction(tool) else None
        template = crewai_tool(tool)
    else:
        raise InvalidArgument(f"sandboxed() needs a CrewAI tool or a function, not {tool!r}")
    # Every field CrewAI reads (func, cache_function, result_as_answer, max_usage_count, the
    # failure policy, env_vars, result_schema, ...) as the original has it; only the body moves.
    carried = {field: getattr(template, field) for field in type(template).model_fields
               if field not in ("name", "description", "args_schema", "description_updated")}
    cls = _sandboxed_class(type(template))
    wrapped = cls(name=template.name, description=_plain_description(template), args_schema=template.args_schema,
                  **carried)
    wrapped._ringzero_shipped = _Shipped(template.name, code, asynchronous,
                                         ExecutorChoice(executor, f"the sandboxed tool {template.name!r}"),
                                         code_is_async=inspect.iscoroutinefunction(body))
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
            host[tool.name] = _host_call(tool)
            summary = (_plain_description(tool).strip().splitlines() or [""])[0]
            lines.append(f"- {tool.name}({', '.join(inspect.signature(host[tool.name]).parameters)}): {summary}")
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


def _host_call(tool: BaseTool) -> Tool:
    """The host function the sandbox calls for ``tool``: its parameters are the fields of its
    ``args_schema`` (its author's declaration of what the model sets), positional or by keyword."""
    fields = tool.args_schema.model_fields
    return schema_tool(tool.name, list(fields), [name for name, f in fields.items() if f.is_required()],
                       lambda given: tool.run(**given))


def _execute(code: str, inputs: dict[str, Any], tools: dict[str, Tool], runner: ExecutorChoice,
             journal_name: str) -> ExecResult:
    """Run code from a CrewAI worker thread: inside a kernel process as a journaled syscall on
    the process's loop (``_in_process``), else on the tool's own loop."""
    return route_sync(lambda ctx: _in_process(ctx, code, inputs, tools, runner),
                      lambda: runner.get().run(code, inputs=inputs, tools=tools), runner.home,
                      f"the sandboxed tool {journal_name!r}")


async def _in_process(ctx: Context, code: str, inputs: dict[str, Any], tools: dict[str, Tool],
                      runner: ExecutorChoice) -> ExecResult:
    """A run inside a process, on its loop: ``ctx.exec`` in the kernel's executor or the tool's
    own, each call the code makes journaled under the run's slot (under the tool call's, where
    the crew's tool runs are journaled: ``kickoff``)."""
    return await ctx.exec(code, inputs=inputs, tools=tools, executor=runner.given)


def _plain_description(tool: BaseTool) -> str:
    """The tool's own description, without the name/arguments header CrewAI adds to it."""
    text = str(tool.description)
    marker = "Tool Description: "
    return text.split(marker, 1)[1] if marker in text else text


# ---------------------------------------------------------------- crews and flows as processes
async def kickoff(crew_or_flow: Any, inputs: dict[str, Any] | None = None, *, in_doubt: str = "raise") -> Any:
    """Run ``crew_or_flow.kickoff(inputs=...)`` from a kernel program and return its result.

    It runs in a worker thread that carries the process's Context, so the crew's model calls
    and sandboxed tool runs are the process's syscalls: budgets, pause and kill apply to it,
    and it shows in ``ringzero ps`` as the process.

    A tool that takes an ``idempotency_key`` parameter gets the kernel's key on every live run
    (the same when an in-doubt run is made again after a crash), and the agent is not shown the
    parameter. A run in doubt (in flight when the host died, its tool neither keyed nor
    idempotent) raises ``ToolInDoubt`` out of the crew to the program (``in_doubt="raise"``),
    or with ``in_doubt="report"`` is the tool's error text telling the agent its outcome is
    unknown, so the crew goes on.
    """
    if Context.current() is None:
        raise RingzeroError("kickoff() runs a crew inside a kernel process: call it from a program "
                            "started with kernel.spawn(...), or call crew.kickoff() directly")
    token = _IN_DOUBT.set(check_in_doubt(in_doubt))
    _journal_tool_runs()
    try:  # a ToolInDoubt passes CrewAI's catch of a tool's exceptions: a KernelInterrupt
        return await asyncio.to_thread(crew_or_flow.kickoff, inputs=inputs)
    finally:
        _IN_DOUBT.reset(token)


_IN_DOUBT: contextvars.ContextVar[str] = contextvars.ContextVar("ringzero_crew_in_doubt", default="raise")
"""What the tool runs of the crew that ``kickoff`` runs here do with an in-doubt run."""


def _hide_key(tool: Any) -> None:
    """Leave the ``idempotency_key`` parameter out of what the agent is shown of ``tool`` (its
    ``args_schema``, from which CrewAI writes the tool's description and function schema): the
    kernel fills it (``_journaled_run``)."""
    schema = getattr(tool, "args_schema", None)
    if not (isinstance(tool, BaseTool) and isinstance(schema, type) and issubclass(schema, BaseModel)):
        return
    if IDEMPOTENCY_KEY not in schema.model_fields or not takes_idempotency_key(tool):
        return
    fields: Any = {name: (field.annotation, field) for name, field in schema.model_fields.items()
                   if name != IDEMPOTENCY_KEY}
    tool.args_schema = create_model(schema.__name__, __doc__=schema.__doc__, **fields)


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
        _hide_key(self)
        structured = original(self)
        if not isinstance(self, (SandboxedTool, CodeExecutionTool)):  # those run as journaled execs already
            structured.func = _journaled_run(self, structured.func)
        return structured

    setattr(to_structured_tool, _JOURNALED, True)
    setattr(BaseTool, "to_structured_tool", to_structured_tool)  # noqa: B010  (a method: mypy refuses the assignment)


def _journaled_run(tool: BaseTool, run: Callable[..., Any]) -> Callable[..., Any]:
    """``run`` (a CrewAI tool's body) as a journaled tool syscall of the process it runs in."""
    if getattr(run, _JOURNALED, False):
        return run
    name = tool.name
    keyed = takes_idempotency_key(tool)

    @functools.wraps(run)
    def journaled(*args: Any, **kwargs: Any) -> Any:
        ctx = Context.current()
        if ctx is None:
            return run(*args, **kwargs)
        request = json_form({"args": list(args), "kwargs": kwargs})

        async def live() -> Outcome:
            # The kernel's key, the same on a re-run, whatever the agent passed.
            given = {**kwargs, IDEMPOTENCY_KEY: ctx.idempotency_key()} if keyed else kwargs
            try:
                result = await asyncio.to_thread(run, *args, **given)
                if inspect.isawaitable(result):
                    result = await result
            except Exception as exc:
                return failure(exc)
            return Value(result if json_problem(result, "result") is None else str(result))

        try:
            outcome = ctx.call_from_thread(ctx.journaled_tool(f"crewai:{name}", request, live,
                                                              retry_safe=lambda: retry_safe(tool)),
                                           f"the CrewAI tool {name!r}")
        except ToolInDoubt:
            if _IN_DOUBT.get() == "report":  # the agent is told, the same on every replay
                return in_doubt_report(name)
            raise  # the program decides, not the agent: CrewAI's `except Exception` lets it by
        return served(outcome)

    setattr(journaled, _JOURNALED, True)
    return journaled
