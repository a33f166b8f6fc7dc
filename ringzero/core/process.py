"""A process: one program's run, with its lifecycle, budget, mailbox and journal.

The program itself is an ``async def`` taking a Context; the kernel wraps it in an asyncio
task. Every syscall passes ``Process.syscall``, the one boundary where pause, scheduling,
budgets and the journal act, so a program cannot slip past any of them.
"""

from __future__ import annotations

import asyncio
import time
import traceback
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import TYPE_CHECKING, Any, NoReturn

from ringzero.core.budget import Meter
from ringzero.core.context import Context, enter
from ringzero.core.errors import (
    CheckpointerError,
    Fenced,
    NonDeterminismError,
    NoProvider,
    NotResumed,
    NotSerializable,
    ProcessStateError,
    RingzeroError,
    ToolNotFound,
)
from ringzero.core.journal import Journal
from ringzero.core.mailbox import Mailbox
from ringzero.core.new_run import ContinueAsNew, begin_new_run
from ringzero.core.store import ProcessRecord
from ringzero.core.syscall import Outcome
from ringzero.core.syscall import syscall as run_syscall
from ringzero.core.timeouts import RECANCEL_EVERY, shielded
from ringzero.core.types import (
    JSON,
    Checkpoint,
    Limits,
    ProcessStatus,
    StopReason,
    ensure_json,
    json_form,
    json_problem,
)

if TYPE_CHECKING:
    from ringzero.core.remote import RemoteProcessHandle
    from ringzero.core.runtime import Runtime

__all__ = ["Process", "Program"]

Program = Callable[..., Awaitable[Any]]


