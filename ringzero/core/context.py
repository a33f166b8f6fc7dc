"""Context: the syscall interface a program receives as its first argument.

Every method here is a syscall: it passes the process's boundary (pause, scheduling,
budgets) and its outcome is journaled before the program sees it, so a resumed program
gets the same answers without calling the LLM, executor or tool a second time.
"""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import datetime
import functools
import random
import time
import uuid
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

from ringzero.core import errors
from ringzero.core.effects import (
    IDEMPOTENCY_KEY,
    NESTED_CALLS,
    NestedCalls,
    retry_safe,
    takes_idempotency_key,
    tool_summary,
)
from ringzero.core.errors import (
    BudgetExceeded,
    InvalidArgument,
    NonDeterminismError,
    NoProvider,
    NotSerializable,
    ProcessFailed,
    ProcessNotFound,
    ProviderError,
    ToolFailed,
    ToolInDoubt,
    ToolNotFound,
)
from ringzero.core.handles import ProcessHandle, process_of
from ringzero.core.host_tools import call_tool
from ringzero.core.journal import fingerprint, llm_fingerprint, trimmed
from ringzero.core.live import current_slot
from ringzero.core.loops import run_on
from ringzero.core.new_run import ContinueAsNew
from ringzero.core.protocols import Executor, Tool
from ringzero.core.references import program_reference
from ringzero.core.remote import RemoteProcessHandle, SpawnRequest
from ringzero.core.timeouts import fail_after, shielded
from ringzero.core.tokens import estimate_message_tokens
from ringzero.core.types import (
    JSON,
    ExecLimits,
    ExecResult,
    Limits,
    LLMRequest,
    LLMResponse,
    Message,
    ProcessStatus,
    StopReason,
    ToolSchema,
    coerce_messages,
    ensure_json,
    json_problem,
)

if TYPE_CHECKING:
    from ringzero.core.budget import Spend
    from ringzero.core.conversation import Conversation
    from ringzero.core.gate import LLMGate
    from ringzero.core.memory import ProcessMemory
    from ringzero.core.process import Process, Program

__all__ = ["Context", "enter"]

T = TypeVar("T")

_LLM_NEEDS = (("llm_calls", 1.0), ("tokens", 1.0), ("cost", 1e-12))


_CURRENT: contextvars.ContextVar[Context | None] = contextvars.ContextVar("ringzero_context", default=None)
_NESTED: contextvars.ContextVar[dict[str, float] | None] = contextvars.ContextVar("ringzero_nested", default=None)
"""What nested LLM calls made during the running exec cost, so that its record can carry it."""


