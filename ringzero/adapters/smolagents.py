"""smolagents on ringzero: a ``CodeAgent``'s actions in a ringzero session, its tools on the
host, its model through the kernel's gate.

    agent = CodeAgent(tools=[...], model=KernelModel(), executor=KernelExecutor())
    answer = await asyncio.to_thread(agent.run, "the task")      # in a kernel process

- ``KernelExecutor``: smolagents' executor hook (``CodeAgent(executor=...)``). Each code action
  is a step of one session (``ctx.session()``): what a step defines (names, functions, classes,
  imports) is there in the next, as in smolagents' own executors. Monty by default; a
  ``ProcessExecutor`` for full CPython. smolagents' tools stay on the host: the code calls them
  as functions with their declared inputs, and only their results cross into the sandbox (so a
  tool's keys never do). A tool whose ``forward`` takes ``idempotency_key`` gets the kernel's
  key for the call. ``final_answer(...)`` ends the step, as in smolagents: the answer is what
  the agent's final answer tool returns, on the host.
- ``KernelModel``: a smolagents ``Model`` whose calls are ``ctx.llm`` in a kernel process (the
  process's gate, budget and journal), or go through the gate of the provider given elsewhere.

Inside a kernel process the agent is durable: each model call and each step (with each tool
call its code makes) is journaled, so after a crash the resumed process is served what was
recorded, gets its session back as it was after the last finished step, and makes no recorded
call again (the one in flight at the crash is in doubt, or runs again under its key). Outside a
process the executor is a local sandbox for smolagents, as E2B's or Docker's are remote ones:
its session lives on ringzero's runtime loop.

Values that cross (the final answer, tools' arguments and results, ``send_variables``) are JSON,
as everything the journal holds is: an image or another object is refused with an error naming it.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Mapping
from typing import Any

from ringzero.adapters._asking import ask_in_process, gate_for, own_gate
from ringzero.core.context import Context
from ringzero.core.contract.errors import InvalidArgument, MissingExtra
from ringzero.core.contract.protocols import Executor, LLMProvider
from ringzero.core.contract.types import JSON, ExecLimits, ExecResult, LLMRequest, LLMResponse, Message, json_problem
from ringzero.core.routing import route_sync
from ringzero.core.support.effects import takes_idempotency_key
from ringzero.core.support.gate import LLMGate
from ringzero.core.support.interpreters import check_keeps_interpreter, open_interpreter
from ringzero.core.support.loops import LoopHome
from ringzero.core.support.tool_parameters import IDEMPOTENCY_KEY

try:
    from smolagents.local_python_executor import CodeOutput, PythonExecutor
    from smolagents.models import ChatMessage, MessageRole, Model
    from smolagents.monitoring import AgentLogger, LogLevel, TokenUsage
    from smolagents.tools import Tool as SmolTool
    from smolagents.utils import AgentError
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise MissingExtra("ringzero.adapters.smolagents", "smolagents") from exc

__all__ = ["FINAL_ANSWER_ON_HOST", "KernelExecutor", "KernelModel"]

FINAL_ANSWER_ON_HOST = "final_answer_on_host"
"""The host tool behind the code's ``final_answer``: the agent's final answer tool, run on the host."""

_FINAL_ANSWER = f"""
def final_answer(*args, **kwargs):
    {FINAL_ANSWER_ON_HOST}(*args, **kwargs)
    raise SystemExit("final_answer")
