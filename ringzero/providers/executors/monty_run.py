"""One Monty run: the snapshots driven one by one, tool calls answered, slow ones parked."""

from __future__ import annotations

import ast
import asyncio
import inspect
import os
import threading
import time
import weakref
from collections.abc import Mapping
from typing import Any, Protocol

import pydantic_monty as pm

from ringzero.core.contract.errors import ExecutorError, RingzeroError
from ringzero.core.contract.protocols import Tool
from ringzero.core.contract.types import JSON, ExecError, ExecLimits, ExecResult
from ringzero.core.support.json_cost import cheap, too_large
from ringzero.core.support.loop_stalls import watch_stalls
from ringzero.core.support.timeouts import cancel_and_wait, fail_after
from ringzero.core.support.tool_pool import ToolPool
from ringzero.providers.executors._runner import CappedOutput
from ringzero.providers.executors.boundary import NOT_JSON, HostTools, check_value, clip, executor_error

__all__ = ["MontyRun", "RunSettings", "ToolSpeeds"]

UNSUPPORTED_HINT = (
    " (Monty runs a subset of Python; for this, use ringzero.providers.executors.ProcessExecutor, "
    "which runs full CPython with any installed package)"
)


class ToolSpeeds:
    """Which sync tools are quick: answered within ``park_after`` at least once, and never past
    it since. A run whose tools are all quick is answered in Monty's own thread (it holds its
    worker while a tool runs); a call past ``park_after`` makes its tool slow, and a run that
    may call a slow tool is driven by snapshots, parking while such a call runs."""

    def __init__(self, park_after: float) -> None:
        self.park_after = park_after
        self._quick: weakref.WeakSet[Any] = weakref.WeakSet()
        self._quick_ids: set[int] = set()  # tools that cannot be weakly referred to (builtins live on)

    def quick(self, tool: Tool) -> bool:
        key = _key(tool)
        try:
            return key in self._quick
        except TypeError:
            return id(key) in self._quick_ids

    def took(self, tool: Tool, seconds: float) -> None:
        """One call of ``tool`` took ``seconds`` (or at least that long, where it parked)."""
        key = _key(tool)
        quick = seconds <= self.park_after
        try:
            (self._quick.add if quick else self._quick.discard)(key)
        except TypeError:
            (self._quick_ids.add if quick else self._quick_ids.discard)(id(key))


class _QuickRuns:
    """How many runs are answered in Monty's own threads at once, in this process.

    pydantic-monty answers a sync external function on one of its runtime's threads (one per
    CPU), and a tool answered there holds that thread as long as it runs: a quick tool that turns
    slow could hold them all, and every run of every Monty executor here, a bystander's with no
    tool at all, would wait behind it. So at most ``cap`` (one fewer than the CPUs, at least one)
    take that way at once; the others are driven by snapshots, where a slow tool parks its run.
    A run's wall then bounds it whatever its tool does: the thread its tool holds is never the
    last one."""

    def __init__(self) -> None:
        self.cap = max(1, (os.cpu_count() or 1) - 1)
        self.running = 0
        self._lock = threading.Lock()

    def enter(self) -> bool:
        with self._lock:
            if self.running >= self.cap:
                return False
            self.running += 1
            return True

    def leave(self) -> None:
        with self._lock:
            self.running -= 1


_QUICK = _QuickRuns()


def _key(tool: Tool) -> Any:
    """What stays the same from run to run of one tool: a bound method's function (each
    ``obj.method`` is a new object)."""
    return getattr(tool, "__func__", tool)


class RunSettings(Protocol):
    """What a run asks of the executor that starts it (``MontyExecutor``)."""

    tool_pool: ToolPool
    """The threads host tools run on."""
    converting: ToolPool
    """The threads final values and errors are made JSON on, off the event loop."""
    show_tool_errors: bool
    park_after: float
    """Seconds a tool call may take before the run's heap is parked to wait for it."""

    def wall_failure(self) -> ExecutorError | None:
        """Why a worker could not start behind its second wall, if it could not."""

    def resource_limits(self, limits: ExecLimits) -> pm.ResourceLimits:
        """``limits`` as pydantic-monty's own, for one run."""

    tool_speeds: ToolSpeeds
    """Which sync tools have answered within ``park_after``."""


