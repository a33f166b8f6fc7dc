"""Public test doubles (a scripted LLM, an in-process executor, an in-memory checkpointer) and
``assert_replays_clean``, which a team's CI runs on stores kept in its test fixtures.

They implement the real protocols, so code tested against them runs unchanged against the
real backends. None of them isolates anything: never run untrusted code with them.
"""

from __future__ import annotations

import ast
import asyncio
import inspect
import io
import re
import shutil
import tempfile
import time
import traceback
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Union

from ringzero.checkpointers.memory import MemoryCheckpointer
from ringzero.core.contract.errors import BadRequest, InvalidArgument, ProviderError
from ringzero.core.contract.protocols import ExecutorCapabilities, ProviderCapabilities, TextSink, Tool
from ringzero.core.contract.types import (
    JSON,
    ExecError,
    ExecLimits,
    ExecResult,
    LLMRequest,
    LLMResponse,
    Message,
    Usage,
    ensure_json,
)
from ringzero.core.operations import ReplayReport
from ringzero.core.support.loops import RUNTIME_LOOP, run_on
from ringzero.core.support.timeouts import fail_after
from ringzero.providers.executors.boundary import HostTools

__all__ = ["InProcessExecutor", "ManualClock", "MemoryCheckpointer", "ScriptedProvider", "assert_replays_clean",
           "count_tokens", "replay_reports"]

Reply = Union[str, Message, LLMResponse, Mapping[str, Any], ProviderError]
Script = Union[Sequence[Reply], Callable[[LLMRequest], Union[Reply, Awaitable[Reply]]]]
_TOKEN = re.compile(r"\w+|[^\w\s]")
_PIECE = re.compile(r"\s*\S+\s*")


def count_tokens(text: str) -> int:
    """Words and punctuation marks: a stable stand-in for a tokenizer in offline runs."""
    return len(_TOKEN.findall(text))


class ScriptedProvider:
    """An LLMProvider that replays a list of replies, or asks a function for each one.

    A reply is a string (the assistant's text), a Message, a dict (``{"role": "assistant",
    "content": ..., "tool_calls": [...]}``), a full LLMResponse, or a ProviderError
    instance, which is raised. ``latency`` seconds pass before each answer. Every request
    is kept in ``requests``.
    """

    provider_name = "ringzero.scripted"
    """``gen_ai.provider.name`` on this provider's spans (OpenTelemetry GenAI conventions)."""

    capabilities = ProviderCapabilities(tool_calls=True, streaming=True, counts_tokens=False)

    def __init__(self, script: Script, *, latency: float = 0.0, model: str = "scripted") -> None:
        if not callable(script) and not isinstance(script, Sequence):
            raise InvalidArgument(f"ScriptedProvider needs a list of replies or a function, not {script!r}")
        self._script = script
        self._position = 0
        self.latency = latency
        self.model = model
        self.requests: list[LLMRequest] = []

    @property
    def calls(self) -> int:
        return len(self.requests)

    def count_tokens(self, messages: Sequence[Message]) -> int:
        """This model's own tokenizer (``count_tokens``): what its usage reports as input tokens."""
        return sum(count_tokens(m.content) for m in messages)

    async def complete(self, request: LLMRequest) -> LLMResponse:
        self.requests.append(request)
        if self.latency:
            await asyncio.sleep(self.latency)
        reply = await self._next(request)
        if isinstance(reply, ProviderError):
            raise reply
        if isinstance(reply, LLMResponse):
            return reply
        message = _as_message(reply)
        usage = Usage(
            input_tokens=sum(count_tokens(m.content) for m in request.messages),
            output_tokens=count_tokens(message.content)
            + sum(count_tokens(str(c.arguments)) for c in message.tool_calls),
        )
        stop = "tool_use" if message.tool_calls else "end_turn"
        return LLMResponse(message=message, usage=usage, stop_reason=stop, model=request.model or self.model)

    async def stream(self, request: LLMRequest, on_text: TextSink) -> LLMResponse:
        """``complete``, its text handed over a word at a time (with the space after it), as a
        server streams: what offline runs of ``stream_mode="messages"`` show."""
        response = await self.complete(request)
        content = response.content
        for piece in _PIECE.findall(content) or ([content] if content else []):
            on_text(piece)
            await asyncio.sleep(0)  # the next piece comes in a later turn of the loop
        return response

    async def _next(self, request: LLMRequest) -> Reply:
        if callable(self._script):
            reply = self._script(request)
            return await reply if inspect.isawaitable(reply) else reply
        if self._position >= len(self._script):
            raise BadRequest(f"the ScriptedProvider's script is exhausted after {len(self._script)} replies")
        reply = self._script[self._position]
        self._position += 1
        return reply


