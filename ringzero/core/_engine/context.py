"""Context: the syscall interface a program receives as its first argument.

Every method here is a syscall: it passes the process's boundary (pause, scheduling,
budgets) and its outcome is journaled before the program sees it, so a resumed program
gets the same answers without calling the LLM, executor or tool a second time.
"""

from __future__ import annotations

import asyncio
import contextvars
import datetime
import random
import time
import uuid
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

from ringzero.core._engine import sys_family, sys_llm, sys_tools
from ringzero.core._engine.handles import ProcessHandle
from ringzero.core._engine.new_run import ContinueAsNew
from ringzero.core._engine.session import Session, open_session
from ringzero.core._engine.syscall import syscall
from ringzero.core.contract.errors import (
    InvalidArgument,
    NonDeterminismError,
    NotSerializable,
)
from ringzero.core.contract.fingerprints import fingerprint
from ringzero.core.contract.outcomes import NONE, Outcome, Value
from ringzero.core.contract.protocols import Executor, Tool
from ringzero.core.contract.remote import RemoteProcessHandle
from ringzero.core.contract.tokens import estimate_message_tokens
from ringzero.core.contract.types import (
    JSON,
    ExecLimits,
    ExecResult,
    Limits,
    LLMResponse,
    Message,
    ToolSchema,
    ensure_json,
    json_problem,
)
from ringzero.core.support.live import current_slot
from ringzero.core.support.loops import run_on

if TYPE_CHECKING:
    from ringzero.core._engine.budget import Spend
    from ringzero.core._engine.conversation import Conversation
    from ringzero.core._engine.process import Process, Program
    from ringzero.core._engine.process_memory import ProcessMemory

__all__ = ["Context", "enter"]

T = TypeVar("T")

