"""Bad input at every public entry point: a clear error that names what was wrong, raised
where the mistake is made (not as an AttributeError deep inside, nor silently accepted), and
the kernel and its other processes carry on."""

from __future__ import annotations

import asyncio
import math
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from ringzero import (
    CheckpointerError,
    Context,
    ExecLimits,
    InvalidArgument,
    Kernel,
    Limits,
    LLMGate,
    NotSerializable,
    ProcessNotFound,
    RateLimit,
    RetryPolicy,
    RingzeroError,
    ToolNotFound,
)
from ringzero.checkpointers import MemoryCheckpointer, SqliteCheckpointer
from ringzero.core.support.gate import Pricing
from ringzero.testing import InProcessExecutor, ScriptedProvider

NAN = math.nan


def _agent_with(executor: Any) -> Any:
    from ringzero.agents import create_agent

    return create_agent(executor=executor, llm=ScriptedProvider("x"))


def _langgraph_sandboxed(executor: Any) -> Any:
    from ringzero.adapters.langgraph import sandboxed

    def double(x: int) -> int:
        """Twice x."""
        return 2 * x

    return sandboxed(double, executor=executor)


def _crewai_sandboxed(executor: Any) -> Any:
    from ringzero.adapters.crewai import sandboxed

    def double(x: int) -> int:
        """Twice x."""
        return 2 * x

    return sandboxed(double, executor=executor)


CONSTRUCTORS: list[tuple[str, Callable[[], Any], type[Exception], str]] = [
    ("Kernel: an executor name that is not one", lambda: Kernel(executor="nope"), InvalidArgument,
     "no executor named 'nope'"),
    ("Kernel: an executor that is not one", lambda: Kernel(executor=object()), InvalidArgument,  # type: ignore[arg-type]
     "executor builtins.object is not a ringzero Executor: it has no capabilities, run, aclose"),
    ("Kernel: a checkpointer that is not one", lambda: Kernel(checkpointer=42), InvalidArgument,  # type: ignore[arg-type]
     "checkpointer builtins.int is not a ringzero Checkpointer: it has no capabilities, put"),
    ("Kernel: an LLM that is not a provider", lambda: Kernel(llm="gpt-4"), InvalidArgument,  # type: ignore[arg-type]
     "llm builtins.str is not a ringzero LLMProvider: it has no capabilities, complete"),
    ("Kernel: tools that are not functions", lambda: Kernel(tools={"search": 1}), InvalidArgument,  # type: ignore[dict-item]
     "tools maps names to functions"),
    ("Kernel: max_running of zero", lambda: Kernel(max_running=0), InvalidArgument, "max_running"),
    ("Kernel: a scheduler that is not one", lambda: Kernel(scheduler="fifo"), InvalidArgument,  # type: ignore[arg-type]
     "scheduler builtins.str is not a ringzero Scheduler: it has no capabilities, acquire, release, should_yield"),
    ("LLMGate: no provider", lambda: LLMGate(None), InvalidArgument, "LLMGate needs an LLMProvider"),  # type: ignore[arg-type]
    ("LLMGate: a rate limit that is not one", lambda: LLMGate(ScriptedProvider("x"), rate_limit=60),  # type: ignore[arg-type]
     InvalidArgument, "LLMGate takes a RateLimit"),
    ("RateLimit: negative", lambda: RateLimit(requests_per_minute=-1), InvalidArgument, "requests_per_minute"),
    ("RateLimit: NaN", lambda: RateLimit(tokens_per_minute=NAN), InvalidArgument, "tokens_per_minute"),
    ("RateLimit: fractional concurrency", lambda: RateLimit(max_concurrency=2.5), InvalidArgument,  # type: ignore[arg-type]
     "max_concurrency counts calls"),
    ("RetryPolicy: negative retries", lambda: RetryPolicy(max_retries=-1), InvalidArgument, "max_retries"),
    ("RetryPolicy: NaN delay", lambda: RetryPolicy(base_delay=NAN), InvalidArgument, "base_delay"),
    ("RetryPolicy: zero timeout", lambda: RetryPolicy(timeout=0), InvalidArgument, "timeout"),
    ("Pricing: negative", lambda: Pricing(-1.0, 2.0), InvalidArgument, "input_per_million"),
    ("Limits: fractional steps", lambda: Limits(steps=2.5), InvalidArgument, "Limits.steps counts whole"),  # type: ignore[arg-type]
    ("Limits: negative tokens", lambda: Limits(tokens=-1), InvalidArgument, "Limits.tokens must not be negative"),
    ("Limits: NaN cost", lambda: Limits(cost=NAN), InvalidArgument, "Limits.cost must be a number"),
    ("Limits: a string", lambda: Limits(wall_seconds="60"), InvalidArgument, "Limits.wall_seconds"),  # type: ignore[arg-type]
    ("ExecLimits: negative memory", lambda: ExecLimits(memory_bytes=-5), InvalidArgument, "ExecLimits.memory_bytes"),
    ("SqliteCheckpointer: a folder that does not exist", lambda: SqliteCheckpointer("/missing/dir/x.db"),
     InvalidArgument, "does not exist (/missing/dir)"),
    ("SqliteCheckpointer: bad synchronous", lambda: SqliteCheckpointer(":memory:", synchronous="OFF"),  # type: ignore[arg-type]
     InvalidArgument, "synchronous"),
    ("create_agent: an executor name that is not one", lambda: _agent_with("nope"), InvalidArgument,
     "executor is 'monty', 'process' or an Executor"),
    ("LangGraph sandboxed: an executor name that is not one", lambda: _langgraph_sandboxed("nope"),
     InvalidArgument, "no executor named 'nope'"),
    ("LangGraph sandboxed: an executor that is not one", lambda: _langgraph_sandboxed(3.0), InvalidArgument,
     "executor= takes a ringzero Executor"),
    ("CrewAI sandboxed: an executor name that is not one", lambda: _crewai_sandboxed("nope"), InvalidArgument,
     "no executor named 'nope'"),
]


