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
import json
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
from ringzero.core.errors import InvalidArgument, MissingExtra, NoProvider, RingzeroError, ToolFailed, ToolInDoubt
from ringzero.core.gate import LLMGate
from ringzero.core.ids import time_ordered_id
from ringzero.core.loops import LoopHome
from ringzero.core.protocols import Checkpointer, Executor, LLMProvider, Tool
from ringzero.core.routing import route, route_sync
from ringzero.core.tokens import estimate_text_tokens
from ringzero.core.types import Checkpoint, ExecResult, LLMRequest, LLMResponse, Message, json_form, json_problem

try:
    from crewai.flow.persistence.base import FlowPersistence
    from crewai.llms.base_llm import BaseLLM
    from crewai.tools import BaseTool
    from crewai.tools import tool as crewai_tool
    from pydantic import BaseModel, ConfigDict, Field, PrivateAttr
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise MissingExtra("ringzero.adapters.crewai", "crewai") from exc

__all__ = ["CodeExecutionTool", "KernelFlowPersistence", "KernelLLM", "SandboxedTool", "kickoff", "sandboxed"]

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


# ---------------------------------------------------------------- the LLM
class KernelLLM(BaseLLM):
    """A CrewAI LLM backed by a ringzero LLMProvider through an LLM gate.

    Inside a kernel process each call is ``ctx.llm`` (the process's gate, budget and journal;
    ``kernel_provider`` names which of the kernel's providers); elsewhere it goes through the
    gate given (a provider is wrapped in a gate of its own). Agents use CrewAI's text ReAct
    format, so any provider works, tool-calling or not.
    """

    llm_type: str = "ringzero"
    provider: str = "ringzero"
    kernel_provider: str = "default"
    priority: int = 10
    context_window: int = 128_000
    _gate: LLMGate | None = PrivateAttr(default=None)
    _owns_gate: bool = PrivateAttr(default=False)

    def __init__(self, provider: LLMProvider | LLMGate | None = None, **data: Any) -> None:
        inner = provider.provider if isinstance(provider, LLMGate) else provider
        data.setdefault("model", getattr(inner, "model", None) or "ringzero")
        super().__init__(**data)
        if provider is not None:
            self._gate = provider if isinstance(provider, LLMGate) else LLMGate(provider)
            self._owns_gate = self._gate is not provider

    def close(self) -> None:
        """Close the gate this LLM made for its provider (a gate given is the caller's)."""
        if self._owns_gate and self._gate is not None:
            self._gate.close()

    async def aclose(self) -> None:
        if self._owns_gate and self._gate is not None:
            await self._gate.aclose()

    def call(self, messages: Any, tools: Any = None, callbacks: Any = None, available_functions: Any = None,
             from_task: Any = None, from_agent: Any = None, response_model: Any = None) -> str:
        request = self._request(messages)
        response = route_sync(lambda ctx: self._ask_in_process(ctx, request), lambda: self._ask_gate(request),
                              lambda: self._own_gate().home, "KernelLLM.call")
        return self._answer(response)

    async def acall(self, messages: Any, tools: Any = None, callbacks: Any = None, available_functions: Any = None,
                    from_task: Any = None, from_agent: Any = None, response_model: Any = None) -> str:
        request = self._request(messages)
        # Outside a process the gate runs it on its own loop.
        response = await route(lambda ctx: self._ask_in_process(ctx, request), lambda: self._ask_gate(request))
        return self._answer(response)

    def get_context_window_size(self) -> int:
        return self.context_window

    def get_input_tokens_count(self, messages: Any, tools: Any = None, response_model: Any = None) -> int:
        """An estimate (four characters a token), as CrewAI's own fallback makes, without its
        warning on every call: the provider's real count arrives with each answer's usage."""
        text = messages if isinstance(messages, str) else "".join(_text(m.get("content")) for m in messages)
        return estimate_text_tokens(text)

    def _request(self, messages: Any) -> LLMRequest:
        if isinstance(messages, str):
            messages = [{"role": "user", "content": messages}]
        converted = []
        for message in messages:
            role = {"developer": "system"}.get(message.get("role"), message.get("role"))
            converted.append(Message(role if role in ("system", "user", "assistant") else "user",
                                     _text(message.get("content"))))
        return LLMRequest(messages=tuple(converted), model=self.model if self.model != "ringzero" else None,
                          max_tokens=int(self.max_tokens) if self.max_tokens else None,
                          temperature=self.temperature, stop=tuple(self.stop_sequences))

    async def _ask_in_process(self, ctx: Context, request: LLMRequest) -> LLMResponse:
        return await ctx.llm(list(request.messages), model=request.model, max_tokens=request.max_tokens,
                             temperature=request.temperature, stop=request.stop, provider=self.kernel_provider)

    def _own_gate(self) -> LLMGate:
        if self._gate is None:
            raise NoProvider("KernelLLM has no provider and is not running inside a kernel process: "
                             "pass KernelLLM(provider) or run the crew with kickoff() in a kernel process")
        return self._gate

    async def _ask_gate(self, request: LLMRequest) -> LLMResponse:
        return await self._own_gate().complete(request, priority=self.priority)

    def _answer(self, response: LLMResponse) -> str:
        usage = response.usage
        self._track_token_usage_internal({"prompt_tokens": usage.input_tokens,
                                          "completion_tokens": usage.output_tokens,
                                          "total_tokens": usage.total_tokens})
        return self._apply_stop_words(response.content)


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(part.get("text", "") if isinstance(part, dict) else str(part) for part in content)
    return "" if content is None else str(content)