def _as_message(reply: Reply) -> Message:
    if isinstance(reply, str):
        return Message("assistant", reply)
    if isinstance(reply, Message):
        return reply
    if isinstance(reply, Mapping):
        return Message.from_dict({"role": "assistant", **reply})
    raise InvalidArgument(f"a scripted reply must be a str, Message, dict, LLMResponse or ProviderError, not {reply!r}")


class InProcessExecutor:
    """Runs code with ``exec`` in a worker thread of this process: no isolation at all.

    For tests and trusted code only. The value of a final expression is returned, ``print``
    is captured, host tools are called directly (async ones on the kernel's loop). A wall
    time limit returns a TimeoutError result, but the thread cannot be stopped and runs on:
    it fails the conformance kit's test that a timeout stops the code, and is not run there.
    """

    capabilities = ExecutorCapabilities(isolation="none", full_cpython=True, sessions=False, tools=True, network=True,
                                        enforces=frozenset({"wall_seconds", "output_bytes"}))

    def __init__(self, default_limits: ExecLimits | None = None) -> None:
        self.default_limits = default_limits or ExecLimits(wall_seconds=30.0)

    async def run(
        self,
        code: str,
        *,
        inputs: Mapping[str, JSON] | None = None,
        tools: Mapping[str, Tool] | None = None,
        limits: ExecLimits | None = None,
    ) -> ExecResult:
        loop = asyncio.get_running_loop()
        limits = limits or self.default_limits
        wall = self.default_limits.wall_seconds if limits.wall_seconds is None else limits.wall_seconds
        stdout = io.StringIO()
        host = HostTools(tools or {}, limits, show_errors=True)  # no isolation: the code is the host's own
        made = host.calls
        namespace: dict[str, Any] = {"__name__": "__ringzero__", **dict(inputs or {})}
        namespace["print"] = lambda *a, sep=" ", end="\n", **_: stdout.write(sep.join(map(str, a)) + end)
        for name in host.tools:
            namespace[name] = _bridge(name, host, loop)
        started = time.perf_counter()
        error: ExecError | None = None
        try:
            async with fail_after(wall):
                value, raised = await asyncio.to_thread(_outcome, code, namespace)
        except TimeoutError:  # the limit's: the code's own exceptions come back as ``raised``
            value, raised = None, None
            error = ExecError("TimeoutError", f"code ran longer than {wall} s", origin="executor")
        if raised is not None:
            error = ExecError(type(raised).__name__, str(raised),
                              "".join(traceback.format_exception_only(type(raised), raised)))
        try:
            value = ensure_json(value, "the code's final value")
        except InvalidArgument:
            value = repr(value)
        output = stdout.getvalue()
        if limits.output_bytes is not None:
            output = output[: limits.output_bytes]
        return ExecResult(value, output, error, time.perf_counter() - started, tuple(made), host.ended())

    async def aclose(self) -> None:
        return None


def _outcome(code: str, namespace: dict[str, Any]) -> tuple[Any, Exception | None]:
    """``(value, None)``, or ``(None, what the code raised)``."""
    try:
        return _execute(code, namespace), None
    except Exception as exc:
        return None, exc


def _execute(code: str, namespace: dict[str, Any]) -> Any:
    tree = ast.parse(code, mode="exec")
    last = tree.body[-1] if tree.body else None
    if not isinstance(last, ast.Expr):
        exec(compile(tree, "<ringzero>", "exec"), namespace)
        return None
    tree.body.pop()
    exec(compile(tree, "<ringzero>", "exec"), namespace)
    return eval(compile(ast.Expression(last.value), "<ringzero>", "eval"), namespace)


def _bridge(name: str, host: HostTools, loop: asyncio.AbstractEventLoop) -> Callable[..., Any]:
    """The tool as a plain function for code running in a worker thread: the call crosses back
    to the loop and runs as every executor runs a host tool (``HostTools.call``); the code gets
    the tool's own exception."""
    def call(*args: Any, **kwargs: Any) -> Any:
        ok, outcome = run_on(loop, host.call(name, list(args), dict(kwargs)), f"the tool {name!r}")
        if not ok:
            raise outcome.original
        return outcome

    call.__name__ = name
    return call


