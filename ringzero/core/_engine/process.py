"""A process: one program's run, with its record, budget, mailbox, journal and run slot.

The program itself is an ``async def`` taking a Context; the kernel wraps it in an asyncio
task, whose life is ``ringzero.core._engine.lifecycle``'s. Every syscall passes
``ringzero.core._engine.syscall.syscall``, the one boundary where pause, scheduling, budgets
and the journal act, so a program cannot slip past any of them.

A ``Process`` owns its state: the other modules of the engine ask it to change (its methods),
never set its attributes. Its invariants live here: one status write at a time, transitions
not yet written kept in order and put back when a write fails, the wall time that stands still
while it is parked paused.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Callable, Coroutine, Mapping, Sequence
from typing import TYPE_CHECKING, Any, NoReturn, Protocol

from ringzero.core._engine.budget import Meter, Spend
from ringzero.core._engine.cluster import Cluster
from ringzero.core._engine.journal import Journal
from ringzero.core._engine.mailbox import Mail, Mailbox
from ringzero.core.contract.errors import (
    Fenced,
    NoProvider,
    NotResumed,
    ProcessNotFound,
    ProcessStateError,
    RingzeroError,
    ToolNotFound,
)
from ringzero.core.contract.records import Ending, Event
from ringzero.core.contract.store import KernelStore, ProcessRecord
from ringzero.core.contract.types import JSON, Checkpoint, Limits, ProcessStatus, Program, StopReason
from ringzero.core.support.timeouts import RECANCEL_EVERY, shielded

if TYPE_CHECKING:
    from ringzero.core.contract.protocols import Executor, Scheduler, Tool
    from ringzero.core.contract.remote import RemoteProcessHandle
    from ringzero.core.support.gate import LLMGate
    from ringzero.core.support.memory import MemoryStore
    from ringzero.core.support.no_telemetry import NoTelemetry

__all__ = ["Host", "Process", "Program"]


_WAITS_ON = {"recv": "message", "sleep": "timer", "sleep_until": "timer", "wait": "child"}
"""What a process waits on (``Waiting.on``) in each waiting syscall."""


class Host(Protocol):
    """What a process asks of the kernel that runs it: ``Runtime`` (``runtime.py``) is the one
    there is. The engine's modules under the runtime (syscalls, lifecycle, handles) reach the
    kernel through this alone, so the runtime, which makes processes, stands above all of them
    and nothing imports back up to it."""

    store: KernelStore
    scheduler: Scheduler
    executor: Executor
    tools: dict[str, Tool]
    gates: dict[str, LLMGate]
    memory: MemoryStore
    cluster: Cluster
    telemetry: NoTelemetry
    listeners: list[Callable[[Event], None]]
    replay_only: bool

    def gate(self, name: str = "default") -> LLMGate:
        """The LLM gate of provider ``name`` (``NoProvider`` where there is none)."""

    def emit(self, kind: str, pid: int, data: Mapping[str, JSON]) -> None:
        """Tell the kernel's subscribers (``Kernel.subscribe``)."""

    def save_soon(self, process: Process) -> None:
        """Write ``process``'s transitions with the others made in this turn of the loop."""

    async def flush(self) -> None:
        """Write every transition not yet written."""

    def retire(self, process: Process) -> None:
        """``process`` has stopped: it leaves the live table."""

    def child_finished(self, child: Process) -> None:
        """``child`` has ended: retire it and refund its parent what it did not spend."""

    def runs(self, pid: int) -> bool:
        """Whether ``pid`` is live in this kernel."""

    def process(self, pid: int) -> Process:
        """The live process ``pid``, or an ended one something still holds (ProcessNotFound)."""

    async def held(self, pid: int) -> Process:
        """The process ``pid``: live here, held by something, or read from the store."""

    async def spawn_process(self, program: Program, args: Sequence[JSON], *, name: str | None, priority: int,
                            limits: Limits | None, parent: int | None, remote_parent: int | None = None,
                            spawn_id: str | None = None) -> Process:
        """Create and start a process."""

    def spawned_before_crash(self, parent: Process, spawn_id: str) -> int | None:
        """The child a resumed ``parent`` created with this spawn before its host died."""

    async def adopt(self, parent: Process, child_pid: int, child_limits: Limits) -> None:
        """Attach a replayed spawn's child reservation to ``parent``."""

    async def send(self, pid: int, message: JSON, priority: int = ...) -> None:
        """Deliver to ``pid`` wherever it runs."""

    async def deliver(self, pid: int, message: JSON, priority: int, sender: int | None, *,
                      mail_id: str | None = None, maybe_delivered: bool = False) -> None:
        """Store a message for the live process ``pid``, then put it in its mailbox."""

    async def kill_tree(self, process: Process) -> None:
        """Stop ``process`` and its live children; wait for each end."""