class Process:
    """The kernel's live view of one process (the program sees only its Context).

    Slots: with its 36 attributes, past the 30 an instance keeps without a dict of its own,
    each process held one more object for the garbage collector to walk (at 10,000 and
    100,000 idle processes, every full collection walks them all)."""

    __slots__ = (
        "__weakref__", "_ended", "_entered", "_finished", "_holds_slot", "_mail_seq", "_over", "_over_error",
        "_resumed", "_span_parent", "_started", "_status_write", "_transition_seq", "_unsaved", "_watchdog",
        "children", "ctx", "fenced", "finishing", "from_threads", "in_syscall", "journal",
        "left_unfinished", "mailbox", "meter", "offspring", "program", "record", "recovered", "remote_children",
        "runtime", "sends", "span", "spawning", "spawns", "task", "value",
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
        recorded (see ``_run``)."""
        self._finished: asyncio.Future[None] | None = None
        """What waits for the end await (``finished``): made only once something waits, since
        most idle processes have nobody waiting on them yet, and it is one more object for the
        garbage collector in each."""
        self._over = False
        self._over_error: BaseException | None = None
        self._transition_seq = transition_seq
        self._unsaved: list[tuple[int, dict[str, JSON]]] | None = None
        """Transitions made but not yet written (see ``_set``); None when there are none, as
        for every idle process once its way to waiting is written."""
        self._mail_seq = mail_seq
        self._resumed: asyncio.Event | None = asyncio.Event() if record.paused else None
        """While paused, what is set when it is resumed; None while it is not paused (most
        processes, most of the time: no event, and its deque, for each of them)."""
        self._holds_slot = False
        self._entered = False
        self.finishing = False  # recording its end (finish): a stop is not repeated now
        self._started = time.monotonic()
        self._ended: float | None = None
        self._watchdog: asyncio.TimerHandle | None = None
        self.span: Any = None
        """The process's OpenTelemetry span while it runs (``ringzero.core.telemetry``)."""
        self._span_parent: Any = runtime.telemetry.current_context()
        """Where the span goes: under the context the spawn was made in."""
        self._status_write: asyncio.Future[None] | None = None
        """The status write in flight (see ``write_status``)."""
        self.fenced: Fenced | None = None
        """Set when another kernel took this process over: it stops here and writes nothing more."""
        self.in_syscall: tuple[str, str, float] | None = None
        """(kind, summary, monotonic start) of the syscall running live now, the latest one
        where several run at once: what ``ringzero top`` shows (``ringzero.core.monitor``)."""
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
        return self._entered

    @property
    def wall_seconds(self) -> float:
        """Wall time alive in any kernel; it stops counting when the process ends."""
        end = self._ended if self._ended is not None else time.monotonic()
        return self.meter.wall_before + (end - self._started)

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
        main = self._run_in_span() if self.runtime.telemetry.enabled else self._run()
        self.task = asyncio.get_running_loop().create_task(main, name=f"ringzero-pid-{self.pid}")

    async def _set(self, status: ProcessStatus, detail: str = "") -> None:
        """Move to ``status``. The end of a process is written before this returns; a
        transition on the way (ready, running, waiting, paused) is written with the others the
        kernel's processes make in the same turn of the loop (``TransitionWriter.save_soon``): a process
        that goes from ready to running to waiting in one turn writes one transitions row and
        one status row, not three of each. Losing one of those in a crash loses nothing that
        recovery needs (it resumes every process that has not ended, from its journal)."""
        old = self.record.status
        self.record.status = status
        self._transition_seq += 1
        if self._unsaved is None:
            self._unsaved = []
        old_value, new_value = old.value, status.value
        self._unsaved.append((self._transition_seq,
                              {"from": old_value, "to": new_value, "at": time.time(), "detail": detail}))
        if status.terminal:  # its event comes once it is written, as whoever reads the store expects
            try:
                await self.save_transitions(with_state=True)
            except BaseException:
                self.record.status = old  # not ended where it was not recorded as ended
                raise
        else:
            self.runtime.save_soon(self)
        runtime = self.runtime
        if runtime.listeners:  # the event's data is built only for someone who listens
            runtime.emit("transition", self.pid, {"from": old_value, "to": new_value, "detail": detail})

    async def save_transitions(self, *, with_state: bool = False) -> None:
        """Write the transitions not yet written (one row) and the status they end in, together
        (``KernelStore.put_rows``: one commit where the store can); ``with_state``: the state
        row (``ctx.state``, result, error) too, ahead of them, as at the end of the process."""
        steps, self._unsaved = self._unsaved, None
        if not steps or self.fenced is not None:  # a fenced process writes nothing more
            return
        store = self.runtime.store
        try:
            first = store.transitions_row(self.pid, steps)
            await self.write_status((store.state_row(self.record), first) if with_state else (first,))
        except BaseException:
            self._unsaved = steps + (self._unsaved or [])  # written with the next ones, or their error raised then
            raise

    @staticmethod
    async def save_transitions_of(processes: Sequence[Process]) -> None:
        """``save_transitions`` of each of ``processes``, their rows (transitions, then status,
        of each) written in one ``put_rows``: one record of an appending store's log, one
        commit of a store that puts many at once, where each process's own write cost a
        record, a coroutine and a future of its own. A process with a status write in flight
        (its rows must come after that one's) or fenced goes its own way, after them. A failed
        write leaves each process's transitions unsaved, as ``save_transitions`` does, and
        raises."""
        taken: list[tuple[Process, list[tuple[int, dict[str, JSON]]]]] = []
        rows: list[Checkpoint] = []
        alone: list[Process] = []
        for process in processes:
            steps = process._unsaved
            if not steps:
                continue
            if process._status_write is not None or process.fenced is not None:
                alone.append(process)
                continue
            process._unsaved = None
            process.snapshot()
            store = process.runtime.store
            rows += (store.transitions_row(process.pid, steps), store.status_row(process.record))
            taken.append((process, steps))
        if taken:
            done = asyncio.get_running_loop().create_future()
            for process, _ in taken:
                process._status_write = done
            try:
                await taken[0][0].runtime.store.put_rows(rows)
            except BaseException:
                for process, steps in taken:
                    process._unsaved = steps + (process._unsaved or [])
                raise
            finally:
                for process, _ in taken:
                    if process._status_write is done:
                        process._status_write = None
                done.set_result(None)
        for process in alone:
            await process.save_transitions()

    async def write_status(self, before: Sequence[Checkpoint] = ()) -> None:
        """Write the status row (status, pause flag, counters), one write at a time for this
        process, after the rows ``before`` and atomically with them where the store can. Over
        a pool of connections (PostgreSQL) two writes in flight may commit in either order, and
        an older row committed last would undo what the newer one says (a batched ``running``
        landing after the process's end left it ``running`` for good)."""
        while self._status_write is not None:
            await shielded(self._status_write)
        done = self._status_write = asyncio.get_running_loop().create_future()
        try:
            self.snapshot()  # taken now, so the row written last is also the newest
            store = self.runtime.store
            await store.put_rows((*before, store.status_row(self.record)))
        finally:
            self._status_write = None
            done.set_result(None)

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
        self._ended = time.monotonic()
        reason = self.fenced or self.left_unfinished
        if reason is not None:
            self.settle(reason)
        self.runtime.retire(self)

    def snapshot(self) -> None:
        """Copy the live counters into the record before it is saved."""
        self.record.spent = self.meter.spent_dict()
        self.record.wall_seconds = self.wall_seconds

    async def _acquire(self) -> None:
        await self.runtime.scheduler.acquire(self.pid, self.record.priority)
        self._holds_slot = True

    def _release(self) -> None:
        if self._holds_slot:
            self._holds_slot = False
            self.runtime.scheduler.release(self.pid)

    async def _run_in_span(self) -> None:
        """``_run`` inside the process's span."""
        self._entered = True
        telemetry = self.runtime.telemetry
        self.span = telemetry.process_started(self, self._span_parent)
        try:
            await self._run()
        finally:
            if self.span is not None:
                span, self.span = self.span, None
                telemetry.process_ended(span, self)

    async def _run(self) -> None:
        self._entered = True
        status, reason, error = ProcessStatus.EXITED, StopReason.RETURNED, None
        try:
            if self.record.stop_reason is not None:  # stopped before it ever ran
                raise asyncio.CancelledError(self.record.stop_reason.value)
            await self._set(ProcessStatus.READY)
            await self._acquire()
            await self._set(ProcessStatus.RUNNING, "recovered" if self.journal.length else "")
            self._arm_watchdog()
            enter(self.ctx)  # this task's context: programs and the tasks they start see it
            while True:
                try:
                    self.value = await self.program(self.ctx, *self.record.args)
                    break
                except ContinueAsNew as again:
                    await begin_new_run(self, again)
        except asyncio.CancelledError:
            if self.fenced is None and self.left_unfinished is None and self.record.stop_reason is None:
                # The kernel is shutting down: leave the record as a crash would, so that
                # recover() resumes this process later.
                raise
        except NonDeterminismError as exc:
            status, reason, error = ProcessStatus.FAILED, StopReason.NON_DETERMINISM, _error_info(exc)
        except Exception as exc:
            status, reason, error = ProcessStatus.FAILED, StopReason.RAISED, _error_info(exc)
        finally:
            self._release()
            self._disarm_watchdog()
        if self.fenced is not None or self.left_unfinished is not None:
            # Fenced: the new owner finishes it; this kernel lets go, silently. Left unfinished:
            # recover() finishes it, once the kernel has what it needs or the store is back.
            if self.left_unfinished is not None:
                await self.runtime.flush()  # its transitions so far, as a shutdown leaves them
            self.end_unfinished()
            return
        if self.record.stop_reason is not None:  # killed, or a budget ran out
            status, reason = ProcessStatus.KILLED, self.record.stop_reason
        try:
            await self.finish(status, reason, error)
        except CheckpointerError as exc:  # its end is not recorded: it is not over, for recover()
            self.left_unfinished = exc
            self.end_unfinished()
            return
        # Ended and recorded: its task, done now, is let go with its coroutine and its context
        # (five objects for the garbage collector to walk in every process a handle still
        # holds). A task that ends with an exception is kept, for whoever awaits it.
        self.task = None

    async def finish(self, status: ProcessStatus, reason: StopReason, error: dict[str, str] | None) -> None:
        """Record the end of the process, refund its parent, and wake its waiters.

        Nothing cancels this (request_stop leaves a finishing process alone), and waiters are
        woken even if the store fails, with that failure.
        """
        self.finishing = True
        self._ended = time.monotonic()
        problem = json_problem(self.record.state, "ctx.state")
        if problem is not None:  # kept in a JSON form, and the process fails: a resume would see other state
            self.record.state = json_form(self.record.state)  # type: ignore[assignment]
            if status is ProcessStatus.EXITED:
                status, reason, error = ProcessStatus.FAILED, StopReason.RAISED, _error_info(NotSerializable(problem))
        self.record.stop_reason = reason
        self.record.error = error
        if status is ProcessStatus.EXITED:
            try:
                self.record.result = ensure_json(self.value, "the program's return value")
            except NotSerializable:
                self.record.result = repr(self.value)
        try:
            # The result with the end, ahead of it: whoever reads an ended status finds what the
            # process left.
            await self._set(status, reason.value)
        except BaseException as exc:
            self.settle(exc)
            raise
        try:
            self.runtime.child_finished(self)
        finally:  # its end is recorded: its waiters wake, even where the bookkeeping after it failed
            self.settle()

    def request_stop(self, reason: StopReason) -> None:
        """Stop the process from outside its task (kill, wall-time watchdog).

        The stop holds until the process ends: a cancellation that library code swallows
        (Python 3.11's ``asyncio.wait_for`` loses one that lands as its inner future
        completes, and psycopg's pool waits with it) is delivered again until the task stops.
        """
        if self.record.stop_reason is None:
            self.record.stop_reason = reason
        # A task cancelled before its first step would never run _run (which checks the stop
        # reason on entry instead); one that is finishing is already stopping.
        if self.task is not None and not self.task.done() and self._entered and not self.finishing:
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

    def _arm_watchdog(self) -> None:
        left = self.meter.remaining("wall_seconds")
        if left is not None:
            loop = asyncio.get_running_loop()
            self._watchdog = loop.call_later(max(0.0, left), self.request_stop, StopReason.WALL_SECONDS)

    def _disarm_watchdog(self) -> None:
        if self._watchdog is not None:
            self._watchdog.cancel()
            self._watchdog = None

    # ------------------------------------------------------------ pause/resume
    async def pause(self) -> None:
        self._check_alive("pause")
        if self.record.paused:
            return
        self.record.paused = True
        if self._resumed is None:
            self._resumed = asyncio.Event()
        await self.write_status()

    async def resume(self) -> None:
        self._check_alive("resume")
        if not self.record.paused:
            raise ProcessStateError(f"pid {self.pid} is not paused (it is {self.status.value})")
        self.record.paused = False
        resumed, self._resumed = self._resumed, None
        if resumed is not None:
            resumed.set()
        if self.status is not ProcessStatus.PAUSED:  # paused before it reached a boundary
            await self.write_status()

    def _check_alive(self, what: str) -> None:
        if self.status.terminal:
            raise ProcessStateError(f"cannot {what} pid {self.pid}: it has already {self.status.value}")

    # ------------------------------------------------------------------ syscalls
    def syscall(
        self,
        kind: str,
        args: Any,
        summary: str,
        live: Callable[[], Awaitable[Outcome]],
        *,
        needs: tuple[tuple[str, float], ...] = (),
        waits: bool = False,
        fp: str | None = None,
        about: Callable[[], dict[str, Any]] | None = None,
        effect: Callable[[], bool] | None = None,
        slotted: bool = False,
    ) -> Coroutine[Any, Any, Outcome]:
        """Run one syscall through the boundary, the journal and the budgets (``ringzero.core.syscall``)."""
        return run_syscall(self, kind, args, summary, live, needs=needs, waits=waits, fp=fp, about=about,
                           effect=effect, slotted=slotted)

    @property
    def pause_pending(self) -> bool:
        """Asked to pause, and not resumed yet: the next syscall boundary pauses it."""
        return self._resumed is not None

    def check_budget(self) -> None:
        """Warn at 90% and stop the process once a budget is crossed."""
        if not self.meter.limited:
            return
        for resource, used, limit in self.meter.new_warnings():
            self.runtime.emit("budget_warning", self.pid, {"resource": resource, "used": used, "limit": limit})
        reason = self.meter.first_crossed()
        if reason is not None:
            self.stop_now(reason)

    async def boundary(self) -> None:
        """Where pause takes effect and equal-or-higher-priority processes get their turn."""
        resumed = self._resumed
        if resumed is not None:
            self._release()
            await self._set(ProcessStatus.PAUSED)
            await resumed.wait()
            await self._set(ProcessStatus.READY, "resumed")
            await self._acquire()
            await self._set(ProcessStatus.RUNNING)
        elif self.runtime.scheduler.should_yield(self.pid, self.record.priority):
            self._release()
            await self._set(ProcessStatus.READY, "yielded")
            await self._acquire()
            await self._set(ProcessStatus.RUNNING)

    async def wait_begins(self) -> None:
        """Before a syscall that blocks on an event (``waits``): the run slot goes back. Awaited
        before the wait, not around it, so no coroutine of its own sits in the await chain of
        every idle process."""
        self._release()
        await self._set(ProcessStatus.WAITING)

    async def wait_ends(self) -> None:
        """After it: ready, then running once a slot is free again."""
        await self._set(ProcessStatus.READY)
        await self._acquire()
        await self._set(ProcessStatus.RUNNING)


def _error_info(exc: BaseException) -> dict[str, str]:
    return {
        "type": type(exc).__name__,
        "message": str(exc),
        "traceback": "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)),
    }


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