class ManualClock:
    """A ``Clock`` (``ringzero.core.support.timeouts``) that moves only when the test says so.

    ``LLMGate(provider, limits, clock=ManualClock())``: the gate's pacing waits and back-offs
    end when ``advance()`` passes their deadline, so a test checks what the gate let through
    at each moment instead of measuring how long it took.
    """

    def __init__(self, start: float = 0.0) -> None:
        self._now = start
        self._timers: list[tuple[float, asyncio.Future[None]]] = []

    def now(self) -> float:
        return self._now

    @property
    def waiting(self) -> int:
        """How many sleeps and waits are pending on this clock."""
        return sum(1 for _, timer in self._timers if not timer.done())

    def advance(self, seconds: float) -> None:
        """Move the clock on; every wait whose deadline is now passed ends."""
        self._now += seconds
        for deadline, timer in self._timers:
            if deadline <= self._now and not timer.done():
                timer.set_result(None)
        self._timers = [(d, t) for d, t in self._timers if not t.done()]

    def _timer(self, seconds: float) -> asyncio.Future[None]:
        timer: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if seconds <= 0:
            timer.set_result(None)
        else:
            self._timers.append((self._now + seconds, timer))
        return timer

    async def sleep(self, seconds: float) -> None:
        await self._timer(seconds)

    async def wait(self, event: asyncio.Event, seconds: float | None) -> bool:
        if event.is_set() or seconds is None:
            await event.wait()
            return True
        timer = self._timer(seconds)
        setter: asyncio.Future[Any] = asyncio.ensure_future(event.wait())
        try:
            await asyncio.wait([setter, timer], return_when=asyncio.FIRST_COMPLETED)
        finally:
            setter.cancel()
            timer.cancel()
        return event.is_set()


async def replay_reports(store: str | Path, *, programs: Mapping[str, Any] | None = None,
                         pids: Sequence[int] | None = None) -> list[ReplayReport]:
    """How the journals of the store at ``store`` (a SQLite file, or a postgresql:// DSN) replay
    against the code importable now, without one live call (``Kernel.check_replays``). A SQLite
    file is copied first: a store kept in a test's fixtures is read, never written."""
    from ringzero.checkpointers import open_checkpointer
    from ringzero.core.kernel import Kernel

    with tempfile.TemporaryDirectory() as folder:
        where = str(store)
        if not where.startswith(("postgresql://", "postgres://")):
            where = await asyncio.to_thread(_copy_store, Path(store), Path(folder))
        checkpointer = open_checkpointer(where)
        try:
            return await Kernel.check_replays(checkpointer, programs=programs, pids=pids)
        finally:
            await checkpointer.aclose()


def _copy_store(source: Path, folder: Path) -> str:
    """A copy of SQLite store ``source`` (with its write-ahead log) in ``folder``: its path."""
    if not source.is_file():
        raise InvalidArgument(f"no store at {source}")
    where = str(folder / source.name)
    for suffix in ("", "-wal", "-shm"):
        if Path(f"{source}{suffix}").exists():
            shutil.copyfile(f"{source}{suffix}", f"{where}{suffix}")
    return where


def assert_replays_clean(store: str | Path, *, programs: Mapping[str, Any] | None = None,
                         pids: Sequence[int] | None = None) -> None:
    """Fail (AssertionError listing each) where a stored journal does not replay against the
    current code: the check a team runs in CI on a store of real processes kept in its test
    fixtures, so that a change that would fail in-flight processes (``NonDeterminismError``)
    is caught before it is deployed. Runs on ringzero's runtime loop, so a sync test and an
    async one (whose loop it blocks meanwhile) call it alike."""
    loop = RUNTIME_LOOP.acquire()
    try:
        reports = run_on(loop, replay_reports(store, programs=programs, pids=pids), "assert_replays_clean")
    finally:
        RUNTIME_LOOP.release()
    bad = [report for report in reports if not report.clean]
    if bad:
        raise AssertionError("stored journals that do not replay against the current code:\n" + "\n".join(
            f"pid {r.pid} {r.name}: {r.detail}" for r in bad))
