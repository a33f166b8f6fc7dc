"""``CodeAgent``: programmatic tool calling, the loop as a kernel program.

The model writes Python; the kernel runs it in the executor with the registered tools as
plain functions inside (their calls cross back to the host); only what the code prints, its
final value or its error returns to the model, capped in size. The loop ends when the code
calls ``final_answer(value)``, when the model answers without code, after ``max_steps``, or
when the process's budget runs out. Every model call and run is a syscall, so a task killed
mid-way resumes from its journal without repeating them.

    agent = create_agent(tools=[get_stock_history], llm=OpenAIProvider("gpt-4o-mini"))
    answer, output, error = agent.execute_task("Mean closing price of AAPL last year?")
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from ringzero.agents.host import KernelHost
from ringzero.agents.registry import ToolRegistry, signature_of
from ringzero.core.context import Context
from ringzero.core.contract.egress import PLACEHOLDER_PREFIX, Egress
from ringzero.core.contract.errors import InvalidArgument, NoProvider
from ringzero.core.contract.protocols import Checkpointer, Executor, LLMProvider
from ringzero.core.contract.types import JSON, ExecLimits, ExecResult, Limits, Message
from ringzero.core.kernel import Kernel
from ringzero.core.support.loops import Closing
from ringzero.core.support.tool_parameters import code_may_set

__all__ = [
    "AgentConfig",
    "AgentResult",
    "CodeAgent",
    "code_agent_program",
    "code_run_program",
    "create_agent",
    "execute_task",
    "solve",
]

_CODE_BLOCK = re.compile(r"```(?:python|py)?[ \t]*\n(.*?)```", re.S)

SYSTEM_PROMPT = """You solve tasks by writing Python code, which runs in a sandbox.
These functions are already defined there; call them directly, they return their results:
{tools}
- search_tools(query): find more functions by what they do; returns their descriptions.
- final_answer(value): call this with the answer when you have it.