# ---------------------------------------------------------------- Flow persistence


class KernelFlowPersistence(FlowPersistence):
    """CrewAI Flow persistence (what ``@persist`` uses) over any ringzero Checkpointer.

    Each save is one checkpoint on thread ``crewai-flow:<flow id>``, so the newest one is what
    a restarted flow loads (``flow.kickoff(inputs={"id": ...})``). Pending human feedback is
    kept in the same thread's ``pending`` namespace. CrewAI calls it synchronously: the
    checkpointer lives on one loop (``ringzero.core.loops``), a private thread unless a loop
    already uses it, which ``close()`` stops (the checkpointer itself stays the caller's).
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)
    persistence_type: str = "KernelFlowPersistence"
    _store: Checkpointer = PrivateAttr()
    _home: LoopHome = PrivateAttr()

    def __init__(self, checkpointer: Checkpointer, **data: Any) -> None:
        if not callable(getattr(checkpointer, "put", None)):
            raise InvalidArgument(f"KernelFlowPersistence needs a ringzero Checkpointer, not {checkpointer!r}")
        super().__init__(**data)
        self._store = checkpointer
        self._home = LoopHome("KernelFlowPersistence")

    def close(self) -> None:
        """Stop the private loop thread, if one was started."""
        self._home.close()

    def init_db(self) -> None:
        """Nothing to create: the checkpointer makes its schema when first used."""

    def save_state(self, flow_uuid: str, method_name: str, state_data: dict[str, Any] | BaseModel) -> None:
        self._put(flow_uuid, "", _state_dict(state_data), {"method": method_name})

    def load_state(self, flow_uuid: str) -> dict[str, Any] | None:
        record = self._home.run_sync(self._store.get(_thread(flow_uuid), ""), "KernelFlowPersistence.load_state")
        return None if record is None else dict(json.loads(record.payload))

    def save_pending_feedback(self, flow_uuid: str, context: Any, state_data: dict[str, Any] | BaseModel) -> None:
        state = _state_dict(state_data)
        self._put(flow_uuid, "", state, {"method": context.method_name})
        self._put(flow_uuid, "pending", {"context": context.to_dict(), "state": state}, {"pending": True})

    def load_pending_feedback(self, flow_uuid: str) -> tuple[dict[str, Any], Any] | None:
        from crewai.flow.async_feedback.types import PendingFeedbackContext

        record = self._home.run_sync(self._store.get(_thread(flow_uuid), "pending"), "KernelFlowPersistence")
        if record is None or not record.metadata.get("pending"):
            return None
        body = json.loads(record.payload)
        return body["state"], PendingFeedbackContext.from_dict(body["context"])

    def clear_pending_feedback(self, flow_uuid: str) -> None:
        self._put(flow_uuid, "pending", {}, {"pending": False})

    def _put(self, flow_uuid: str, namespace: str, body: dict[str, Any], metadata: dict[str, Any]) -> None:
        checkpoint_id = time_ordered_id()  # newest sorts last, across processes
        payload = json.dumps(body, default=_json_default).encode()
        record = Checkpoint(_thread(flow_uuid), namespace, checkpoint_id, payload, metadata=metadata)
        self._home.run_sync(self._store.put(record), "KernelFlowPersistence")


def _thread(flow_uuid: str) -> str:
    return f"crewai-flow:{flow_uuid}"


def _state_dict(state: dict[str, Any] | BaseModel) -> dict[str, Any]:
    if isinstance(state, BaseModel):
        return state.model_dump(mode="json")
    if isinstance(state, dict):
        return state
    raise InvalidArgument(f"flow state must be a dict or a pydantic model, not {type(state).__name__}")


def _json_default(value: Any) -> Any:
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    if isinstance(value, (set, tuple)):
        return list(value)
    return str(value)


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