"""
"""Defined once in each session: ``final_answer`` stops the step as smolagents' does. SystemExit
passes the code's ``except Exception``; the answer itself is the host tool's recorded result."""


class KernelExecutor(PythonExecutor):
    """smolagents' ``PythonExecutor`` on a ringzero session (see the module).

    ``executor``: where the code runs (None: the kernel's executor in a kernel process, a
    ``MontyExecutor`` of its own elsewhere); it must keep an interpreter between runs
    (``capabilities.sessions``). ``limits``: each step's, and the session's memory.
    """

    def __init__(self, executor: Executor | None = None, *, limits: ExecLimits | None = None,
                 logger: AgentLogger | None = None) -> None:
        self.executor = executor
        self.limits = limits
        self.logger = logger if logger is not None else AgentLogger(level=LogLevel.OFF)
        self.tools: dict[str, Any] = {}
        """The host tools the code calls, by name (``send_tools``)."""
        self._variables: dict[str, JSON] = {}
        self._sessions: dict[int, Any] = {}
        """Per kernel process (its pid), its session: the ``Session`` ``ctx.session`` made."""
        self._defined: set[int] = set()
        """The pids whose session has ``final_answer`` defined (0: the session outside a kernel)."""
        self._local: Any = None
        """Outside a kernel process: the executor's own session, on ``_home``'s loop."""
        self._owned: Executor | None = None
        self._home: LoopHome | None = None

    # ------------------------------------------------------------------ smolagents' hooks
    def send_tools(self, tools: Mapping[str, SmolTool]) -> None:
        """The agent's tools, as host tools the code calls by name; its ``final_answer`` tool
        behind the code's ``final_answer`` (which ends the step)."""
        hosted: dict[str, Any] = {}
        for name, tool in tools.items():
            if not callable(tool):
                raise InvalidArgument(f"tool {name!r} is a {type(tool).__name__}, not a smolagents Tool")
            hosted[FINAL_ANSWER_ON_HOST if name == "final_answer" else name] = host_tool(tool)
        self.tools = hosted

    def send_variables(self, variables: Mapping[str, Any]) -> None:
        """Variables the next step finds defined (``agent.run(additional_args=...)``): JSON only."""
        for name, value in variables.items():
            problem = json_problem(value, f"variable {name!r}")
            if problem is not None:
                raise InvalidArgument(f"{problem}: it cannot enter the sandbox, where only JSON values do")
        self._variables.update(variables)

    def __call__(self, code_action: str) -> CodeOutput:
        """Run one action as the session's next step. The code's error raises ``AgentError``
        (its output and the error, for the model to read), as smolagents' executors do."""
        result = route_sync(lambda ctx: self._step_in_process(ctx, code_action), lambda: self._step_here(code_action),
                            self._own_home, "KernelExecutor (a CodeAgent's step)")
        answered = [call for call in result.tool_calls if call.name == FINAL_ANSWER_ON_HOST and call.error is None]
        if result.error is not None and result.error.type == "SystemExit" and answered:
            return CodeOutput(output=answered[-1].result, logs=result.stdout, is_final_answer=True)
        if result.error is not None:
            raise AgentError(f"{result.stdout}Code execution failed: {result.error.type}: {result.error.message}",
                             self.logger)
        return CodeOutput(output=result.value, logs=result.stdout, is_final_answer=False)

    def cleanup(self) -> None:
        """Close what ran outside a kernel process: the session, and the executor it ran on
        (given or made: it lived on ringzero's runtime loop, where only this can close it).
        A kernel process's sessions close with it, and the kernel's executor with the kernel."""
        if self._home is None:
            return
        home, self._home = self._home, None
        local, used = self._local, self._owned if self._owned is not None else self.executor
        self._local = self._owned = None

        async def close() -> None:
            if local is not None:
                await local.aclose()
            if used is not None:
                await used.aclose()

        with contextlib.suppress(Exception):
            home.run_sync(close(), "KernelExecutor.cleanup")
        home.close()

    def close(self) -> None:
        self.cleanup()

    # ------------------------------------------------------------------ where a step runs
    async def _step_in_process(self, ctx: Context, code: str) -> ExecResult:
        session = self._sessions.get(ctx.pid)
        if session is None or session.closed:  # a closed one's process ended: this is a new run of the pid
            session = self._sessions[ctx.pid] = ctx.session(executor=self.executor, limits=self.limits)
            self._defined.discard(ctx.pid)
        if ctx.pid not in self._defined and FINAL_ANSWER_ON_HOST in self.tools:
            await session.exec(_FINAL_ANSWER)
            self._defined.add(ctx.pid)
        inputs, self._variables = self._variables, {}
        result: ExecResult = await session.exec(code, inputs=inputs, tools=self.tools)
        return result

    async def _step_here(self, code: str) -> ExecResult:
        if self._local is None:
            executor = self.executor
            if executor is None:
                from ringzero.providers.executors import MontyExecutor

                executor = self._owned = MontyExecutor()
            check_keeps_interpreter(executor, "KernelExecutor")
            self._local = await open_interpreter(executor, self.limits)
        if 0 not in self._defined and FINAL_ANSWER_ON_HOST in self.tools:
            await self._local.run(_FINAL_ANSWER)
            self._defined.add(0)
        inputs, self._variables = self._variables, {}
        result: ExecResult = await self._local.run(code, inputs=inputs, tools=self.tools, limits=self.limits)
        return result

    def _own_home(self) -> LoopHome:
        if self._home is None:
            self._home = LoopHome("KernelExecutor", private=True)
        return self._home