class Context:
    """What a running program may ask of the kernel."""

    def __init__(self, process: Process) -> None:
        self._process = process
        self._loop: asyncio.AbstractEventLoop | None = None

    @staticmethod
    def current() -> Context | None:
        """The Context of the process whose code is running (also inside tasks it started,
        such as a LangGraph graph's nodes), or None outside any process."""
        return _CURRENT.get()

    @property
    def pid(self) -> int:
        return self._process.pid

    @property
    def name(self) -> str:
        return self._process.record.name

    @property
    def parent(self) -> int | None:
        return self._process.record.parent

    @property
    def memory(self) -> ProcessMemory:
        """Long-term memory in this process's namespace (its name); ``.namespace(n)`` for others."""
        from ringzero.core.memory import ProcessMemory

        return ProcessMemory(self._process, self._process.record.name)

    def conversation(self, system: str = "", **options: Any) -> Conversation:
        """A conversation with the model that folds its oldest part when it passes its budget
        (see ``ringzero.core.conversation.Conversation`` for the options)."""
        from ringzero.core.conversation import Conversation

        return Conversation(self, system, **options)

    def emit(self, kind: str, data: Mapping[str, JSON]) -> None:
        """Send an event from this process to the kernel's subscribers (``kernel.subscribe``)."""
        self._process.runtime.emit(kind, self._process.pid, data)

    def count_tokens(self, messages: Sequence[Message], provider: str = "default") -> tuple[int, bool]:
        """Tokens in ``messages`` by the provider's own tokenizer when it has one (``count_tokens``),
        else an estimate of four characters a token. Returns ``(count, estimated)``."""
        counter = getattr(self._process.runtime.gate(provider).provider, "count_tokens", None)
        if callable(counter):
            return int(counter(messages)), False
        return estimate_message_tokens(messages), True

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The event loop this process runs on. A framework's worker thread sends a syscall
        there with ``call_from_thread``."""
        if self._loop is None:
            raise RuntimeError("this process has not started running yet")
        return self._loop

    def call_from_thread(self, coro: Coroutine[Any, Any, T], what: str) -> T:
        """Run a syscall (``ctx.llm(...)``, ``ctx.tool(...)``) from a framework's worker thread
        (CrewAI, a sync LangChain call) on the process's loop, and block until it is done.

        The syscall is a task of its own there; stopping the process (kill, a budget, the wall
        clock) cancels it too, so a killed crew does not leave its model call running.
        """
        process = self._process

        async def tracked() -> T:
            task = asyncio.current_task()
            assert task is not None
            if process.record.stop_reason is not None:
                coro.close()
                raise asyncio.CancelledError(process.record.stop_reason.value)
            if process.from_threads is None:
                process.from_threads = set()
            process.from_threads.add(task)
            try:
                return await coro
            finally:
                process.from_threads.discard(task)

        return run_on(self.loop, tracked(), what)

    @property
    def executor(self) -> Executor:
        """The kernel's executor, for adapters whose sandboxed code runs inside this process."""
        return self._process.runtime.executor

    @property
    def state(self) -> dict[str, JSON]:
        """Working state, saved with the process at every checkpoint and at exit."""
        return self._process.record.state

    @property
    def spent(self) -> Spend:
        """What this process (and its finished children) have consumed so far."""
        return self._process.meter.spent

    def remaining(self, resource: str) -> float | None:
        """What is left of one budget (``"tokens"``, ``"steps"``, ...); None when unlimited."""
        return self._process.meter.remaining(resource)

    @property
    def replaying(self) -> bool:
        """True while syscalls are being served from the journal after a restart."""
        return self._process.journal.replaying

    # ---------------------------------------------------------------------- llm
    async def llm(
        self,
        messages: Sequence[Message | Mapping[str, Any]] | str,
        *,
        tools: Sequence[ToolSchema | Mapping[str, Any]] = (),
        model: str | None = None,
        max_tokens: int | None = None,
        temperature: float | None = None,
        stop: Sequence[str] = (),
        provider: str = "default",
    ) -> LLMResponse:
        """Ask the model, through the provider's gate. Raises the ProviderError it ends with."""
        request = LLMRequest(
            messages=coerce_messages(messages),
            tools=tuple(t if isinstance(t, ToolSchema) else ToolSchema(**t) for t in tools) if tools else (),
            model=model,
            max_tokens=max_tokens,
            temperature=temperature,
            stop=tuple(stop) if stop else (),
        )
        process = self._process
        fresh: list[tuple[LLMResponse, dict[str, JSON]]] = []  # to skip decoding what we just encoded

        async def live() -> dict[str, JSON]:
            gate = self._gate(provider)  # only a live call needs the provider: a replay does not
            try:
                response = await gate.complete(request, pid=process.pid, priority=process.record.priority)
            except ProviderError as exc:
                return {"error": {"type": type(exc).__name__, "message": str(exc),
                                  "retry_after": getattr(exc, "retry_after", None)}}
            recorded: dict[str, JSON] = {"value": response.to_dict()}
            fresh.append((response, recorded))
            return recorded

        last = request.messages[-1] if request.messages else None
        summary = f"{len(request.messages)} messages to {provider}" if last is None else \
            f"{len(request.messages)} messages to {provider}, last {last.role} {trimmed(last.content, 50)}"
        telemetry = process.runtime.telemetry
        about = None if not telemetry.enabled else (
            lambda: telemetry.llm_about(process.runtime.gates.get(provider), provider, request))
        outcome = await process.syscall("llm", None, summary, live, needs=_LLM_NEEDS,
                                        fp=llm_fingerprint(provider, request), about=about)
        if "error" in outcome:
            raise _provider_error(outcome["error"])  # type: ignore[arg-type]
        # Decoded when replayed, or when (a cluster's takeover) the slot holds another node's answer.
        live_answer = fresh[0][0] if fresh and fresh[0][1] is outcome else None
        response = live_answer or LLMResponse.from_dict(outcome["value"])  # type: ignore[arg-type]
        usage = response.usage
        process.meter.charge_llm(usage.input_tokens + usage.output_tokens, usage.cost or 0.0)
        process.check_budget()
        return response

    # --------------------------------------------------------------------- exec
    async def nested_llm(self, messages: Sequence[Message | Mapping[str, Any]] | str, *,
                         provider: str = "default", max_tokens: int | None = None) -> LLMResponse:
        """An LLM call made from inside another syscall, such as a host tool that sandboxed code
        calls (``ask_llm``): it passes the gate and is charged to this process's budget, but is
        not journaled on its own, since the enclosing syscall's record already holds its effect
        (a resumed program gets that record and makes no nested call at all). Inside ``exec``,
        its cost goes into the exec's record too, so a resumed program's budget counts it again.
        The budget is checked when the enclosing syscall returns."""
        process = self._process
        request = LLMRequest(messages=coerce_messages(messages), max_tokens=max_tokens)
        response = await self._gate(provider).complete(request, pid=process.pid, priority=process.record.priority)
        charge = {"tokens": float(response.usage.total_tokens), "llm_calls": 1.0, "cost": response.usage.cost or 0.0}
        process.meter.charge(**charge)
        nested = _NESTED.get()
        if nested is not None:  # the enclosing exec's record carries it, for a resumed program's budget
            for resource, amount in charge.items():
                nested[resource] = nested.get(resource, 0.0) + amount
        return response

    async def exec(
        self,
        code: str,
        *,
        inputs: Mapping[str, JSON] | None = None,
        tools: Mapping[str, Tool] | None = None,
        limits: ExecLimits | None = None,
    ) -> ExecResult:
        """Run code in the kernel's executor; the user's exceptions come back in ``error``."""
        if not isinstance(code, str):
            raise InvalidArgument(f"code must be a string, not {type(code).__name__}")
        inputs = dict(inputs or {})
        ensure_json(inputs, "exec inputs")
        process = self._process
        left = process.meter.remaining("exec_seconds")
        if left is not None:  # the run may not outlast what is left of the exec budget
            limits = limits or ExecLimits()
            wall = max(0.0, left) if limits.wall_seconds is None else min(limits.wall_seconds, left)
            limits = dataclasses.replace(limits, wall_seconds=wall)

        ran_live = False

        async def live() -> dict[str, JSON]:
            nonlocal ran_live
            ran_live = True
            nested: dict[str, float] = {}
            slot = current_slot()
            calls = NestedCalls(process.journal, process.pid, slot, process.idempotency_key(""))
            token, calls_token = _NESTED.set(nested), NESTED_CALLS.set(calls)
            try:
                result = await process.runtime.executor.run(code, inputs=inputs, tools=tools, limits=limits)
            finally:
                NESTED_CALLS.reset(calls_token)
                _NESTED.reset(token)
            if isinstance(calls.problem, ToolInDoubt):  # the program decides, now and on every replay
                return {"in_doubt": {"slot": calls.problem.slot, "tool": calls.problem.tool,
                                     "summary": str(calls.problem)}}
            if calls.problem is not None:  # diverged from its recorded calls, or the store failed
                raise calls.problem
            extra: dict[str, JSON] = {"nested": nested} if nested else {}  # type: ignore[dict-item]
            if calls.served or calls.rerun:
                extra["calls"] = {"served": calls.served, "rerun": calls.rerun}
            return {"value": result.to_dict(), **extra}

        args = {"code": code, "inputs": inputs, "tools": sorted(tools or {})}
        executor = process.runtime.executor
        first_line = code.strip().partition("\n")[0]
        outcome = await process.syscall("exec", args, f"{len(code)} chars: {trimmed(first_line, 50)}", live,
                                        needs=(("exec_seconds", 1e-9),), slotted=True,
                                        about=lambda: {"ringzero.executor": type(executor).__name__,
                                                       "ringzero.isolation": executor.capabilities.isolation})
        if "in_doubt" in outcome:
            doubt: Any = outcome["in_doubt"]
            raise ToolInDoubt(process.pid, str(doubt["tool"]), str(doubt["slot"]))
        result = ExecResult.from_dict(outcome["value"])  # type: ignore[arg-type]
        if not ran_live and isinstance(outcome.get("nested"), dict):  # replayed: charge what its nested calls cost
            process.meter.charge(**{str(k): float(v) for k, v in outcome["nested"].items()})  # type: ignore[union-attr,arg-type]
        process.meter.charge(exec_seconds=result.duration)
        process.check_budget()
        return result

    # --------------------------------------------------------------------- tool
    async def tool(self, tool: str | Tool, /, *args: JSON, **kwargs: JSON) -> JSON:
        """Call a host tool (by name from the kernel's tools, or a callable) with JSON arguments.

        An exception in the tool reaches the program as ToolFailed, live and on replay alike.
        """
        name, fn = (tool, None) if isinstance(tool, str) else self._resolve_tool(tool)
        ensure_json([list(args), kwargs], f"arguments of tool {name!r}")
        process = self._process

        def target() -> Tool:
            return fn if fn is not None else self._kernel_tool(name)  # a replay needs no tool

        async def live() -> dict[str, JSON]:
            call = target()
            given = {**kwargs, IDEMPOTENCY_KEY: process.idempotency_key(current_slot())} \
                if takes_idempotency_key(call) else kwargs
            try:
                value = await call_tool(call, list(args), given)
            except Exception as exc:
                return {"error": {"type": type(exc).__name__, "message": str(exc)}}
            return {"value": ensure_json(value, f"the result of tool {name!r}")}

        outcome = await process.syscall("tool", {"name": name, "args": list(args), "kwargs": kwargs},
                                        tool_summary(name, args, kwargs), live, effect=lambda: retry_safe(target()),
                                        about=lambda: {"gen_ai.tool.name": name})
        if "in_doubt" in outcome:
            raise ToolInDoubt(process.pid, name, str(outcome["in_doubt"]["slot"]))  # type: ignore[call-overload,index]
        if "error" in outcome:
            err = outcome["error"]
            raise ToolFailed(name, str(err["type"]), str(err["message"]))  # type: ignore[index,call-overload]
        return outcome["value"]

    async def journaled_tool(
        self, name: str, request: JSON, live: Callable[[], Awaitable[dict[str, JSON]]], *,
        retry_safe: bool | Callable[[], bool] = False,
    ) -> dict[str, JSON]:
        """One tool call as a journaled, budgeted syscall whose result the caller encodes.

        For adapters whose tools return framework objects rather than JSON (LangGraph's
        ``ToolMessage`` and ``Command``, CrewAI's tool output): ``live`` runs the call and
        returns the outcome to record, a JSON object; ``request`` identifies the call (a replay
        must ask for the same one). A recorded outcome is returned without calling ``live``. An
        exception from ``live`` is not recorded. Its intent is: a call in flight at a crash is
        in doubt on resume and raises ``ToolInDoubt`` there, unless ``retry_safe`` (the tool is
        idempotent; or a function that says so, asked only then), when it runs again. ``live``
        may read its key with ``ctx.idempotency_key()``.
        """
        process = self._process
        safe = retry_safe if callable(retry_safe) else lambda: retry_safe
        outcome = await process.syscall("tool", {"name": name, "request": request}, tool_summary(name, [request], {}),
                                        live, effect=safe, about=lambda: {"gen_ai.tool.name": name})
        if "in_doubt" in outcome:
            raise ToolInDoubt(process.pid, name, str(outcome["in_doubt"]["slot"]))  # type: ignore[call-overload,index]
        return outcome

    def idempotency_key(self) -> str:
        """The idempotency key of the tool call running live here (inside ``journaled_tool``'s
        ``live``): the same on every attempt of that call."""
        slot = current_slot()
        if not slot:
            raise InvalidArgument("idempotency_key() is asked inside a tool call that a syscall runs")
        return self._process.idempotency_key(slot)

    def _gate(self, provider: str) -> LLMGate:
        """The kernel's gate for ``provider``; where it has none, see ``Process.needs``."""
        try:
            return self._process.runtime.gate(provider)
        except NoProvider as exc:
            self._process.needs(exc)

    def _kernel_tool(self, name: str) -> Tool:
        """The kernel's tool ``name``; where it has none, see ``Process.needs``."""
        tools = self._process.runtime.tools
        if name not in tools:
            known = ", ".join(sorted(tools)) or "none"
            self._process.needs(ToolNotFound(f"no tool named {name!r}; the kernel has: {known}"))
        return tools[name]

    @staticmethod
    def _resolve_tool(tool: Tool) -> tuple[str, Tool]:
        if not callable(tool):
            raise InvalidArgument(f"ctx.tool() needs a tool name or a callable, not {type(tool).__name__}")
        return getattr(tool, "__qualname__", repr(tool)), tool

    # ------------------------------------------------------------ messages
    async def send(self, pid: int, message: JSON, *, priority: int = 10) -> None:
        """Deliver ``message`` to process ``pid``'s mailbox (lower priority numbers first)."""
        process = self._process
        runtime = process.runtime
        runtime.check_message(pid, message, priority)
        # Whether the target can take it is asked only live: a replayed send was delivered, to a
        # process that may have ended since. The id is the send's place in program order, the
        # same when the program is re-run, so a send that was delivered but not yet journaled
        # when the host died is not delivered twice (``Runtime.deliver``).
        process.sends += 1
        mail_id = f"{process.pid}:{process.sends}"

        async def live() -> dict[str, JSON]:
            await runtime.deliver(pid, message, priority, sender=self.pid, mail_id=mail_id,
                                  maybe_delivered=process.recovered)
            return {"value": None}

        await self._process.syscall("send", {"to": pid, "message": message, "priority": priority}, f"to {pid}", live)

    async def recv(self, timeout: float | None = None) -> JSON:
        """The most urgent message in the mailbox, waiting up to ``timeout`` s (None on timeout)."""
        if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float))
                                    or not timeout >= 0):
            raise InvalidArgument(f"recv needs a non-negative timeout in seconds or None, not {timeout!r}")
        mailbox = self._process.mailbox
        # The receive is passed on, not held here: the syscall lets go of it once it has started it.
        outcome = await self._process.syscall(
            "recv", {"timeout": timeout}, "" if timeout is None else f"timeout {timeout}s",
            mailbox.receive if timeout is None else functools.partial(mailbox.receive, timeout), waits=True)
        got = outcome["value"]
        return None if got is None else got["message"]  # type: ignore[call-overload,index]

    # ------------------------------------------------------------ processes
    async def spawn(
        self,
        program: Program,
        *args: JSON,
        name: str | None = None,
        priority: int | None = None,
        limits: Limits | None = None,
    ) -> ProcessHandle | RemoteProcessHandle:
        """Start a child process with a slice of this one's budget (refunded when it ends).

        On a cluster node whose scheduler spreads children (``RayScheduler(children="spread")``)
        the child may run on another node: the handle is then a ``RemoteProcessHandle``, and
        ``ctx.wait``, a kill of this process and the refund work across nodes the same way."""
        process = self._process
        runtime = process.runtime
        runtime.check_program(program, args)
        child_limits = process.meter.carve(limits)
        child_priority = process.record.priority if priority is None else priority

        created: list[int] = []
        placed: list[RemoteProcessHandle] = []
        process.spawns += 1
        spawn_id = f"{process.pid}:{process.spawns}"

        async def live() -> dict[str, JSON]:
            orphan = runtime.spawned_before_crash(process, spawn_id)
            if orphan is not None:  # created before the host died, but the spawn was not journaled
                return {"value": orphan}
            if runtime.cluster.child_placement is not None:
                request = SpawnRequest(program=program_reference(program)[0], args=list(args),
                                       name=name or program.__name__, priority=child_priority, limits=child_limits)
                remote = await runtime.cluster.child_placement.place_child(request, parent=process.pid)
                if remote is not None:
                    placed.append(remote)
                    runtime.cluster.adopt_remote_child(process, remote, child_limits)
                    return {"value": remote.pid}
            child = await runtime.spawn_process(program, args, name=name, priority=child_priority,
                                                limits=child_limits, parent=process.pid, spawn_id=spawn_id)
            created.append(child.pid)  # create() registered it with this process already
            return {"value": child.pid}

        fp = {"program": program_reference(program)[0], "args": list(args), "name": name,
              "priority": child_priority, "limits": child_limits.to_dict()}
        outcome = await process.syscall("spawn", fp, fp["program"], live)  # type: ignore[arg-type]
        child_pid = int(outcome["value"])  # type: ignore[arg-type]
        if placed:
            return placed[0]
        if not created:  # replayed after a crash: the child was loaded by recover(), or has ended
            await runtime.adopt(process, child_pid, child_limits)
        try:
            handle = await runtime.handle(child_pid)
        except ProcessNotFound:
            if runtime.cluster.child_placement is None or created:
                raise
            # Replayed, and the child runs on another node: follow it from here.
            remote = await RemoteProcessHandle(runtime.cluster.child_placement, {"pid": child_pid, "name": "",
                                                                        "status": "created", "program": ""}).refresh()
            if child_pid in process.children:
                runtime.cluster.adopt_remote_child(process, remote, process.children[child_pid])
            return remote
        if not created:
            process.keep_child(process_of(handle))
        return handle

    async def wait(self, child: ProcessHandle | RemoteProcessHandle | int, timeout: float | None = None) -> JSON:
        """Wait for another process to end, without holding a run slot, and return its result.

        Raises ProcessFailed (BudgetExceeded for a budget stop) if it failed or was killed,
        and TimeoutError after ``timeout`` seconds. Use this, not ``handle.wait()``, inside a
        program: it is journaled, so a resumed parent does not wait again.
        """
        process = self._process
        runtime = process.runtime

        if isinstance(child, bool) or not isinstance(child, (int, ProcessHandle, RemoteProcessHandle)):
            raise InvalidArgument(f"ctx.wait takes a child's handle or pid (a pid is an integer), not {child!r:.60}")
        pid = child if isinstance(child, int) else child.pid
        target = child if not isinstance(child, int) else await runtime.any_handle(pid)

        async def live() -> dict[str, JSON]:
            if isinstance(target, RemoteProcessHandle):
                ended = await target.ended(timeout)
                runtime.cluster.settle_remote_child(process, target.pid, ended)  # as a local child's end does
                status, reason, detail, result = (ProcessStatus(ended["status"]), ended.get("stop_reason"),
                                                  ended.get("error"), ended.get("result"))
            else:
                async with fail_after(timeout):
                    await shielded(process_of(target).finished)
                record = process_of(target).record
                status, result = record.status, record.result
                reason = None if record.stop_reason is None else record.stop_reason.value
                detail = dict(record.error) if record.error else None
            if status is ProcessStatus.EXITED:
                return {"value": result}
            return {"error": {"status": status.value, "reason": reason, "detail": detail}}

        outcome = await process.syscall("wait", {"pid": pid}, str(pid), live, waits=True)
        if "error" in outcome:
            info: Any = outcome["error"]
            reason = StopReason(info["reason"]) if info["reason"] else None
            failed = BudgetExceeded if reason and reason.value.startswith("budget_") else ProcessFailed
            raise failed(target.pid, info["status"], reason, info["detail"])
        return outcome["value"]

    async def checkpoint(self) -> None:
        """Save working state (``ctx.state``) and counters now, for ``ps``, ``top`` and handles.

        A resumed program rebuilds its state by replay (it starts from the state it was spawned
        with); a replayed checkpoint checks that the rebuilt state is the one recorded there,
        and raises NonDeterminismError naming the keys that differ."""
        process = self._process
        state = process.record.state
        problem = json_problem(state, "ctx.state")
        if problem is not None:
            raise NotSerializable(problem)
        prints = _state_prints(state)

        async def live() -> dict[str, JSON]:
            await process.write_status((runtime.store.state_row(process.record),))  # one commit with the status
            return {"value": None, "state": prints}

        runtime = process.runtime
        outcome = await process.syscall("checkpoint", {}, f"{len(state)} keys", live)
        recorded = outcome.get("state")
        if isinstance(recorded, dict) and recorded != prints:
            differ = sorted({*recorded, *prints} - {k for k in recorded if recorded[k] == prints.get(k)})
            raise NonDeterminismError(
                f"pid {process.pid}: at a replayed ctx.checkpoint(), ctx.state differs from the state recorded there "
                f"in {', '.join(map(repr, differ[:10]))}{' …' if len(differ) > 10 else ''}. A resumed program starts "
                "from the state it was spawned with and rebuilds the rest as it replays: set ctx.state from syscall "
                "results (ctx.llm, ctx.tool, ctx.now(), ...), not from anything outside the journal")

    async def continue_as_new(self, *args: JSON, state: Mapping[str, JSON] | None = None) -> NoReturn:
        """End this run and start the program again from the top, in this same process, with
        ``args`` (default: the arguments of this run) and ``ctx.state`` = ``state`` (default:
        the state now), and an empty journal: how a program that runs for ever (a loop over its
        mail) bounds what a resume replays. Never returns. See ``ringzero.core.new_run``."""
        process = self._process
        new_state = dict(process.record.state if state is None else state)
        problem = json_problem(new_state, "the state of the new run")
        if problem is not None:
            raise NotSerializable(problem)
        new_args = list(args) if args else list(process.record.args)
        ensure_json(new_args, "the arguments of the new run")
        await process.runtime.flush()  # what the old run did is written before it is let go
        raise ContinueAsNew(new_args, new_state)

    # ------------------------------------------------------------ time and chance
    async def now(self) -> datetime.datetime:
        """The time now (UTC), journaled: a resumed program gets the time it got the first time."""
        outcome = await self._process.syscall("now", {}, "", _value_of(time.time))
        return datetime.datetime.fromtimestamp(float(outcome["value"]), datetime.timezone.utc)  # type: ignore[arg-type]

    async def random(self) -> float:
        """A random float in [0, 1), journaled: a resumed program draws the same number."""
        outcome = await self._process.syscall("random", {}, "", _value_of(random.random))
        return float(outcome["value"])  # type: ignore[arg-type]

    async def uuid(self) -> uuid.UUID:
        """A random UUID (version 4), journaled: a resumed program gets the same one."""
        outcome = await self._process.syscall("uuid", {}, "", _value_of(lambda: str(uuid.uuid4())))
        return uuid.UUID(str(outcome["value"]))

    async def sleep(self, seconds: float) -> None:
        """Sleep without holding a run slot."""
        if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not seconds >= 0:
            raise InvalidArgument(f"sleep needs a non-negative number of seconds, not {seconds!r}")

        async def live() -> dict[str, JSON]:
            await asyncio.sleep(seconds)
            return {"value": None}

        await self._process.syscall("sleep", {"seconds": seconds}, f"{seconds}s", live, waits=True)