Reply with one ```python code block. Keep large data inside the code: the sandbox keeps
variables only within one block, and you see only what the code prints (keep it short), its
last expression, or its error. You then write the next block, until you call final_answer."""

WORKSPACE_NOTE = """
Files you write in the directory `workspace` (a variable in the code) are kept between tasks."""


@dataclass(frozen=True)
class AgentConfig:
    """What a code agent process needs to run again after a restart (all JSON)."""

    tools: list[str] = field(default_factory=list)
    """``module:qualname`` of each tool."""
    max_steps: int = 8
    tool_limit: int = 8
    """At most this many tools are described up front; the model finds the rest with search_tools."""
    max_observation: int = 4000
    provider: str = "default"
    inputs: dict[str, JSON] = field(default_factory=dict)
    """Variables defined in every block the model's code runs in (e.g. the data of a RecursiveAgent)."""
    system_prompt: str | None = None
    context_budget: int | None = None
    """Tokens the loop's messages may take; past it the oldest steps fold into notes
    (``ctx.conversation``). None: every step stays in the prompt (bounded by ``max_steps``)."""
    network: dict[str, JSON] = field(default_factory=dict)
    """What the prompt says of the agent's egress: its ``routes`` and ``secrets`` (names only;
    the policy and the values stay with the agent's executor, never in the journal)."""

    def to_dict(self) -> dict[str, JSON]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> AgentConfig:
        return cls(**dict(data))


@dataclass(frozen=True)
class AgentResult:
    """How a task ended: the answer, everything the code printed, and the error if it failed."""

    answer: JSON
    output: str
    error: str | None
    steps: int

    def as_tuple(self) -> tuple[JSON, str, str | None]:
        """``(result, output, error)``."""
        return self.answer, self.output, self.error

    def __iter__(self) -> Iterator[Any]:
        """Unpacks as ``result, output, error = agent.execute_task(...)``, the shape the
        code-execution agents ringzero grew from return."""
        return iter(self.as_tuple())

    def __getitem__(self, index: int) -> Any:
        return self.as_tuple()[index]

    def to_dict(self) -> dict[str, JSON]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> AgentResult:
        return cls(data.get("answer"), str(data.get("output") or ""), data.get("error"), int(data.get("steps") or 0))


@code_may_set("value")
def _final_answer(value: JSON = None) -> JSON:
    """Ends the task with ``value`` (the host reads it from the run's record of tool calls)."""
    return value


async def solve(ctx: Context, task: str, config: AgentConfig,
                extra_tools: Mapping[str, Callable[..., Any]] | None = None) -> AgentResult:
    """The programmatic-tool-calling loop, inside a kernel process."""
    registry = ToolRegistry(config.tools)
    shown = [spec.name for spec in registry.search(task, config.tool_limit)] if len(registry) > config.tool_limit \
        else [spec.name for spec in registry]
    extra = dict(extra_tools or {})
    described = "\n".join(filter(None, [registry.describe(shown),
                                        "\n".join(f"- {n}{signature_of(f)}: {_summary(f)}" for n, f in extra.items())]))

    @code_may_set("limit")
    def search_tools(query: str, limit: int = 5) -> str:
        """Describe the registered functions that match ``query``."""
        return registry.describe(spec.name for spec in registry.search(query, limit)) or "no matching functions"

    functions: dict[str, Callable[..., Any]] = {**registry.functions(), **extra, "search_tools": search_tools,
                                                "final_answer": _final_answer}
    if config.network:
        described = "\n".join(filter(None, [described, _network_note(config.network)]))
    system = (config.system_prompt or SYSTEM_PROMPT).replace("{tools}", described or "(none)")
    if "workspace" in config.inputs:
        system += WORKSPACE_NOTE
    if config.context_budget is not None:  # the task goes in the system prompt, which never folds
        system += f"\n\nYour task: {task}"
    conversation = ctx.conversation(system, budget=config.context_budget or 2**62, provider=config.provider,
                                    name="code-agent")
    if config.context_budget is None:
        conversation.add(Message("user", task))
    else:
        conversation.add(Message("user", "Begin."))
    printed: list[str] = []
    for step in range(1, config.max_steps + 1):
        reply = await conversation.ask()
        code = _code_of(reply.content)
        if code is None:  # the model answered in words
            return AgentResult(reply.content.strip(), "".join(printed), None, step)
        result = await ctx.exec(code, inputs=config.inputs, tools=functions)
        printed.append(result.stdout)
        final = _final_value(result)
        if final is not None:
            return AgentResult(final[0], "".join(printed), None, step)
        conversation.add(Message("user", "Observation:\n" + result.for_model(config.max_observation)))
    return AgentResult(None, "".join(printed), f"no final answer after {config.max_steps} steps", config.max_steps)


def _network_note(network: Mapping[str, Any]) -> str:
    """The ``http_request`` tool, as the model is told of it."""
    note = ("- http_request(method, url, headers=None, body=None): an HTTP request; returns {'status', "
            "'headers', 'text'}. Allowed: " + ", ".join(str(r) for r in network.get("routes") or []) + ".")
    secrets = list(network.get("secrets") or [])
    if secrets:
        note += (" Where a key goes, write its placeholder (" + ", ".join(f"'{PLACEHOLDER_PREFIX}{n}'" for n in secrets)
                 + "): the host puts the real key in; you never see it.")
    added = list(network.get("added") or [])
    if added:
        note += " The host adds these keys itself (" + "; ".join(str(a) for a in added) + "): send no key for them."
    return note


def _code_of(text: str) -> str | None:
    blocks = _CODE_BLOCK.findall(text)
    return "\n".join(blocks) if blocks else None


def _final_value(result: ExecResult) -> tuple[JSON] | None:
    for call in result.tool_calls:
        if call.name == "final_answer" and call.error is None:
            value = call.args[0] if call.args else call.kwargs.get("value")
            return (json.loads(json.dumps(value, default=repr)),)  # as a resumed task would see it
    return None


def _summary(fn: Callable[..., Any]) -> str:
    return ((fn.__doc__ or "").strip().splitlines() or [""])[0]


async def code_agent_program(ctx: Context, task: str, config: dict[str, JSON]) -> dict[str, JSON]:
    """The kernel program behind every CodeAgent task (importable, so recover() resumes it)."""
    return (await solve(ctx, task, AgentConfig.from_dict(config))).to_dict()


async def code_run_program(ctx: Context, code: str, config: dict[str, JSON]) -> str:
    """One run of given code with the agent's tools (``CodeAgent.execute_code``), as a process."""
    settings = AgentConfig.from_dict(config)
    registry = ToolRegistry(settings.tools)
    result = await ctx.exec(code, inputs=settings.inputs, tools=registry.functions())
    return result.for_model(settings.max_observation)


class CodeAgent(Closing):
    """A code agent with a kernel of its own: ``execute_task`` runs one task as a kernel process.

    The kernel (its LLM gate, executor and SQLite store) lives on a private event loop, so the
    agent serves sync and async callers alike; tasks are durable processes in its store. With
    ``llm=None`` only ``execute_code`` works (a task's first model call raises NoProvider).
    """

    def __init__(self, tools: Iterable[Callable[..., Any] | str] = (), *, llm: LLMProvider | None = None,
                 executor: Executor | Literal["monty", "process"] | None = None,
                 checkpointer: Checkpointer | None = None, state_dir: str | Path = ".ringzero", name: str = "agent",
                 limits: Limits | None = None, max_steps: int = 8, tool_limit: int = 8,
                 max_observation: int = 4000, context_budget: int | None = None,
                 egress: Egress | None = None) -> None:
        if max_steps < 1:
            raise InvalidArgument(f"max_steps must be at least 1, not {max_steps}")
        self.registry = ToolRegistry(tools)
        if not name.replace("-", "_").isidentifier():
            raise InvalidArgument(f"an agent's name names its workspace directory: use letters, digits, - and _, "
                                  f"not {name!r}")
        self.workspace: Path | None = None
        """``executor="process"``: a directory of this agent's that every run may write and that
        persists between its tasks (``workspace`` inside the code, and $RINGZERO_WORKSPACE)."""
        inputs: dict[str, JSON] = {}
        run_limits = None if egress is None else ExecLimits(egress=egress)  # the executor's, never journaled
        if egress is not None and executor is not None and not isinstance(executor, str):
            raise InvalidArgument("give egress to your executor's limits (ExecLimits(egress=...)), or let the "
                                  "agent make its executor ('monty' or 'process')")
        if executor == "process":
            from ringzero.providers.executors.process import ProcessExecutor

            self.workspace = Path(state_dir).absolute() / "workspaces" / name
            executor = ProcessExecutor(workspace=self.workspace, limits=run_limits)
            inputs["workspace"] = ProcessExecutor.WORKSPACE  # where runs find it in their private root
        elif executor == "monty" or (executor is None and egress is not None):
            from ringzero.providers.executors.monty import MontyExecutor

            executor = MontyExecutor(limits=run_limits)
        elif executor is not None and not isinstance(executor, Executor):
            raise InvalidArgument(f"executor is 'monty', 'process' or an Executor object, not {executor!r:.60}")
        network: dict[str, JSON] = {} if egress is None else {
            "routes": [str(route) for route in egress.routes],
            "secrets": list[JSON](sorted(n for n, s in egress.secrets.items() if s.code_may_place)),
            "added": list[JSON](sorted(f"{s.header} for {', '.join(s.hosts)}" for s in egress.secrets.values()
                                       if s.header is not None and not s.code_may_place))}
        self.config = AgentConfig(tools=self.registry.references(), max_steps=max_steps, tool_limit=tool_limit,
                                  max_observation=max_observation, inputs=inputs, context_budget=context_budget,
                                  network=network)
        self.limits = limits

        chosen: Executor | None = executor if not isinstance(executor, str) else None

        def make_kernel() -> Kernel:
            from ringzero.checkpointers import SqliteCheckpointer

            store = checkpointer or SqliteCheckpointer(Path(state_dir) / "agent.db", create_folder=True)
            return Kernel(llm=llm, executor=chosen, checkpointer=store)

        self.host = KernelHost(make_kernel)

    async def aexecute_task(self, task: str) -> AgentResult:
        """Run ``task`` to its end as a kernel process."""
        return await self.host.acall(lambda kernel: self._run_task(kernel, task))

    async def aexecute_code(self, code: str) -> str:
        """Run ``code`` (no model involved) with the agent's tools; what a model would be shown."""
        return await self.host.acall(lambda kernel: self._run_code(kernel, code))

    def execute_code(self, code: str) -> str:
        return self.host.call(lambda kernel: self._run_code(kernel, code), "CodeAgent.execute_code")

    async def _run_code(self, kernel: Kernel, code: str) -> str:
        if not isinstance(code, str):
            raise InvalidArgument(f"code must be a string, not {type(code).__name__}")
        handle = await kernel.spawn(code_run_program, code, self.config.to_dict(), name="code", limits=self.limits)
        return str(await handle.wait())

    def execute_task(self, task: str) -> AgentResult:
        """Run ``task`` to its end (the sync twin of ``aexecute_task``); the result unpacks as
        ``result, output, error``."""
        return self.host.call(lambda kernel: self._run_task(kernel, task), "CodeAgent.execute_task")

    async def _run_task(self, kernel: Kernel, task: str) -> AgentResult:
        handle = await kernel.spawn(code_agent_program, task, self.config.to_dict(), name="task", limits=self.limits)
        return AgentResult.from_dict(await handle.wait())

    def close(self) -> None:
        self.host.close()

    async def aclose(self) -> None:
        await self.host.aclose()


def create_agent(tools: Iterable[Callable[..., Any] | str] = (), *, llm: LLMProvider | None = None,
                 **options: Any) -> CodeAgent:
    """A CodeAgent; ``llm`` defaults to the provider the environment names (OPENAI_API_KEY, ...)."""
    if llm is None:
        from ringzero.providers.llm.environment import provider_from_environment

        llm = provider_from_environment()
    if llm is None:
        raise NoProvider("a CodeAgent needs a model: create_agent(llm=OpenAIProvider(...)), or set "
                         "OPENAI_API_KEY / OPENAI_BASE_URL / ANTHROPIC_API_KEY")
    return CodeAgent(tools, llm=llm, **options)


def execute_task(task: str, **options: Any) -> AgentResult:
    """One task with a fresh agent; the result unpacks as ``result, output, error``."""
    with create_agent(**options) as agent:
        return agent.execute_task(task)