def host_tool(tool: SmolTool) -> Any:
    """``tool`` as a host function the code calls: its declared inputs as its parameters (by
    position or by name; a nullable one may be left out), and ``idempotency_key``, the kernel's
    key for the call, where its ``forward`` takes one."""
    inputs: Mapping[str, Mapping[str, Any]] = getattr(tool, "inputs", None) or {}
    keyed = takes_idempotency_key(getattr(tool, "forward", None))
    parameters = [inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                    **({"default": None} if spec.get("nullable") else {}))
                  for name, spec in inputs.items() if name != IDEMPOTENCY_KEY]
    parameters.sort(key=lambda p: p.default is not inspect.Parameter.empty)  # required ones first, as Python asks
    if keyed:
        parameters.append(inspect.Parameter(IDEMPOTENCY_KEY, inspect.Parameter.KEYWORD_ONLY, default=""))
    signature = inspect.Signature(parameters)

    def call(*args: Any, **kwargs: Any) -> Any:
        bound = signature.bind(*args, **kwargs)
        return tool(**bound.arguments)

    call.__name__ = getattr(tool, "name", "tool")
    call.__doc__ = getattr(tool, "description", None)
    call.__signature__ = signature  # type: ignore[attr-defined]
    return call


# ---------------------------------------------------------------------- the model
_ROLES = {"system": "system", "user": "user", "assistant": "assistant", "tool-call": "assistant",
          "tool-response": "user"}


class KernelModel(Model):
    """A smolagents ``Model`` backed by a ringzero provider through an LLM gate.

    Inside a kernel process each call is ``ctx.llm`` (the process's gate, budget and journal;
    ``kernel_provider`` names which of the kernel's providers); elsewhere it goes through the
    gate of ``provider`` (a provider is wrapped in a gate of its own). Text in, text out: the
    model's code is what a ``CodeAgent`` reads, so any provider works. Native tool calling
    (``ToolCallingAgent``) is not supported: such a call is refused naming ``CodeAgent``.
    """

    def __init__(self, provider: LLMProvider | LLMGate | None = None, *, kernel_provider: str = "default",
                 priority: int = 10, model_id: str | None = None, max_tokens: int | None = None,
                 temperature: float | None = None, **kwargs: Any) -> None:
        inner = provider.provider if isinstance(provider, LLMGate) else provider
        super().__init__(model_id=model_id or getattr(inner, "model", None) or "ringzero", **kwargs)
        self.kernel_provider = kernel_provider
        self.priority = priority
        self.max_tokens = max_tokens
        self.temperature = temperature
        self._gate, self._owns_gate = gate_for(provider)

    def generate(self, messages: list[ChatMessage | dict[str, Any]], stop_sequences: list[str] | None = None,
                 response_format: dict[str, str] | None = None, tools_to_call_from: list[SmolTool] | None = None,
                 **kwargs: Any) -> ChatMessage:
        if tools_to_call_from:
            raise InvalidArgument("KernelModel answers in text: use it with a CodeAgent (whose actions are code), "
                                  "not with native tool calling (ToolCallingAgent)")
        request = LLMRequest(messages=tuple(_message(m) for m in messages), max_tokens=self.max_tokens,
                             temperature=self.temperature, stop=tuple(stop_sequences or ()),
                             model=self.model_id if self.model_id != "ringzero" else None)
        response = route_sync(lambda ctx: self._ask_in_process(ctx, request), lambda: self._ask_gate(request),
                              lambda: self._own_gate().home, "KernelModel.generate")
        usage = response.usage
        return ChatMessage(role=MessageRole.ASSISTANT, content=response.content, raw=None,
                           token_usage=TokenUsage(input_tokens=usage.input_tokens, output_tokens=usage.output_tokens))

    async def _ask_in_process(self, ctx: Context, request: LLMRequest) -> LLMResponse:
        return await ask_in_process(ctx, request, self.kernel_provider)

    def _own_gate(self) -> LLMGate:
        return own_gate(self._gate, "KernelModel has no provider and is not running inside a kernel process: pass "
                                    "KernelModel(provider) or run the agent in a kernel process")

    async def _ask_gate(self, request: LLMRequest) -> LLMResponse:
        return await self._own_gate().complete(request, priority=self.priority)

    def close(self) -> None:
        """Close the gate this model made for its provider (a gate given is the caller's)."""
        if self._owns_gate and self._gate is not None:
            self._gate.close()


def _message(message: ChatMessage | dict[str, Any]) -> Message:
    """A smolagents message as ringzero's: its role (a tool's call and answer as the assistant's
    and the user's turns, as smolagents' text models see them) and its text."""
    if isinstance(message, ChatMessage):
        role, content = str(getattr(message.role, "value", message.role)), message.content
    else:
        role, content = str(getattr(message.get("role"), "value", message.get("role"))), message.get("content")
    if isinstance(content, list):
        content = "".join(part.get("text", "") if isinstance(part, dict) else str(part) for part in content)
    return Message(_ROLES.get(role, "user"), "" if content is None else str(content))  # type: ignore[arg-type]