def _value_of(draw: Callable[[], JSON]) -> Callable[[], Awaitable[dict[str, JSON]]]:
    """The ``live`` of a syscall whose outcome is ``draw()``: the time, a random number."""
    async def live() -> dict[str, JSON]:
        return {"value": draw()}

    return live


_STATE_PRINTS_KEYS = 64


def _state_prints(state: Mapping[str, JSON]) -> dict[str, JSON]:
    """What a checkpoint records of ``ctx.state`` to check a replay against: a fingerprint of
    each key's value (of the whole state, under ``"*"``, past 64 keys)."""
    if len(state) > _STATE_PRINTS_KEYS:
        return {"*": fingerprint(state)}
    return {key: fingerprint(value) for key, value in state.items()}


def _provider_error(info: Mapping[str, Any]) -> ProviderError:
    cls = getattr(errors, str(info.get("type")), None)
    message = str(info.get("message", ""))
    if cls is errors.RateLimited:
        return errors.RateLimited(message, info.get("retry_after"))
    if isinstance(cls, type) and issubclass(cls, ProviderError):
        return cls(message)
    return ProviderError(message)


def enter(ctx: Context) -> None:
    """Make ``ctx`` the current Context of the running task (and of the tasks it starts): done
    by its process as the program starts."""
    ctx._loop = asyncio.get_running_loop()
    _CURRENT.set(ctx)