@pytest.mark.parametrize(("case", "make", "error", "names"), CONSTRUCTORS, ids=[c[0] for c in CONSTRUCTORS])
def test_a_bad_argument_to_a_constructor_is_refused_there(
    case: str, make: Callable[[], Any], error: type[Exception], names: str,
) -> None:
    with pytest.raises(error) as caught:
        make()
    assert names in str(caught.value), f"{case}: {caught.value}"


def test_names_that_are_executors_make_one() -> None:
    """What used to be an AttributeError: a name of a built-in executor is accepted."""
    from ringzero.providers.executors import ProcessExecutor

    kernel = Kernel(executor="process", checkpointer=MemoryCheckpointer())
    assert isinstance(kernel.executor, ProcessExecutor)


async def test_a_path_as_checkpointer_opens_sqlite_there(tmp_path: Path) -> None:
    async with Kernel(checkpointer=str(tmp_path / "state.db"), executor=InProcessExecutor()) as kernel:
        assert isinstance(kernel.checkpointer, SqliteCheckpointer)

        async def hello(ctx: Context) -> str:
            return "hi"

        assert await (await kernel.spawn(hello)).wait() == "hi"
    assert (tmp_path / "state.db").exists()


class Opaque:
    pass


async def _plain(ctx: Context) -> int:
    return 1


def _not_async(ctx: Context) -> int:
    return 1


SYSCALLS: list[tuple[str, Callable[[Context], Any], type[Exception], str]] = [
    ("recv: a negative timeout", lambda ctx: ctx.recv(timeout=-1), InvalidArgument, "non-negative timeout"),
    ("recv: a NaN timeout", lambda ctx: ctx.recv(timeout=NAN), InvalidArgument, "non-negative timeout"),
    ("sleep: negative", lambda ctx: ctx.sleep(-1), InvalidArgument, "non-negative number of seconds"),
    ("sleep: NaN", lambda ctx: ctx.sleep(NAN), InvalidArgument, "non-negative number of seconds"),
    ("send: to no such pid", lambda ctx: ctx.send(999_999, "hi"), ProcessNotFound, "999999"),
    ("send: not JSON", lambda ctx: ctx.send(ctx.pid, {"x": Opaque()}), NotSerializable, "a message to pid"),
    ("send: NaN, which JSON cannot hold", lambda ctx: ctx.send(ctx.pid, {"score": NAN}), NotSerializable,
     "a message to pid"),
    ("send: huge", lambda ctx: ctx.send(ctx.pid, "x" * (17 * 1024 * 1024)), InvalidArgument, "over the 16,777,216"),
    ("send: a negative priority", lambda ctx: ctx.send(ctx.pid, "hi", priority=-1), InvalidArgument, "priority"),
    ("tool: an unknown name", lambda ctx: ctx.tool("nope"), ToolNotFound, "no tool named 'nope'"),
    ("tool: not JSON arguments", lambda ctx: ctx.tool(len, {1, 2}), NotSerializable, "arguments of tool"),
    ("tool: an infinite argument", lambda ctx: ctx.tool(abs, -math.inf), NotSerializable, "arguments of tool"),
    ("tool: a NaN result", lambda ctx: ctx.tool(float, "nan"), NotSerializable, "the result of tool 'float'"),
    ("llm: an unknown provider", lambda ctx: ctx.llm("hi", provider="nope"), RingzeroError,
     "no LLM provider named 'nope'"),
    ("llm: messages that are not messages", lambda ctx: ctx.llm(42), InvalidArgument, "messages must be"),
    ("exec: code that is not a string", lambda ctx: ctx.exec(42), InvalidArgument, "code must be a string"),
    ("exec: inputs that are not JSON", lambda ctx: ctx.exec("1", inputs={"x": Opaque()}), NotSerializable,
     "exec inputs"),
    ("spawn: a name that is not a string", lambda ctx: ctx.spawn(_plain, name=123), InvalidArgument,
     "a process name is a string"),
    ("spawn: a function that is not async", lambda ctx: ctx.spawn(_not_async), InvalidArgument, "async def"),
    ("spawn: arguments that are not JSON", lambda ctx: ctx.spawn(_plain, Opaque()), NotSerializable,
     "the arguments of"),
    ("spawn: limits that are not Limits", lambda ctx: ctx.spawn(_plain, limits={"tokens": 5}), InvalidArgument,
     "limits must be a ringzero.Limits"),
    ("wait: a pid that is not one", lambda ctx: ctx.wait("1"), InvalidArgument, "a pid is an integer"),
]