_CURRENT: contextvars.ContextVar[Context | None] = contextvars.ContextVar("ringzero_context", default=None)


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
        from ringzero.core._engine.process_memory import ProcessMemory

        return ProcessMemory(self._process, self._process.record.name)

    def conversation(self, system: str = "", **options: Any) -> Conversation:
        """A conversation with the model that folds its oldest part when it passes its budget
        (see ``ringzero.core._engine.conversation.Conversation`` for the options)."""
        from ringzero.core._engine.conversation import Conversation

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
            process.track_from_thread(task)
            return await coro

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
    def llm(
        self,
        messages: Sequence[Message | Mapping[str, Any]] | str,
        *,
        tools: Sequence[ToolSchema | Mapping[str, Any]] = (),
        model: str | None = None,
        max_tokens: int | None = None,
        temperature: float | None = None,
        stop: Sequence[str] = (),
        provider: str = "default",
        on_text: Callable[[str], None] | None = None,
    ) -> Coroutine[Any, Any, LLMResponse]:
        """Ask the model, through the provider's gate. Raises the ProviderError it ends with.

        ``on_text`` gets the answer's text piece by piece as it arrives, where the provider
        streams (``capabilities.streaming``: every built-in provider does); one that does not
        answers whole and never calls it. The answer journaled is the whole one: a replayed
        call returns it without calling ``on_text``, as it makes no other effect twice."""
        return sys_llm.llm(self._process, messages, tools=tools, model=model, max_tokens=max_tokens,
                           temperature=temperature, stop=stop, provider=provider, on_text=on_text)

    # --------------------------------------------------------------------- exec
    def nested_llm(self, messages: Sequence[Message | Mapping[str, Any]] | str, *,
                   provider: str = "default", max_tokens: int | None = None) -> Coroutine[Any, Any, LLMResponse]:
        """An LLM call made from inside another syscall, such as a host tool that sandboxed code
        calls (``ask_llm``): it passes the gate and is charged to this process's budget, but is
        not journaled on its own, since the enclosing syscall's record already holds its effect
        (a resumed program gets that record and makes no nested call at all). Inside ``exec``,
        its cost goes into the exec's record too, so a resumed program's budget counts it again.
        The budget is checked when the enclosing syscall returns."""
        return sys_llm.nested_llm(self._process, messages, provider=provider, max_tokens=max_tokens)

    def exec(
        self,
        code: str,
        *,
        inputs: Mapping[str, JSON] | None = None,
        tools: Mapping[str, Tool] | None = None,
        limits: ExecLimits | None = None,
        executor: Executor | None = None,
    ) -> Coroutine[Any, Any, ExecResult]:
        """Run code in the kernel's executor (or ``executor``, a tool's own); the user's
        exceptions come back in ``error``. Every call the code makes to ``tools`` and every
        request it sends under ``limits.egress`` is journaled under the run's slot (``7.1``,
        ``7.2``, ...); made inside a tool call a syscall runs (a LangGraph ``code_tool``, a
        CrewAI ``CodeExecutionTool``), under that tool call's slot: a re-run of the tool call
        answers the finished ones from the journal."""
        return sys_tools.exec_code(self._process, code, inputs=inputs, tools=tools, limits=limits, executor=executor)

    def session(self, *, executor: Executor | None = None, limits: ExecLimits | None = None) -> Session:
        """A persistent interpreter: each ``await session.exec(code, tools=...)`` sees what the
        steps before it defined (names, functions, classes, imports), as a REPL does. Each step
        is journaled as an ``exec`` is, its tool calls under its slot; after a crash the
        resumed process gets its session back as it was after its last finished step (the
        finished steps run again in a new interpreter, every tool call answered from the
        journal). Needs an executor that keeps an interpreter (``capabilities.sessions``:
        ``MontyExecutor``); ``limits``: each step's, where the step gives none.
        ``async with ctx.session() as s:`` closes it."""
        return open_session(self._process, executor, limits)

    # --------------------------------------------------------------------- tool
    def tool(self, tool: str | Tool, /, *args: JSON, **kwargs: JSON) -> Coroutine[Any, Any, JSON]:
        """Call a host tool (by name from the kernel's tools, or a callable) with JSON arguments.

        An exception the tool raises reaches the program as its own class (``except
        CardDeclined:`` catches it), live and on replay alike, wherever that class imports and
        is rebuilt from the recorded arguments (``ringzero.core.contract.outcomes.rebuilt``);
        otherwise (a class defined in a function or in ``__main__``, a constructor that takes
        other arguments) as ``ToolFailed`` naming its type, live and on replay alike.
        """
        return sys_tools.tool(self._process, tool, *args, **kwargs)

    def journaled_tool(
        self, name: str, request: JSON, live: Callable[[], Awaitable[Outcome]], *,
        retry_safe: bool | Callable[[], bool] = False,
    ) -> Coroutine[Any, Any, Outcome]:
        """One tool call as a journaled, budgeted syscall whose result the caller encodes.

        For adapters whose tools return framework objects rather than JSON (LangGraph's
        ``ToolMessage`` and ``Command``, CrewAI's tool output): ``live`` runs the call and
        returns the outcome to record (``ringzero.Value`` of JSON, or ``ringzero.failure(exc)``,
        a ``Failure``); ``request`` identifies the call (a replay
        must ask for the same one). A recorded outcome is returned without calling ``live``. An
        exception from ``live`` is not recorded. Its intent is: a call in flight at a crash is
        in doubt on resume and raises ``ToolInDoubt`` there, unless ``retry_safe`` (the tool is
        idempotent; or a function that says so, asked only then), when it runs again. ``live``
        may read its key with ``ctx.idempotency_key()``.
        """
        return sys_tools.journaled_tool(self._process, name, request, live, retry_safe=retry_safe)

    def idempotency_key(self) -> str:
        """The idempotency key of the tool call running live here (inside ``journaled_tool``'s
        ``live``): the same on every attempt of that call."""
        slot = current_slot()
        if not slot:
            raise InvalidArgument("idempotency_key() is asked inside a tool call that a syscall runs")
        return self._process.idempotency_key(slot)

    # ------------------------------------------------------------ messages
    def send(self, to: int | ProcessHandle | RemoteProcessHandle, message: JSON, *,
             priority: int = 10) -> Coroutine[Any, Any, None]:
        """Deliver ``message`` to a process's mailbox (lower priority numbers first): ``to`` is
        its pid or its handle (what ``ctx.spawn`` returned)."""
        return sys_family.send(self._process, to, message, priority=priority)

    async def recv(self, timeout: float | None = None) -> JSON:
        """The most urgent message in the mailbox, waiting up to ``timeout`` s (None on timeout).
        The timeout is a durable timer: a program resumed after a crash waits only what was left
        of it (see ``sleep``)."""
        if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float))
                                    or not timeout >= 0):
            raise InvalidArgument(f"recv needs a non-negative timeout in seconds or None, not {timeout!r}")
        # The receive is passed on, not held here: the syscall lets go of it once it has started it.
        outcome = await syscall(
            self._process, "recv", {"timeout": timeout}, "" if timeout is None else f"timeout {timeout}s",
            self._process.mailbox.receive, waits=True, timeout=timeout)
        got = outcome.value if isinstance(outcome, Value) else None
        return got.get("message") if isinstance(got, dict) else None

    # ------------------------------------------------------------ processes
    def spawn(
        self,
        program: Program,
        *args: JSON,
        name: str | None = None,
        priority: int | None = None,
        limits: Limits | None = None,
    ) -> Coroutine[Any, Any, ProcessHandle | RemoteProcessHandle]:
        """Start a child process with a slice of this one's budget (refunded when it ends).

        On a cluster node whose scheduler spreads children (``RayScheduler(children="spread")``)
        the child may run on another node: the handle is then a ``RemoteProcessHandle``, and
        ``ctx.wait``, a kill of this process and the refund work across nodes the same way."""
        return sys_family.spawn(self._process, program, *args, name=name, priority=priority, limits=limits)

    def wait(self, child: ProcessHandle | RemoteProcessHandle | int,
             timeout: float | None = None) -> Coroutine[Any, Any, JSON]:
        """Wait for another process to end, without holding a run slot, and return its result.

        Raises ProcessFailed (BudgetExceeded for a budget stop) if it failed or was killed,
        and TimeoutError after ``timeout`` seconds. Use this, not ``handle.wait()``, inside a
        program: it is journaled, so a resumed parent does not wait again.
        """
        return sys_family.wait(self._process, child, timeout)

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

        async def live() -> Outcome:
            await process.write_status((runtime.store.state_row(process.record),))  # one commit with the status
            return Value(None, {"state": prints})

        runtime = process.runtime
        outcome = await syscall(process, "checkpoint", {}, f"{len(state)} keys", live)
        recorded = outcome.beside.get("state")
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
        mail) bounds what a resume replays. Never returns. See ``ringzero.core._engine.new_run``."""
        process = self._process
        new_state = dict(process.record.state if state is None else state)
        problem = json_problem(new_state, "the state of the new run")
        if problem is not None:
            raise NotSerializable(problem)
        new_args = list(args) if args else list(process.record.args)
        ensure_json(new_args, "the arguments of the new run")
        await process.runtime.flush()  # what the old run did is written before it is let go
        raise ContinueAsNew(new_args, new_state)

    # ------------------------------------------------------------------ versions
    async def patched(self, change_id: str) -> bool:
        """Whether this run takes the new code of change ``change_id`` (Temporal's rule): True in
        a new run, and where a replay reaches this point past its journal, with a marker
        recorded there; False while replaying a journal written before the change (no marker
        where the program now asks), taking no slot, so the old code's calls replay as they
        were. The answer never flips for a process::

            if await ctx.patched("ask-twice"):
                await ctx.llm("check the draft")  # new processes, and old ones past this point
        """
        if not isinstance(change_id, str) or not change_id.strip():
            raise InvalidArgument(f"patched needs a change id (a non-empty string), not {change_id!r}")
        args = {"id": change_id}
        journal = self._process.journal
        if journal.replaying and not journal.next_holds("patched", fingerprint(args)):
            return False  # a journal from before the change: its next record is the old code's
        await syscall(self._process, "patched", args, change_id, _value_of(lambda: True))
        return True

    # ------------------------------------------------------------ time and chance
    async def now(self) -> datetime.datetime:
        """The time now (UTC), journaled: a resumed program gets the time it got the first time."""
        outcome = await syscall(self._process, "now", {}, "", _value_of(time.time))
        return datetime.datetime.fromtimestamp(_recorded_number(outcome), datetime.timezone.utc)

    async def random(self) -> float:
        """A random float in [0, 1), journaled: a resumed program draws the same number."""
        outcome = await syscall(self._process, "random", {}, "", _value_of(random.random))
        return _recorded_number(outcome)

    async def uuid(self) -> uuid.UUID:
        """A random UUID (version 4), journaled: a resumed program gets the same one."""
        outcome = await syscall(self._process, "uuid", {}, "", _value_of(lambda: str(uuid.uuid4())))
        return uuid.UUID(str(outcome.value if isinstance(outcome, Value) else None))

    async def sleep(self, seconds: float) -> None:
        """Sleep without holding a run slot, on a durable timer: its deadline is journaled when
        it is set, so a program resumed after a crash sleeps only what was left, and one whose
        deadline passed meanwhile goes on at once."""
        if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not seconds >= 0:
            raise InvalidArgument(f"sleep needs a non-negative number of seconds, not {seconds!r}")
        await syscall(self._process, "sleep", {"seconds": seconds}, f"{seconds}s", _sleep, waits=True,
                      timeout=seconds)

    async def sleep_until(self, when: datetime.datetime) -> None:
        """Sleep until ``when`` (an aware ``datetime``: one with a time zone), without holding a
        run slot; at once where it has passed, as after a crash that outlasted it."""
        if not isinstance(when, datetime.datetime) or when.utcoffset() is None:
            raise InvalidArgument(f"sleep_until needs an aware datetime (with a time zone, e.g. "
                                  f"datetime.now(timezone.utc)), not {when!r}")
        at = when.astimezone(datetime.timezone.utc)
        await syscall(self._process, "sleep_until", {"until": at.isoformat()}, at.isoformat(timespec="seconds"),
                      _sleep, waits=True, until=at.timestamp())


async def _sleep(seconds: float | None) -> Outcome:
    """The ``live`` of a sleep: the seconds left of its timer."""
    await asyncio.sleep(seconds or 0.0)
    return NONE


def _value_of(draw: Callable[[], JSON]) -> Callable[[], Awaitable[Outcome]]:
    """The ``live`` of a syscall whose outcome is ``draw()``: the time, a random number."""
    async def live() -> Outcome:
        return Value(draw())

    return live


def _recorded_number(outcome: Outcome) -> float:
    """The number a time or chance syscall recorded (a NonDeterminismError where it holds none)."""
    value = outcome.value if isinstance(outcome, Value) else None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise NonDeterminismError(f"the syscall recorded here holds no number: {outcome!r:.200}")
    return float(value)


_STATE_PRINTS_KEYS = 64


def _state_prints(state: Mapping[str, JSON]) -> dict[str, JSON]:
    """What a checkpoint records of ``ctx.state`` to check a replay against: a fingerprint of
    each key's value (of the whole state, under ``"*"``, past 64 keys)."""
    if len(state) > _STATE_PRINTS_KEYS:
        return {"*": fingerprint(state)}
    return {key: fingerprint(value) for key, value in state.items()}


def enter(ctx: Context) -> None:
    """Make ``ctx`` the current Context of the running task (and of the tasks it starts): done
    by its process as the program starts."""
    ctx._loop = asyncio.get_running_loop()
    _CURRENT.set(ctx)