class MontyRun:
    """One run: drives the snapshots, answers tool calls, parks on slow ones."""

    def __init__(self, executor: RunSettings, pool: pm.AsyncMonty, limits: ExecLimits,
                 tools: Mapping[str, Tool]) -> None:
        self.executor = executor
        self.pool = pool
        self.limits = limits
        self.host = HostTools(tools, limits, executor.tool_pool, show_errors=executor.show_tool_errors)
        self.tools = self.host.tools
        self.output = CappedOutput(limits.output_bytes if limits.output_bytes is not None else 1 << 62)
        self.session_broken = False
        self.async_style = False
        self.pending: dict[int, asyncio.Task[Any]] = {}  # async-style calls, by Monty's call id
        self.in_flight: set[asyncio.Task[Any]] = set()  # every tool call not yet settled

    def _print(self, stream: str, text: str) -> None:
        self.output.write(text)

    async def execute(self, code: str, inputs: dict[str, JSON], session: pm.AsyncMontySession | None) -> ExecResult:
        started = time.perf_counter()
        self.async_style = _awaits(code)
        value: Any = None
        error: ExecError | None = None
        # Monty's feed limit stops the code itself (its clock skips time spent in host tools);
        # this host-side deadline, a little later, bounds the whole run, tool calls included.
        backstop = None if self.limits.wall_seconds is None else self.limits.wall_seconds + 1.0
        convert = self.executor.converting
        try:
            # The value or error becomes JSON off the event loop and inside the wall limit: a
            # million-key dict takes seconds to check, a 100 MB message to copy.
            async with fail_after(backstop):
                try:
                    value = await self._drive(code, inputs, session)
                except pm.MontyCrashedError:
                    raise
                except pm.MontyError as exc:
                    error = await convert.run(_exec_error, [exc], {})
                    self.session_broken = error.type in ("TimeoutError", "MemoryError")
                else:
                    value = self._final(value) if cheap(value) else await convert.run(self._final, [value], {})
        except pm.MontyCrashedError as exc:
            refused = self.executor.wall_failure()
            if refused is not None:  # it failed closed: the executor cannot run code as it promised
                raise refused from exc
            error = executor_error("SandboxCrashed", f"the Monty worker died and was replaced: {exc}")
        except TimeoutError:
            error = executor_error("TimeoutError", f"the run took longer than {self.limits.wall_seconds} s")
            self.session_broken = True
        except _ValueRefused as exc:
            error = executor_error("OutputLimitExceeded", str(exc))
        except RecursionError:
            error = executor_error("RecursionError", "a value the code made nests too deeply to leave the sandbox")
            self.session_broken = True
        except RingzeroError:
            raise  # the executor's own failure
        except Exception as exc:  # anything else pydantic-monty raises on the host is about this run's code
            error = executor_error(type(exc).__name__, f"Monty could not carry on with this code: {exc}")
            self.session_broken = True
        if error is not None:
            value = None
        return ExecResult(value, self.output.value(), error, time.perf_counter() - started, tuple(self.host.calls),
                          self.host.ended())

    def _final(self, value: Any) -> JSON:
        """The code's final value as JSON (a value JSON cannot hold becomes its repr), within
        ``output_bytes``. Runs off the event loop: its cost grows with the value."""
        limit = self.limits.output_bytes
        refused = too_large(value, "the code's final value", limit)
        if refused is not None:
            raise _ValueRefused(refused)
        value = _plain(value)
        refused = check_value(value, "the code's final value", limit)
        if refused is not None and NOT_JSON in refused:  # NaN or an infinity: its text, as for an object
            value = repr(value)
            refused = check_value(value, "the code's final value", limit)
        if refused is not None:
            raise _ValueRefused(refused)
        checked: JSON = value  # JSON now: walked and measured above
        return checked

    async def _drive(self, code: str, inputs: dict[str, JSON], session: pm.AsyncMontySession | None) -> Any:
        if session is not None:
            try:
                snap = await session.feed_start(code, inputs=inputs, print_callback=self._print)
                while not isinstance(snap, pm.MontyComplete):
                    snap, _ = await self._answer(snap, session, may_park=False)
                return snap.output
            finally:
                await self._settle_pending()
        lease = self.pool.checkout(limits=self.executor.resource_limits(self.limits))
        await lease.__aenter__()
        try:
            if not self.tools:  # nothing to answer: one round trip
                return await lease.feed_run(code, inputs=inputs, print_callback=self._print)
            if self._answers_here() and _QUICK.enter():  # Monty calls the tools from its own thread: one feed
                try:
                    return await lease.feed_run(code, inputs=inputs, print_callback=self._print,
                                                external_lookup=self._called_here(asyncio.get_running_loop()))
                finally:
                    _QUICK.leave()
            snap = await lease.feed_start(code, inputs=inputs, print_callback=self._print)
            while not isinstance(snap, pm.MontyComplete):
                snap, parked = await self._answer(snap, lease, may_park=True)
                if parked is not None:  # the worker went back to the pool while the tool ran
                    lease = parked
            return snap.output
        finally:
            self.host.cut_short()
            await self._settle_pending()
            await lease.__aexit__(None, None, None)

    def _answers_here(self) -> bool:
        """Whether each tool call can be answered in the thread Monty calls host functions from:
        sync-style code, every tool plain and sync (``HostTools.runs_here``) and quick
        (``ToolSpeeds``)."""
        speeds = self.executor.tool_speeds
        return not self.async_style and all(self.host.runs_here(name) and speeds.quick(tool)
                                            for name, tool in self.tools.items())

    def _called_here(self, loop: asyncio.AbstractEventLoop) -> dict[str, Any]:
        """The host functions Monty calls from its own thread, one per tool."""
        watch_stalls(loop, self.executor.tool_pool.stalls)
        speeds, park_after = self.executor.tool_speeds, self.executor.park_after

        def function(name: str) -> Any:
            def called(*args: Any, **kwargs: Any) -> Any:
                started = time.monotonic()
                ok, outcome = self.host.call_here(name, list(args), kwargs, loop)
                took = time.monotonic() - started
                if took > park_after:  # it held the worker: its later runs park while it runs
                    speeds.took(self.tools[name], took)
                if not ok:
                    raise outcome.as_exception()
                return outcome
            return called

        return {name: function(name) for name in self.tools}

    async def _settle_pending(self) -> None:
        """Cancel the tool calls still in flight and wait until they are over: no call may
        finish after ``run()`` returned, and each is in the run's record of calls."""
        pending, self.in_flight, self.pending = list(self.in_flight), set(), {}
        await cancel_and_wait(pending)

    async def _answer(self, snap: Any, session: pm.AsyncMontySession,
                      may_park: bool) -> tuple[Any, pm.AsyncMontySession | None]:
        """Resolve one snapshot; returns the next one and, if the run moved, its new session."""
        if isinstance(snap, pm.AsyncNameLookupSnapshot):
            name = snap.variable_name
            found = snap.resume(value=self.tools[name]) if name in self.tools else snap.resume()
            return await found, None
        if isinstance(snap, pm.AsyncFutureSnapshot):  # async-style code awaits tool calls in flight
            waiting = {cid: self.pending[cid] for cid in snap.pending_call_ids if cid in self.pending}
            await asyncio.wait(waiting.values(), return_when=asyncio.FIRST_COMPLETED)
            settled = {cid: self.pending.pop(cid).result() for cid, task in waiting.items() if task.done()}
            return await snap.resume(settled), None
        if not isinstance(snap, pm.AsyncFunctionSnapshot):
            raise RuntimeError(f"an unexpected pause in Monty ({type(snap).__name__})")
        if snap.is_os_function:  # file, network or environment access: Monty's own refusal
            return await snap.resume_not_handled(), None
        name = str(snap.function_name)
        if name not in self.tools:  # e.g. dir(), globals() or a typo: Python's own answer
            return await snap.resume({"exception": NameError(f"name {name!r} is not defined")}), None
        try:
            args, kwargs = list(snap.args), dict(snap.kwargs)
        except RecursionError:
            refused = ValueError(f"the arguments to {name}() nest too deeply to leave the sandbox")
            return await snap.resume({"exception": refused}), None
        task = asyncio.ensure_future(self._call(name, args, kwargs))
        self.in_flight.add(task)
        task.add_done_callback(self.in_flight.discard)
        if self.async_style and inspect.iscoroutinefunction(self.tools[name]):
            # As in Python: calling an async function gives an awaitable; the tool runs on
            # the host meanwhile, so gathered calls overlap.
            self.pending[snap.call_id] = task
            return await snap.resume({"future": ...}), None
        parked: pm.AsyncMontySession | None = None
        if may_park and not self.pending:  # never move a run whose other tool calls are in flight
            started = time.monotonic()
            done, _ = await asyncio.wait({task}, timeout=self.executor.park_after)
            self.executor.tool_speeds.took(self.tools[name], time.monotonic() - started)
            if not done:
                state = await self.executor.converting.run(snap.dump, [], {})  # a big heap: off the loop
                await session.__aexit__(None, None, None)
                outcome = await task
                parked = self.pool.checkout(limits=self.executor.resource_limits(self.limits))
                await parked.__aenter__()
                snap = await parked.load_snapshot(state, print_callback=self._print)
                return await snap.resume(outcome), parked
        return await snap.resume(await task), parked

    async def _call(
        self, name: str, args: list[Any], kwargs: dict[str, Any]
    ) -> pm.ExternalReturnValue | pm.ExternalException:
        ok, outcome = await self.host.call(name, args, kwargs)
        return {"return_value": outcome} if ok else {"exception": outcome.as_exception()}