async def test_a_bad_syscall_gets_a_clear_error_and_the_kernel_carries_on(tmp_path: Path) -> None:
    """Every row runs in one process, which catches each error and goes on; a bystander
    process runs through it all, and the kernel takes a new process afterwards."""
    outcomes: dict[str, BaseException | None] = {}

    async def prober(ctx: Context) -> int:
        for case, call, _, _ in SYSCALLS:
            try:
                await call(ctx)
                outcomes[case] = None
            except Exception as exc:
                outcomes[case] = exc
        return len(outcomes)

    async def bystander(ctx: Context) -> list[str]:
        got = []
        for _ in range(3):
            got.append(str(await ctx.recv(timeout=10)))
        return got

    async with Kernel(checkpointer=SqliteCheckpointer(tmp_path / "state.db"), executor=InProcessExecutor(),
                      llm=ScriptedProvider("ok")) as kernel:
        other = await kernel.spawn(bystander)
        for i in range(2):
            await other.send(f"before {i}")
        probe = await kernel.spawn(prober)
        assert await probe.wait() == len(SYSCALLS)
        await other.send("after")
        assert await other.wait() == ["before 0", "before 1", "after"]
        assert await (await kernel.spawn(_plain)).wait() == 1
    wrong = []
    for case, _, error, names in SYSCALLS:
        got = outcomes[case]
        if not isinstance(got, error) or names not in str(got):
            wrong.append(f"{case}: expected {error.__name__} naming {names!r}, got {got!r}")
    assert not wrong, "\n".join(wrong)


async def test_kernel_level_bad_input(tmp_path: Path) -> None:
    async with Kernel(checkpointer=MemoryCheckpointer(), executor=InProcessExecutor()) as kernel:
        with pytest.raises(InvalidArgument, match="a process name is a string"):
            await kernel.spawn(_plain, name=123)  # type: ignore[arg-type]
        with pytest.raises(InvalidArgument, match="priority must be a non-negative integer"):
            await kernel.spawn(_plain, priority=-3)
        with pytest.raises(InvalidArgument, match="a pid is an integer"):
            kernel.get("7")  # type: ignore[arg-type]
        with pytest.raises(ProcessNotFound):
            await kernel.kill(12345)
        handle = await kernel.spawn(_plain)
        with pytest.raises(NotSerializable, match="a message to pid"):
            await handle.send({1, 2})  # type: ignore[arg-type]
        assert await handle.wait() == 1


async def test_a_corrupt_database_file_is_named_in_the_error(tmp_path: Path) -> None:
    corrupt = tmp_path / "state.db"
    corrupt.write_bytes(b"this is not a database " * 400)
    with pytest.raises(CheckpointerError, match=r"state\.db.*not a database"):
        async with Kernel(checkpointer=SqliteCheckpointer(corrupt), executor=InProcessExecutor()):
            pass
    out = await asyncio.to_thread(
        subprocess.run, [sys.executable, "-m", "ringzero.cli", "ps", "--db", str(corrupt)],
        capture_output=True, text=True, timeout=60)
    assert out.returncode == 1 and "not a database" in out.stderr and "Traceback" not in out.stderr, out


@pytest.mark.parametrize(("args", "names"), [
    (["mcp", "--port", "-1"], "a port is a whole number from 1 to 65535, not '-1'"),
    (["mcp", "--port", "http"], "a port is a whole number from 1 to 65535, not 'http'"),
    (["resume", "--db", "x.db", "--kernel", "not a reference"], "not an importable 'module:qualname'"),
    (["ps", "--db", "nowhere.db"], "no state database at nowhere.db"),
])
def test_the_command_line_names_a_bad_argument_without_a_traceback(
    tmp_path: Path, args: list[str], names: str,
) -> None:
    if args[0] == "resume":
        (tmp_path / "x.db").touch()
    out = subprocess.run([sys.executable, "-m", "ringzero.cli", *args], cwd=tmp_path, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode in (1, 2) and names in out.stdout + out.stderr, out
    assert "Traceback" not in out.stdout + out.stderr