class Process:
    """The kernel's live view of one process (the program sees only its Context).

    Slots: with its 37 attributes, past the 30 an instance keeps without a dict of its own,
    each process held one more object for the garbage collector to walk (at 10,000 and
    100,000 idle processes, every full collection walks them all)."""

    __slots__ = (
        "__weakref__",
        "_finished",
        "_holds_slot",
        "_mail_seq",
        "_over",
        "_over_error",
        "_root",
        "_started",
        "_watchdog",
        "children",
        "ended_at",
        "entered",
        "fenced",
        "finishing",
        "from_threads",
        "in_syscall",
        "journal",
        "left_unfinished",
        "loaded_as",
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
        runtime: Host,
        record: ProcessRecord,
        program: Program,
        journal: Journal,
        *,
        transition_seq: int = 0,
        mail_seq: int = 0,
        recovered: bool = False,
        counts: tuple[int, int] = (0, 0),
    ) -> None:
        self.runtime = runtime
        self.record = record
        self.program = program
        self.journal = journal
        self.meter = Meter(record.limits, wall_before=record.wall_seconds)
        self.mailbox = Mailbox()
        self.value: Any = None
        self.children: dict[int, Limits] = {}
        """Live children's budget reservations, settled as each child ends."""
        self.offspring: list[Process] | None = None
        """The children it spawned, held so that their handles work while it is held. This and
        the sets below are made when first needed: every object an idle process holds is one
        more for the garbage collector to walk, at 100,000 processes."""
        self.remote_children: dict[int, RemoteProcessHandle] = {}
        """Children it spawned that run on other cluster nodes (``adopt_remote_child``)."""
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
        """Transitions made but not yet written (``move_to``); None when there
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
        """When it stopped paused at a boundary (``park``); None while it is not parked."""
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
        self.sends, self.spawns = counts
        """Sends and spawns made so far in program order (replayed ones too): the ids that make a
        resumed program's first live send and spawn idempotent (``ctx.send``, ``ctx.spawn``)."""
        self.recovered = recovered
        """Resumed by ``recover()``: what this kernel lacks leaves it unfinished (``leave_unfinished``)."""
        self.left_unfinished: RingzeroError | None = None
        """Why the process stopped without ending (``leave_unfinished``): what ``wait`` raises."""
        self._root: int | None = None
        self.loaded_as = (record.status, record.waiting) if recovered else None
        """Where a recovered process stood in the store when it was loaded (``back_as_loaded``)."""

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

    def stored_mail(self, mail: Mail) -> None:
        """A message stored for it in the store while it ran here (``Runtime.take_stored_mail``):
        into its mailbox, unless it has had it."""
        if mail.seq > self._mail_seq:
            self._mail_seq = mail.seq
            self.mailbox.put(mail)

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
    def start(self, main: Coroutine[Any, Any, None]) -> None:
        """Run ``main`` (``lifecycle.launch``: its life) as its task."""
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

    @property
    def program_root(self) -> int:
        """The pid of the top-level process this one descends from (itself, for a top-level
        one): the program whose model calls the LLM gate counts together. Found once, through the
        ancestors this kernel holds (an ancestor it does not hold ends the search there)."""
        if self._root is None:
            root, parent, hops = self.pid, self.record.parent, 0
            while parent is not None and hops < 1000:
                root, hops = parent, hops + 1
                try:
                    parent = self.runtime.process(parent).record.parent
                except ProcessNotFound:
                    break
            self._root = root
        return self._root

    async def back_as_loaded(self) -> None:
        """A recovered process this kernel could not resume (``NotResumed``) does not stay
        ``running``, as its replay left it: it goes back to the status it had in the store
        (waiting for a message, say) where it recorded nothing since, else to ``ready`` (its
        next step is the call it could not make). What ``ps`` shows and ``send`` reads stay true
        until a resume that can."""
        if self.loaded_as is None:
            return
        status, waiting = self.loaded_as if not self.journal.made_live else (ProcessStatus.READY, None)
        if status is self.record.status:
            return
        self.record.waits_on(waiting)
        await self.move_to(status, "not resumed")

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
        self.record.count(self.meter.spent_dict(), self.wall_seconds)

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
        self.record.ask_to_stop(reason)
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
        self.record.ask_to_stop(reason)
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

    # ----------------------------------------------------------- its own life
    def entering(self) -> None:
        """Its task has begun to run it (``lifecycle.run``)."""
        self.entered = True

    def traced(self, span: Any) -> None:
        """Its span while it runs (None once it has ended)."""
        self.span = span

    def returned(self, value: Any) -> None:
        """What its program returned."""
        self.value = value

    def finishing_now(self) -> None:
        """Its end is being recorded (``lifecycle.finish``): a stop is not repeated now."""
        self.finishing = True
        self.ended_at = time.monotonic()

    def end_as(self, stop_reason: StopReason, error: dict[str, str] | None, result: JSON,
               state: dict[str, JSON]) -> Ending:
        """Its record filled in with how it ended; what the record held before (``ProcessRecord.end``)."""
        return self.record.end(stop_reason=stop_reason, error=error, result=result, state=state)

    def not_ended(self, before: Ending) -> None:
        """Its end could not be written: its record is the unfinished one the store holds."""
        self.record.undo_end(before)

    def unfinished_because(self, error: RingzeroError) -> None:
        """It stops without ending, for ``error`` (see ``leave_unfinished``), outside its task."""
        self.left_unfinished = error

    def let_go_of_task(self) -> None:
        """Its end is recorded: its task, done, goes with its coroutine and context."""
        self.task = None

    def fence(self, error: Fenced) -> None:
        """Another kernel took it over: it stops here and writes nothing more."""
        self.fenced = error

    def reload(self, record: ProcessRecord) -> None:
        """The record the store holds now, for a process another kernel runs."""
        self.record = record

    def next_run(self, journal: Journal) -> None:
        """A new run (``ctx.continue_as_new``) with its own, empty journal."""
        self.journal = journal

    def next_send(self) -> str:
        """The id of its next send in program order (the same when the program runs again)."""
        self.sends += 1
        return f"{self.pid}:{self.sends}"

    def next_spawn(self) -> str:
        """The id of its next spawn in program order (the same when the program runs again)."""
        self.spawns += 1
        return f"{self.pid}:{self.spawns}"

    def reserve(self, child_pid: int, limits: Limits) -> None:
        """Hold ``limits`` of its budget for child ``child_pid`` until that child ends (``settle_child``)."""
        self.children[child_pid] = limits

    def settle_child(self, pid: int, spent: Spend) -> None:
        """Child ``pid`` has ended having spent ``spent``: its reservation is given back, less
        that (once: whoever sees the end first settles it)."""
        if pid in self.children:
            self.meter.settle(self.children.pop(pid), spent)

    def adopt_remote_child(self, child: RemoteProcessHandle, limits: Limits) -> None:
        """A child on another cluster node: its reservation is held here and settled, with what
        it spent, when it ends there (the cluster follows it, if it moves too)."""
        self.reserve(child.pid, limits)
        self.remote_children[child.pid] = child
        self.runtime.cluster.when_ended(child, functools.partial(self.remote_child_ended, child.pid))

    def remote_child_ended(self, pid: int, ended: Mapping[str, Any]) -> None:
        """Its remote child ``pid`` ended as ``ended`` (its ``RemoteProcessHandle.ended``) says."""
        self.settle_child(pid, Spend.from_dict(ended.get("spent") or {}))

    def track_spawning(self, creation: asyncio.Future[Process]) -> None:
        """A child whose creation is in flight: a stop waits for it."""
        if self.spawning is None:
            self.spawning = set()
        self.spawning.add(creation)
        creation.add_done_callback(self.spawning.discard)

    def track_from_thread(self, task: asyncio.Task[Any]) -> None:
        """A syscall a framework's worker thread sent to the loop (a task of its own, running
        now): a stop cancels it too, until it is done."""
        if self.from_threads is None:
            self.from_threads = set()
        self.from_threads.add(task)
        task.add_done_callback(self.from_threads.discard)

    def syscall_began(self, kind: str, summary: str) -> tuple[str, str, float]:
        """A syscall runs live now (what ``ringzero top`` shows); its marker, for ``syscall_ended``."""
        self.in_syscall = current = (kind, summary, time.monotonic())
        return current

    def waits_for(self, kind: str, until: float | None) -> None:
        """It begins to wait in syscall ``kind``, on a timer firing at ``until`` (wall clock) if
        not None: on its record, for the status row its ``waiting`` transition writes."""
        mail = self._mail_seq if kind == "recv" and not len(self.mailbox) else None
        self.record.waits_on((_WAITS_ON.get(kind, kind), until, mail))

    def done_waiting(self) -> None:
        self.record.waits_on(None)

    @property
    def wake_at(self) -> float | None:
        """The wall-clock deadline of the timer it waits on now (``sleep``, a ``recv`` or ``wait``
        with a timeout), None while it waits on none."""
        waiting = self.record.waiting
        return None if waiting is None else waiting[1]

    def syscall_ended(self, current: tuple[str, str, float]) -> None:
        if self.in_syscall is current:
            self.in_syscall = None

    def park(self) -> None:
        """Paused at a boundary: its wall time (``wall_seconds``) and the wall budget's watchdog
        stop."""
        self.parked_at = time.monotonic()
        self.disarm_watchdog()

    def unpark(self) -> None:
        """Resumed (or stopped) where it was parked: its wall time counts again."""
        if self.parked_at is None:
            return
        self.paused_for += time.monotonic() - self.parked_at
        self.parked_at = None
        if self.ended_at is None:
            self.arm_watchdog()

    # ------------------------------------------------------------ transitions
    async def move_to(self, status: ProcessStatus, detail: str = "") -> None:
        """Move to ``status``. The end of a process is written before this returns; a
        transition on the way (ready, running, waiting, paused) is written with the others the
        kernel's processes make in the same turn of the loop (``TransitionWriter.save_soon``): a
        process that goes from ready to running to waiting in one turn writes one transitions
        row and one status row, not three of each. Losing one of those in a crash loses nothing
        that recovery needs (it resumes every process that has not ended, from its journal)."""
        record = self.record
        old = record.status
        record.move_to(status)
        self.transition_seq += 1
        seq = self.transition_seq
        if self.unsaved_steps is None:
            self.unsaved_steps = []
        old_value, new_value = old.value, status.value
        self.unsaved_steps.append((seq, {"from": old_value, "to": new_value, "at": time.time(), "detail": detail}))
        runtime = self.runtime
        if status.terminal:  # its event comes once it is written, as whoever reads the store expects
            try:
                await self.save_transitions(with_state=True)
            except BaseException:
                # Not ended where it was not recorded as ended: neither in memory nor in the
                # transitions a later write carries.
                record.move_to(old)
                unsaved = [step for step in self.unsaved_steps or () if step[0] != seq]
                self.unsaved_steps = unsaved or None
                raise
        else:
            runtime.save_soon(self)
        if runtime.listeners:  # the event's data is built only for someone who listens
            runtime.emit("transition", self.pid, {"from": old_value, "to": new_value, "detail": detail})

    async def save_transitions(self, *, with_state: bool = False) -> None:
        """Write the transitions not yet written (one row) and the status they end in, together
        (``KernelStore.put_rows``: one commit where the store can); ``with_state``: the state
        row (``ctx.state``, result, error) too, ahead of them, as at the end of the process."""
        steps, self.unsaved_steps = self.unsaved_steps, None
        if not steps or self.fenced is not None:  # a fenced process writes nothing more
            return
        store = self.runtime.store
        try:
            first = store.transitions_row(self.pid, steps)
            await self.write_status((store.state_row(self.record), first) if with_state else (first,))
        except BaseException:
            self.requeue(steps)  # written with the next ones, or their error raised then
            raise

    async def write_status(self, before: Sequence[Checkpoint] = ()) -> None:
        """Write the status row (status, pause flag, counters), one write at a time for this
        process, after the rows ``before`` and atomically with them where the store can. Over
        a pool of connections (PostgreSQL) two writes in flight may commit in either order, and
        an older row committed last would undo what the newer one says (a batched ``running``
        landing after the process's end left it ``running`` for good)."""
        while self.status_write is not None:
            await shielded(self.status_write)
        done = self.status_write = asyncio.get_running_loop().create_future()
        try:
            self.snapshot()  # taken now, so the row written last is also the newest
            store = self.runtime.store
            await store.put_rows((*before, store.status_row(self.record)))
        finally:
            self.status_write = None
            done.set_result(None)

    def take_unsaved(self, done: asyncio.Future[None]) -> list[tuple[int, dict[str, JSON]]] | None:
        """Its unwritten transitions, for a write of many processes' rows at once whose end
        ``done`` marks (``transitions.save_together``): taken, its counters snapshotted, and its
        status write marked in flight. None where it has none, or must write on its own (a
        status write in flight, which its rows must follow; fenced)."""
        steps = self.unsaved_steps
        if not steps or self.status_write is not None or self.fenced is not None:
            return None
        self.unsaved_steps = None
        self.snapshot()
        self.status_write = done
        return steps

    def written_together(self, done: asyncio.Future[None]) -> None:
        """The write ``take_unsaved`` joined it to is over."""
        if self.status_write is done:
            self.status_write = None

    def requeue(self, steps: list[tuple[int, dict[str, JSON]]]) -> None:
        """Transitions whose write failed, ahead of any made since: written with the next ones."""
        self.unsaved_steps = steps + (self.unsaved_steps or [])

    # ------------------------------------------------------------ pause/resume
    async def pause(self) -> None:
        self._check_alive("pause")
        if self.record.paused:
            return
        self.record.set_paused(True)
        if self.resumed is None:
            self.resumed = asyncio.Event()
        await self.write_status()

    async def resume(self) -> None:
        self._check_alive("resume")
        if not self.record.paused:
            raise ProcessStateError(f"pid {self.pid} is not paused (it is {self.status.value})")
        self.record.set_paused(False)
        resumed, self.resumed = self.resumed, None
        if resumed is not None:
            resumed.set()
        if self.status is not ProcessStatus.PAUSED:  # paused before it reached a boundary
            await self.write_status()

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