class _ValueRefused(Exception):
    """The code's final value cannot leave the sandbox (too deep or too large)."""


def _awaits(code: str) -> bool:
    """True for async-style code (it awaits something), where async tools return awaitables."""
    if "await" not in code:  # the common case, without parsing
        return False
    try:
        return any(isinstance(node, ast.Await) for node in ast.walk(ast.parse(code)))
    except (SyntaxError, RecursionError, MemoryError, ValueError):
        # Code too deep or too large for CPython's own parser (3 KB of `-` does it): Monty parses
        # it for itself and reports what it finds; the host's probe must not raise out of run().
        return False


def _exec_error(exc: pm.MontyError) -> ExecError:
    inner = exc.exception()
    kind = type(inner).__name__
    first = inner.args[0] if len(inner.args) == 1 else None
    # the code's text: the host keeps 8 KB of it (a str's slice copies no more than that)
    message = clip(first, 8192) if isinstance(first, str) else clip(str(inner), 8192)
    if kind == "NotImplementedError" or kind == "ModuleNotFoundError":
        message += UNSUPPORTED_HINT
    frames = exc.traceback() if isinstance(exc, pm.MontyRuntimeError) else []
    # Monty's feed time limit stops the code outside any of its frames; whatever the code
    # raises itself carries at least one frame, so it can never look like this.
    stopped = kind == "TimeoutError" and (not frames or _stopped_asleep(message, frames[-1].source_line))
    return ExecError(kind, message, _traceback(frames, kind, message), origin="executor" if stopped else "code")


