"""A process: one program's run, with its record, budget, mailbox, journal and run slot.

The program itself is an ``async def`` taking a Context; the kernel wraps it in an asyncio
task, whose life is ``ringzero.core._engine.lifecycle``'s. Every syscall passes
``ringzero.core._engine.syscall.syscall``, the one boundary where pause, scheduling, budgets and the journal
act, so a program cannot slip past any of them; its transitions are written by
``ringzero.core._engine.transitions``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, NoReturn

from ringzero.core._engine.budget import Meter
from ringzero.core._engine.context import Context
from ringzero.core._engine.journal import Journal
from ringzero.core._engine.lifecycle import run, run_in_span
from ringzero.core._engine.mailbox import Mailbox
from ringzero.core._engine.transitions import write_status
from ringzero.core.contract.errors import Fenced, NoProvider, NotResumed, ProcessStateError, RingzeroError, ToolNotFound
from ringzero.core.contract.store import ProcessRecord
from ringzero.core.contract.types import JSON, Limits, ProcessStatus, StopReason
from ringzero.core.support.timeouts import RECANCEL_EVERY

if TYPE_CHECKING:
    from ringzero.core._engine.runtime import Runtime
    from ringzero.core.contract.remote import RemoteProcessHandle

__all__ = ["Process", "Program"]

Program = Callable[..., Awaitable[Any]]


class Process:
    """The kernel's live view of one process (the program sees only its Context).

    Slots: with its 38 attributes, past the 30 an instance keeps without a dict of its own,
    each process held one more object for the garbage collector to walk (at 10,000 and
    100,000 idle processes, every full collection walks them all)."""

    __slots__ = (
        "__weakref__",
        "_finished",
        "_holds_slot",
        "_mail_seq",
        "_over",
        "_over_error",
        "_started",
        "_watchdog",
        "children",
        "ctx",
        "ended_at",
        "entered",
        "fenced",
        "finishing",
        "from_threads",
        "in_syscall",
        "journal",
        "left_unfinished",
        "mailbox",
        "meter",
        "offspring",
        "parked_at",
        "paused_for",
        "program",
        "record",
        "recovered",
        "remote_children",
        "resumed",
        "runtime",
        "sends",
        "span",
        "span_parent",
        "spawning",
        "spawns",
        "status_write",
        "task",
        "transition_seq",
        "unsaved_steps",
        "value",
    )

    def __init__(
        self,
        runtime: Runtime,
        record: ProcessRecord,
        program: Program,
        journal: Journal,
        *,
        transition_seq: int = 0,
        mail_seq: int = 0,
    ) -> None:
        self.runtime = runtime
        self.record = record
        self.program = program
        self.journal = journal
        self.meter = Meter(record.limits, wall_before=record.wall_seconds)
        self.mailbox = Mailbox()
        self.ctx = Context(self)
        self.value: Any = None
        self.children: dict[int, Limits] = {}
        """Live children's budget reservations, settled as each child ends."""
        self.offspring: list[Process] | None = None
        """The children it spawned, held so that their handles work while it is held. This and
        the sets below are made when first needed: every object an idle process holds is one
        more for the garbage collector to walk, at 100,000 processes."""
        self.remote_children: dict[int, RemoteProcessHandle] = {}
        """Children it spawned that run on other cluster nodes (``Cluster.adopt_remote_child``)."""
        self.spawning: set[asyncio.Future[Process]] | None = None
        """Children whose creation is in flight (see ``Runtime.spawn_process``)."""
        self.from_threads: set[asyncio.Task[Any]] | None = None
        """Syscalls a framework's worker thread sent to the loop (``Context.call_from_thread``):
        tasks of their own, so a stop cancels them along with the process's task."""
        self.task: asyncio.Task[None] | None = None
        """The task that runs it: None before it starts, and once it has ended and its end is
        recorded (see ``lifecycle.run``)."""
        self._finished: asyncio.Future[None] | None = None
        """What waits for the end await (``finished``): made only once something waits, since
        most idle processes have nobody waiting on them yet, and it is one more object for the
        garbage collector in each."""
        self._over = False
        self._over_error: BaseException | None = None
        self.transition_seq = transition_seq
        self.unsaved_steps: list[tuple[int, dict[str, JSON]]] | None = None
        """Transitions made but not yet written (``transitions.set_status``); None when there
        are none, as for every idle process once its way to waiting is written."""
        self._mail_seq = mail_seq
        self.resumed: asyncio.Event | None = asyncio.Event() if record.paused else None
        """While paused, what is set when it is resumed; None while it is not paused (most
        processes, most of the time: no event, and its deque, for each of them)."""
        self._holds_slot = False
        self.entered = False
        self.finishing = False  # recording its end (lifecycle.finish): a stop is not repeated now
        self._started = time.monotonic()
        self.ended_at: float | None = None
        self.parked_at: float | None = None
        """When it stopped paused at a boundary (``syscall.park``); None while it is not parked."""
        self.paused_for = 0.0
        """Seconds it has spent parked in this kernel: no part of its wall time."""
        self._watchdog: asyncio.TimerHandle | None = None
        self.span: Any = None
        """The process's OpenTelemetry span while it runs (``ringzero.core.support.telemetry``)."""
        self.span_parent: Any = runtime.telemetry.current_context()
        """Where the span goes: under the context the spawn was made in."""
        self.status_write: asyncio.Future[None] | None = None
        """The status write in flight (see ``write_status``)."""
        self.fenced: Fenced | None = None
        """Set when another kernel took this process over: it stops here and writes nothing more."""
        self.in_syscall: tuple[str, str, float] | None = None
        """(kind, summary, monotonic start) of the syscall running live now, the latest one
        where several run at once: what ``ringzero top`` shows (``ringzero.core.support.monitor``)."""
        self.sends = 0
        self.spawns = 0
        """Sends and spawns made so far in program order (replayed ones too): the ids that make a
        resumed program's first live send and spawn idempotent (``ctx.send``, ``ctx.spawn``)."""
        self.recovered = False
        """Resumed by ``recover()``: what this kernel lacks leaves it unfinished (``leave_unfinished``)."""
        self.left_unfinished: RingzeroError | None = None
        """Why the process stopped without ending (``leave_unfinished``): what ``wait`` raises."""

    # ----------------------------------------------------------------- identity
    @property
    def pid(self) -> int:
        return self.record.pid

    @property
    def status(self) -> ProcessStatus:
        return self.record.status

    @property
    def ran_here(self) -> bool:
        """Whether its program ran in this kernel (its ``value`` is the live return value),
        not only read back from the store after it ended."""
        return self.entered

    @property
    def wall_seconds(self) -> float:
        """Wall time alive in any kernel, less the time it was paused: it stands still while the
        process is parked paused (as the record saved at that moment says, so a host that goes
        away then loses none of it) and stops counting when the process ends."""
        end = self.ended_at if self.ended_at is not None else time.monotonic()
        if self.parked_at is not None:
            end = min(end, self.parked_at)
        return self.meter.wall_before + (end - self._started) - self.paused_for

    @property
    def finished(self) -> asyncio.Future[None]:
        """Done once the process is over (``settle``): with None when its end is recorded, with
        the reason when it stopped without one. Made when first asked for."""
        future = self._finished
        if future is None:
            future = self._finished = asyncio.get_running_loop().create_future()
            if self._over:
                _settle(future, self._over_error)
        return future

    @property
    def over(self) -> bool:
        """Whether ``finished`` is done (without making it)."""
        return self._over

    def settle(self, error: BaseException | None = None) -> None:
        """The process is over: its waiters wake, to ``error`` if there is one (what ``wait``
        raises). The first call counts; later ones change nothing."""
        if self._over:
            return
        self._over, self._over_error = True, error
        if self._finished is not None:
            _settle(self._finished, error)

    @property
    def mail_seq(self) -> int:
        """The seq of the last message delivered to it."""
        return self._mail_seq

    def next_mail_seq(self) -> int:
        self._mail_seq += 1
        return self._mail_seq

    def idempotency_key(self, slot: str) -> str:
        """The key a tool that takes ``idempotency_key`` gets for the call in ``slot``: the same on
        every attempt of that call, and different for every other call of every process (the
        process's spawn time tells apart stores that reuse a pid)."""
        return f"rz-{self.pid}-{int(self.record.created_at * 1e6):x}-{slot}"

    def keep_child(self, child: Process) -> None:
        """Hold ``child`` (``offspring``), so that its handle works while this process is held."""
        if self.offspring is None:
            self.offspring = []
        self.offspring.append(child)

    # ---------------------------------------------------------------- lifecycle
    def start(self) -> None:
        # Without telemetry the task runs _run itself: one coroutine fewer in the await chain
        # every idle process holds.
        main = run_in_span(self) if self.runtime.telemetry.enabled else run(self)
        self.task = asyncio.get_running_loop().create_task(main, name=f"ringzero-pid-{self.pid}")

    def needs(self, cause: NoProvider | ToolNotFound) -> NoReturn:
        """This kernel lacks an LLM provider or a tool the program asks for. A fresh process
        gets the error; a recovered one stops here without ending (``NotResumed``): a crash
        left recoverable work, and a kernel configured without that part must not turn it into
        a failure. A resume with a kernel that has the part goes on from this syscall."""
        if not self.recovered:
            raise cause
        self.leave_unfinished(NotResumed(self.pid, self.record.name, cause))

    def leave_unfinished(self, error: RingzeroError) -> NoReturn:
        """Stop the process, unwound as a cancellation (which a program does not catch), with
        nothing terminal written, so that ``recover()`` resumes it from its journal later:
        ``NotResumed`` (this kernel lacks what it needs), or a ``CheckpointerError`` (the store
        failed to record a syscall: the program never saw its result)."""
        self.left_unfinished = error
        raise asyncio.CancelledError("left unfinished")

    def end_unfinished(self) -> None:
        """What a process that stops without ending leaves (``Fenced``; ``NotResumed`` or a
        ``CheckpointerError``, see ``leave_unfinished``): its waiters get why, it leaves the live
        table, and a later ``recover()`` may take it."""
        self.ended_at = time.monotonic()
        reason = self.fenced or self.left_unfinished
        if reason is not None:
            self.settle(reason)
        self.runtime.retire(self)

    def snapshot(self) -> None:
        """Copy the live counters into the record before it is saved."""
        self.record.spent = self.meter.spent_dict()
        self.record.wall_seconds = self.wall_seconds

    async def acquire_slot(self) -> None:
        await self.runtime.scheduler.acquire(self.pid, self.record.priority)
        self._holds_slot = True

    def release_slot(self) -> None:
        if self._holds_slot:
            self._holds_slot = False
            self.runtime.scheduler.release(self.pid)

    def request_stop(self, reason: StopReason) -> None:
        """Stop the process from outside its task (kill, wall-time watchdog).

        The stop holds until the process ends: a cancellation that library code swallows
        (Python 3.11's ``asyncio.wait_for`` loses one that lands as its inner future
        completes, and psycopg's pool waits with it) is delivered again until the task stops.
        """
        if self.record.stop_reason is None:
            self.record.stop_reason = reason
        # A task cancelled before its first step would never run lifecycle.run (which checks the stop
        # reason on entry instead); one that is finishing is already stopping.
        if self.task is not None and not self.task.done() and self.entered and not self.finishing:
            self.task.cancel()
            for syscall in list(self.from_threads or ()):
                syscall.cancel()
            asyncio.get_running_loop().call_later(RECANCEL_EVERY, self._cancel_again)

    def _cancel_again(self) -> None:
        if self.record.stop_reason is not None:
            self.request_stop(self.record.stop_reason)

    def stop_now(self, reason: StopReason) -> NoReturn:
        """Stop the process from inside its own task, at a syscall."""
        if self.record.stop_reason is None:
            self.record.stop_reason = reason
        raise asyncio.CancelledError(reason.value)

    def arm_watchdog(self) -> None:
        """Stop the process when its wall budget runs out (from now: what it has not spent)."""
        left = self.meter.remaining("wall_seconds")
        if left is not None:
            left -= self.wall_seconds - self.meter.wall_before
            loop = asyncio.get_running_loop()
            self._watchdog = loop.call_later(max(0.0, left), self.request_stop, StopReason.WALL_SECONDS)

    def disarm_watchdog(self) -> None:
        if self._watchdog is not None:
            self._watchdog.cancel()
            self._watchdog = None

    # ------------------------------------------------------------ pause/resume
    async def pause(self) -> None:
        self._check_alive("pause")
        if self.record.paused:
            return
        self.record.paused = True
        if self.resumed is None:
            self.resumed = asyncio.Event()
        await write_status(self)

    async def resume(self) -> None:
        self._check_alive("resume")
        if not self.record.paused:
            raise ProcessStateError(f"pid {self.pid} is not paused (it is {self.status.value})")
        self.record.paused = False
        resumed, self.resumed = self.resumed, None
        if resumed is not None:
            resumed.set()
        if self.status is not ProcessStatus.PAUSED:  # paused before it reached a boundary
            await write_status(self)

    def _check_alive(self, what: str) -> None:
        if self.status.terminal:
            raise ProcessStateError(f"cannot {what} pid {self.pid}: it has already {self.status.value}")

    @property
    def pause_pending(self) -> bool:
        """Asked to pause, and not resumed yet: the next syscall boundary pauses it."""
        return self.resumed is not None

    def check_budget(self) -> None:
        """Warn at 90% and stop the process once a budget is crossed."""
        if not self.meter.limited:
            return
        for resource, used, limit in self.meter.new_warnings():
            self.runtime.emit("budget_warning", self.pid, {"resource": resource, "used": used, "limit": limit})
        reason = self.meter.first_crossed()
        if reason is not None:
            self.stop_now(reason)



def _settle(future: asyncio.Future[None], error: BaseException | None) -> None:
    """``future`` done, to ``error`` if there is one, marked as retrieved: ``wait`` raises it,
    and nobody else need be told of it when nobody waits."""
    if future.done():
        return
    if error is None:
        future.set_result(None)
    else:
        future.set_exception(error)
        future.exception()