def _stopped_asleep(message: str, line: str | None) -> bool:
    """Whether Monty's sleep limit (the run's wall limit, ``max_total_sleep_secs``) stopped the
    code: it raises at the ``sleep`` call that would pass the limit, a line that calls ``sleep``
    and raises nothing itself. A TimeoutError the code raises with the same words comes from a
    ``raise`` (in the innermost frame), and stays the code's."""
    if not message.startswith("sleep limit exceeded: ") or not line:
        return False
    try:
        tree = ast.parse(line.strip())
    except SyntaxError:
        return False
    nodes = list(ast.walk(tree))
    calls_sleep = any(isinstance(node, ast.Call) and "sleep" in (getattr(node.func, "attr", None),
                                                                 getattr(node.func, "id", None)) for node in nodes)
    return calls_sleep and not any(isinstance(node, ast.Raise) for node in nodes)


def _traceback(frames: list[Any], kind: str, message: str) -> str:
    """The traceback as Python prints it, made from Monty's frames and the clipped message
    (Monty's own rendering would copy the whole message again)."""
    lines = ["Traceback (most recent call last):"] if frames else []
    for frame in frames:
        lines.append(f'  File "{frame.filename}", line {frame.line}, in {frame.function_name}')
        if frame.source_line:
            lines.append(f"    {clip(frame.source_line.strip(), 200)}")
    lines.append(f"{kind}: {message}" if message else kind)
    return "\n".join(lines)


def _plain(value: Any) -> Any:
    """Monty proxies of sandbox objects become their repr; containers are converted item by item."""
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return repr(value)
