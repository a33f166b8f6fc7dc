"""The Kernel: creates processes, routes their syscalls, and resumes them after a crash.

    async with Kernel(llm=provider) as kernel:
        p = await kernel.spawn(program, "arg", name="miner", priority=5, limits=Limits(tokens=50_000))
        await p.pause(); await p.resume()
        print(await p.wait(), await kernel.ps())

Defaults need no setup: SQLite in ``./.ringzero/state.db``, the local asyncio scheduler, and
the Monty executor (a sandboxed Python subset in worker processes, started on first use).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import inspect
import os
import socket
import time
import warnings
import weakref
from collections import Counter, deque
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

from ringzero.core.backends import defaults
from ringzero.core.errors import (
    BudgetExceeded,
    InvalidArgument,
    NoProvider,
    NotAProgram,
    NotResumed,
    ProcessFailed,
    ProcessNotFound,
    ProcessStateError,
    ProgramNotFound,
    RingzeroError,
    WrongEventLoop,
)
from ringzero.core.gate import LLMGate
from ringzero.core.journal import OWNER_RECHECK, Journal
from ringzero.core.mailbox import Mail
from ringzero.core.memory import MemoryStore
from ringzero.core.monitor import Monitor
from ringzero.core.new_run import RunStart
from ringzero.core.process import Process, Program
from ringzero.core.protocols import Checkpointer, Executor, LLMProvider, Scheduler, Tool
from ringzero.core.references import (
    import_reference,
    importable_reference,
    importing,
    program_reference,
    reference_of,
    unguarded_script,
)
from ringzero.core.remote import ChildPlacement, Placement, RemoteProcessHandle, SpawnRequest
from ringzero.core.store import KernelStore, ProcessRecord
from ringzero.core.telemetry import Telemetry
from ringzero.core.timeouts import cancel_and_wait, fail_after, shielded, started_eagerly
from ringzero.core.types import JSON, Limits, ProcessStatus, StopReason, ensure_json, json_size

__all__ = ["Event", "Kernel", "ProcessHandle", "ProcessInfo"]

DEFAULT_PRIORITY = 10
PID_BLOCK = 1000
"""How many pids a kernel claims at a time, where it claims them in blocks (``_pid_from_block``)."""
_NO_LIMITS = Limits()
"""The limits of every process spawned without any: one frozen object, not one each."""
MAX_MESSAGE_BYTES = 16 * 1024 * 1024
"""The largest message (its JSON) a mailbox takes: each is stored, and read back at recovery."""
_SAVERS = 64
"""Writers of deferred lifecycle transitions at once (``Kernel._save_unsaved``)."""
_SAVED_TOGETHER = 128
"""Processes whose deferred transitions one write takes, where the store writes many rows in
one step (``Kernel._save_unsaved``)."""


@dataclass(frozen=True)
class Event:
    """Something that happened to a process: a ``transition`` or a ``budget_warning``."""

    kind: str
    pid: int
    data: Mapping[str, JSON]
    at: float


@dataclass(frozen=True)
class ProcessInfo:
    """One row of ``ps``."""

    pid: int
    name: str
    parent: int | None
    priority: int
    status: ProcessStatus
    stop_reason: StopReason | None
    tokens: int
    llm_calls: int
    steps: int
    cost: float
    wall_seconds: float

    @classmethod
    def of(cls, record: ProcessRecord) -> ProcessInfo:
        spent = record.spent
        return cls(
            pid=record.pid, name=record.name, parent=record.parent, priority=record.priority,
            status=record.status, stop_reason=record.stop_reason,
            tokens=int(spent.get("tokens") or 0), llm_calls=int(spent.get("llm_calls") or 0),  # type: ignore[arg-type]
            steps=int(spent.get("steps") or 0), cost=float(spent.get("cost") or 0.0),  # type: ignore[arg-type]
            wall_seconds=record.wall_seconds,
        )


class ProcessHandle:
    """What ``spawn`` returns: a process's pid and the calls that control it."""

    def __init__(self, kernel: Kernel, process: Process) -> None:
        self._kernel = kernel
        self._process = process  # a handle keeps its process's record in memory, the kernel does not
        self.pid = process.pid

    def __repr__(self) -> str:
        return f"<ProcessHandle pid={self.pid} {self.name!r} {self.status.value}>"

    @property
    def name(self) -> str:
        return self._process.record.name

    @property
    def status(self) -> ProcessStatus:
        return self._process.status

    @property
    def stop_reason(self) -> StopReason | None:
        return self._process.record.stop_reason if self.status.terminal else None

    @property
    def error(self) -> dict[str, str] | None:
        """type, message and traceback of what the program raised, once it has failed."""
        return self._process.record.error

    @property
    def state(self) -> dict[str, JSON]:
        return self._process.record.state

    @property
    def program(self) -> str:
        """``module:qualname`` of the program the process runs."""
        return self._process.record.program

    @property
    def args(self) -> list[JSON]:
        """The JSON arguments the program was spawned with."""
        return list(self._process.record.args)

    @property
    def result(self) -> JSON:
        """The recorded return value of a process that exited (its JSON form), else None."""
        return self._process.record.result

    @property
    def replayed_syscalls(self) -> int:
        """Syscalls this run served from the journal (after ``recover()``: calls made before the
        crash, not made again)."""
        return self._process.journal.replayed

    @property
    def live_syscalls(self) -> int:
        """Syscalls this run made live (or is making now)."""
        return self._process.journal.made_live

    @property
    def syscall_now(self) -> str | None:
        """The kind of the syscall the process is in now (``llm``, ``exec``, ``sleep``...), or None."""
        current = self._process.in_syscall
        return None if current is None else current[0]

    def info(self) -> ProcessInfo:
        self._process.snapshot()
        return ProcessInfo.of(self._process.record)

    @property
    def elsewhere(self) -> bool:
        """Whether the process is unfinished and runs in no kernel of this OS process (another
        host runs it, or it waits in the store for a resume): a handle from ``Kernel.handle``."""
        return not self._process.over and self._process.task is None and self.pid not in self._kernel._procs

    async def wait(self, timeout: float | None = None) -> Any:
        """The program's return value. Raises ProcessFailed (BudgetExceeded for a budget stop)
        when it raised or was killed. For a process that runs elsewhere, its end is read from the
        store (every ``STORE_POLL`` seconds)."""
        process = self._process
        async with fail_after(timeout):
            if self.elsewhere:
                await self._kernel._ended_in_store(process)
            else:
                await shielded(process.finished)
        record = process.record
        if record.status is ProcessStatus.EXITED:
            return process.value if process.ran_here else record.result
        cls = BudgetExceeded if record.stop_reason and record.stop_reason.value.startswith("budget_") else ProcessFailed
        raise cls(self.pid, record.status.value, record.stop_reason, record.error)

    async def pause(self) -> None:
        """Ask the process to pause; it does so at its next syscall boundary."""
        self._here("pause")
        await self._process.pause()

    async def resume(self) -> None:
        self._here("resume")
        await self._process.resume()

    async def kill(self) -> None:
        """Stop the process (and its live children) now, even mid-syscall; waits until recorded."""
        self._here("kill")
        await self._kernel._kill(self._process)

    async def send(self, message: JSON, *, priority: int = DEFAULT_PRIORITY) -> None:
        """Put a message in the process's mailbox (lower priority numbers are received first),
        wherever it runs (``Kernel.send``)."""
        if self.elsewhere:
            await self._kernel.send(self.pid, message, priority=priority)
            return
        self._kernel._check_message(self.pid, message, priority)
        await self._kernel._deliver(self.pid, message, priority, sender=None)

    def _here(self, what: str) -> None:
        if self.elsewhere:
            raise ProcessStateError(f"cannot {what} pid {self.pid} from here: no kernel of this OS process runs it "
                                    f"(ringzero top --db ... does it in whichever kernel does; ringzero resume or "
                                    f"serve runs it if none does)")


class Kernel:
    """Agents as processes: pid, lifecycle, budgets, mailboxes, syscalls, durable execution.

    The public surface is what users call: ``spawn``, ``recover``, ``get``/``handle``, ``ps``,
    ``kill``, ``subscribe``, ``gate``, ``start``/``aclose``. The methods with a leading
    underscore that ``Context`` and ``Process`` call (``_spawn_process``, ``_deliver``,
    ``_adopt``, ``_emit``, ``_child_finished``, ``_retire``, ``_check_program``,
    ``_check_message``) are the kernel's side of the syscalls: internal to ``ringzero.core``,
    free to change, and not for programs or frameworks to call.
    """

    def __init__(
        self,
        *,
        llm: LLMProvider | LLMGate | Mapping[str, LLMProvider | LLMGate] | None = None,
        executor: Executor | str | None = None,
        checkpointer: Checkpointer | str | Path | None = None,
        scheduler: Scheduler | None = None,
        tools: Mapping[str, Tool] | None = None,
        max_running: int | None = None,
        state_dir: str | Path = ".ringzero",
        tracer_provider: Any = None,
        meter_provider: Any = None,
        capture_content: bool | None = None,
        monitor_interval: float | None = 1.0,
    ) -> None:
        backends = defaults()  # what stands behind a protocol the caller left out or named
        if checkpointer is None or isinstance(checkpointer, (str, Path)):
            checkpointer = backends.checkpointer(checkpointer, Path(state_dir))
        if executor is None or isinstance(executor, str):
            executor = backends.executor(executor)
        _require(checkpointer, Checkpointer, "checkpointer", "e.g. SqliteCheckpointer('state.db'), or a path")
        _require(executor, Executor, "executor", "e.g. MontyExecutor() or ProcessExecutor(), or 'monty'/'process'")
        if scheduler is not None:
            _require(scheduler, Scheduler, "scheduler", "e.g. LocalScheduler()")
        if tools is not None and (not isinstance(tools, Mapping) or not all(
                isinstance(k, str) and callable(v) for k, v in tools.items())):
            raise InvalidArgument(f"tools maps names to functions, e.g. {{'search': search}}, not {tools!r:.80}")
        if monitor_interval is not None and (isinstance(monitor_interval, bool) or not isinstance(
                monitor_interval, (int, float)) or not 0 < monitor_interval < float("inf")):
            raise InvalidArgument(f"monitor_interval is a positive number of seconds, or None for no activity rows, "
                                  f"not {monitor_interval!r}")
        if max_running is not None and (isinstance(max_running, bool) or not isinstance(max_running, int)
                                        or max_running < 1):
            raise InvalidArgument(f"max_running is a whole number of processes, at least 1, not {max_running!r}")
        if scheduler is None:
            scheduler = backends.scheduler(max_running)
        elif max_running is not None:
            raise InvalidArgument("pass max_running to your scheduler, not to Kernel, when you give one")
        self.checkpointer: Checkpointer = checkpointer
        self.executor: Executor = executor
        self.scheduler = scheduler
        self.store = KernelStore(checkpointer)
        self.memory = MemoryStore(checkpointer)
        """Long-term memory (``ctx.memory``); set ``kernel.memory.embed`` to search by embeddings."""
        self.tools: dict[str, Tool] = dict(tools or {})
        self._gates = _gates(llm)
        self._procs: dict[int, Process] = {}
        """Live processes. One that ends leaves this table for ``_ended``, where it stays only
        while something holds it (a handle, its parent), so memory does not grow with the
        number of processes a long-lived kernel has run."""
        self._ended: weakref.WeakValueDictionary[int, Process] = weakref.WeakValueDictionary()
        self._listeners: list[Callable[[Event], None]] = []
        self._unsaved: dict[int, Process] = {}
        """Processes with transitions not yet written (``Process._set``)."""
        self._saving: asyncio.Task[None] | None = None
        self._next_pid = 0
        self._pid_block: list[int] | None = None
        """[next, last] of the pid block this kernel claimed (see ``_pid_from_block``)."""
        self._pid_waiters: collections.deque[asyncio.Future[int]] = collections.deque()
        """Spawns waiting for a pid while a block is claimed, in the order they asked."""
        self._pid_handout: asyncio.Task[None] | None = None
        """The task that claims blocks and hands their pids to ``_pid_waiters`` (``_hand_out_pids``)."""
        self._held_pid_blocks: list[int] = []
        """Blocks a kernel on one machine claimed, handed back when it closes (``_release_pid_blocks``)."""
        self.placement: Placement | None = scheduler if scheduler.capabilities.distributed else None  # type: ignore[assignment]
        """Where new top-level processes go when the scheduler spans machines (see ``ringzero.core.remote``)."""
        if scheduler.capabilities.distributed and not isinstance(scheduler, Placement):
            raise InvalidArgument(f"{type(scheduler).__name__} says it is distributed but has no place()/owner_of()")
        if self.placement is not None:
            self.placement.attach(self)
        self.node: str | None = None
        """The cluster node this kernel runs on, set by a cluster worker (None on one machine). A
        kernel with a node takes ownership of its processes in the store (a claimed epoch) and
        records their journals only into free slots, so another node can take them over."""
        self.child_placement: ChildPlacement | None = None
        """Where children spawned here may go instead of this kernel: set by a cluster worker whose
        scheduler spreads children over nodes (None: every child runs with its parent)."""
        self._remote_watches: set[asyncio.Task[None]] = set()
        self._children_by_spawn: dict[str, int] = {}
        """Recovered children by ``spawn_id`` (see ``_spawned_before_crash``)."""
        self._loop: asyncio.AbstractEventLoop | None = None
        self._started = False
        self._closed = False
        self._telemetry_from = (tracer_provider, meter_provider, capture_content)
        self.monitor: Monitor | None = None if monitor_interval is None else Monitor(self, float(monitor_interval))
        """What ``ringzero top`` reads and how it controls this kernel's processes from another OS
        process: an activity row a second while processes live, and commands taken from the store
        (``ringzero.core.monitor``). ``monitor_interval=None`` turns it off."""
        self.telemetry: Telemetry | None = None
        """OpenTelemetry spans and metrics (``ringzero.core.telemetry``), set when the kernel
        starts: from ``tracer_provider``/``meter_provider``, else the providers the application
        set globally; None where there are neither (or no ``ringzero[otel]``). Prompts and
        completions go on spans only with ``capture_content=True`` (or
        ``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=true``)."""

    # ------------------------------------------------------------------ lifecycle
    async def __aenter__(self) -> Kernel:
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    async def start(self) -> None:
        """Open the store and continue pid numbering after what it already holds.

        Refused while ringzero imports a module to resume its processes (``ringzero resume``):
        a kernel started then is a script's own, run by the import for want of a main guard."""
        self._check_loop()
        module = importing()
        if module is not None:
            raise unguarded_script(module)
        if not self._started:
            self._started = True
            tracer_provider, meter_provider, capture_content = self._telemetry_from
            self.telemetry = Telemetry.detect(tracer_provider, meter_provider, capture_content,
                                              lambda: Counter(p.status.value for p in self._procs.values()))
            self._next_pid = await self.store.max_pid()
        if self.monitor is not None:
            self.monitor.start()  # again on a new loop, if the kernel moved to one

    def _check_loop(self) -> None:
        """A kernel lives on one event loop: the one it is started on (its processes are tasks
        there). Another loop gets a named error instead of a hang."""
        running = asyncio.get_running_loop()
        if self._loop is None or self._loop.is_closed():
            self._loop = running
        elif self._loop is not running:
            raise WrongEventLoop("this kernel runs on the event loop it was started on; call it there (from "
                                 "another thread, asyncio.run_coroutine_threadsafe(..., loop) reaches it)")

    async def aclose(self) -> None:
        """Stop running processes as a host shutdown would (``recover()`` resumes them), then
        close the executor, the checkpointer and the gates (the kernel owns what it was given:
        a later use of them raises ``Closed``)."""
        if self._closed:
            return
        self._closed = True
        for watch in list(self._remote_watches):
            watch.cancel()
        running = {p.task: p for p in self._procs.values() if p.task is not None and not p.task.done()}
        # Cancelled again while it runs on, as a kill is (Process.request_stop): not while it
        # records its end.
        await cancel_and_wait(running, again=lambda task: not running[task].finishing)
        await self.flush()  # the transitions processes made before they were stopped
        if self.monitor is not None:
            await self.monitor.aclose()
        for process in list(self._procs.values()):
            # Retrieved (``Process.settle``), so that nobody is warned of it: a process stopped by the
            # shutdown (even one cut off while recording its end) is resumed by recover() later.
            process.settle(ProcessStateError(f"pid {process.pid}: the kernel shut down"))
        if self.placement is not None:
            await self.placement.aclose()
        await self.executor.aclose()
        await self._release_pid_blocks()
        await self.checkpointer.aclose()
        for gate in self._gates.values():  # HTTP providers close their connections
            await gate.aclose()

    def _save_soon(self, process: Process) -> None:
        """Write ``process``'s new transitions together with those every other process makes in
        this turn of the loop: one task, started now, writes them a turn after this one. The
        turn between lets a process that ends meanwhile write them with its end (a woken process
        that records its ``recv`` and returns writes 5 rows, not 7: no row for ready and running
        of its own)."""
        self._unsaved[process.pid] = process
        if self._saving is None:
            self._saving = asyncio.get_running_loop().create_task(self._save_unsaved())

    async def _save_unsaved(self) -> None:
        """Up to ``_SAVERS`` writers at once, so that a store that groups concurrent writes (SQLite,
        PostgreSQL's pool) gets them together, without a task per process. Where the store
        writes many rows in one step (``put_many``, ``append``), each writer takes up to
        ``_SAVED_TOGETHER`` processes at a time, their rows in one write."""
        capabilities = self.checkpointer.capabilities
        together = _SAVED_TOGETHER if capabilities.put_many or capabilities.append else 1

        async def saver() -> None:
            while batch:
                try:
                    if together == 1:
                        await batch.popleft().save_transitions()
                    else:
                        await Process.save_transitions_of([batch.popleft() for _ in range(min(together, len(batch)))])
                except Exception:  # a store that fails here fails again, with its error, at the end
                    continue

        try:
            await asyncio.sleep(0)  # the turn between (see _save_soon)
            while self._unsaved:
                batch = deque(self._unsaved.values())
                self._unsaved.clear()
                writers = min(_SAVERS, -(-len(batch) // together))
                if writers == 1:
                    await saver()
                else:
                    await asyncio.gather(*(saver() for _ in range(writers)))
        finally:
            self._saving = None

    async def flush(self) -> None:
        """Wait until every lifecycle transition made so far is in the store (each process's end
        is written before its ``wait`` returns; the transitions on the way, a moment later)."""
        while self._saving is not None:
            await shielded(self._saving)

    def subscribe(self, listener: Callable[[Event], None]) -> Callable[[], None]:
        """Call ``listener`` for every event; returns a function that unsubscribes it."""
        self._listeners.append(listener)
        return lambda: self._listeners.remove(listener)

    def _emit(self, kind: str, pid: int, data: Mapping[str, JSON]) -> None:
        if not self._listeners:
            return  # the common case, at every transition
        event = Event(kind, pid, data, time.time())
        for listener in list(self._listeners):
            listener(event)

    def gate(self, name: str = "default") -> LLMGate:
        """The LLM gate of provider ``name``."""
        if name not in self._gates:
            configured = ", ".join(sorted(self._gates)) or "none"
            raise NoProvider(f"no LLM provider named {name!r} (configured: {configured}); pass llm= to Kernel")
        return self._gates[name]

    # ------------------------------------------------------------------ processes
    async def spawn(
        self,
        program: Program,
        *args: JSON,
        name: str | None = None,
        priority: int = DEFAULT_PRIORITY,
        limits: Limits | None = None,
        parent: int | None = None,
        resources: Mapping[str, float] | None = None,
    ) -> ProcessHandle | RemoteProcessHandle:
        """Start ``program(ctx, *args)`` as a new process and return its handle at once.

        With a distributed scheduler a top-level process is placed on a machine that has
        ``resources`` free (Ray's names: ``{"CPU": 1}``, ``{"sandbox": 1}``) and the handle
        reaches it there; ``program`` must then be importable (``module:qualname``)."""
        self._check_loop()
        self._check_program(program, args)
        if resources is not None and (self.placement is None or parent is not None):
            raise InvalidArgument("resources= places a top-level process on a cluster node; it needs a distributed "
                                  "scheduler (RayScheduler) and no parent")
        if parent is None and self.placement is not None:
            return await self._place(program, args, name=name, priority=priority, limits=limits,
                                     resources=resources or {})
        if parent is None:
            process = await self._spawn_process(program, args, name=name, priority=priority, limits=limits, parent=None)
            return ProcessHandle(self, process)
        owner = self._process(parent)
        if owner.status.terminal:
            raise ProcessStateError(f"pid {parent} has {owner.status.value}; it cannot have new children")
        child_limits = owner.meter.carve(limits)  # as ctx.spawn does: a slice of the parent's budget
        process = await self._spawn_process(program, args, name=name, priority=priority, limits=child_limits,
                                            parent=parent)
        return ProcessHandle(self, process)

    async def _place(self, program: Program, args: Sequence[JSON], *, name: str | None, priority: int,
                     limits: Limits | None, resources: Mapping[str, float]) -> RemoteProcessHandle:
        assert self.placement is not None
        if isinstance(priority, bool) or not isinstance(priority, int) or priority < 0:
            raise InvalidArgument(f"priority must be a non-negative integer (0 is most urgent), got {priority!r}")
        if limits is not None and not isinstance(limits, Limits):
            raise InvalidArgument(f"limits must be a ringzero.Limits, not {type(limits).__name__}")
        reference = importable_reference(program)
        if reference is None or _resolve_reference(reference) is not program:
            raise InvalidArgument(f"a process placed on another machine is started by reference, and "
                                  f"{reference_of(program)!r} does not import back to it: define it at the top "
                                  "level of an importable module (not in __main__ or a function)")
        for key, amount in resources.items():
            if not isinstance(key, str) or isinstance(amount, bool) or not isinstance(amount, (int, float)) \
                    or not amount >= 0:
                raise InvalidArgument(f"resources maps names to non-negative amounts, got {key!r}: {amount!r}")
        request = SpawnRequest(program=reference, args=list(args), name=name or program.__name__,
                               priority=priority, limits=limits or _NO_LIMITS, resources=dict(resources))
        return await self.placement.place(request)

    def _check_program(self, program: Any, args: Sequence[Any]) -> None:
        if not inspect.iscoroutinefunction(program):
            raise NotAProgram(
                f"a program must be an 'async def' function taking a Context first, not {program!r}"
            )
        ensure_json(list(args), f"the arguments of {getattr(program, '__qualname__', program)}")

    async def _spawn_process(
        self,
        program: Program,
        args: Sequence[JSON],
        *,
        name: str | None,
        priority: int,
        limits: Limits | None,
        parent: int | None,
        remote_parent: int | None = None,
        spawn_id: str | None = None,
    ) -> Process:
        """``remote_parent``: the pid of a parent on another cluster node, recorded as the parent
        (whose kernel holds the budget reservation and waits for the end) with no local owner."""
        if self._closed:
            raise ProcessStateError("this kernel is closed")
        if isinstance(priority, bool) or not isinstance(priority, int) or priority < 0:
            raise InvalidArgument(f"priority must be a non-negative integer (0 is most urgent), got {priority!r}")
        if limits is not None and not isinstance(limits, Limits):
            raise InvalidArgument(f"limits must be a ringzero.Limits, not {type(limits).__name__}")
        if name is not None and not isinstance(name, str):
            raise InvalidArgument(f"a process name is a string, not {type(name).__name__} {name!r}")
        reference = _recorded_reference(program)
        owner = None if parent is None else self._process(parent)
        await self.start()
        capabilities = self.checkpointer.capabilities
        # Where the pid comes from a block this kernel holds, it is taken before anything is
        # written, in the caller's task: a spawn that waits for the next block (10,000 spawned
        # at once wait for ten) and is cancelled meanwhile leaves nothing behind, and the
        # creation below runs through without a task of its own.
        pid = await self._pid_from_block(reuse=True) if self.node is None and capabilities.claims \
            and capabilities.append else 0
        record = ProcessRecord(
            pid=pid, name=name or program.__name__, program=reference,
            args=tuple(args), priority=priority, limits=limits or _NO_LIMITS,
            parent=parent if remote_parent is None else remote_parent, spawn_id=spawn_id,
        )
        # A kill of the parent cannot cut the child's creation short: it starts in this turn
        # (nothing interrupts that), and where it waits (a claim over the network: PostgreSQL, a
        # cluster node's pid block) it goes on in a task of its own, in the parent's
        # ``spawning`` before this call awaits anything. Once its record is written it is in the
        # table and in its parent's children, or stopped at once if the parent was killed
        # meanwhile. Never a half-made child that runs on unseen, or a record that recover()
        # would bring back to life. Where the store writes the record at once (SQLite's log, the
        # in-memory store), the spawn returns in this turn: no task, no turn of the loop.
        creation = started_eagerly(self._create(record, program, owner))
        if creation.done():
            return creation.result()
        creation.add_done_callback(_retrieved)  # its caller may be gone (killed) when it fails
        if owner is not None:
            if owner.spawning is None:
                owner.spawning = set()
            owner.spawning.add(creation)
            creation.add_done_callback(owner.spawning.discard)
        return await shielded(creation)

    async def _create(self, record: ProcessRecord, program: Program, owner: Process | None) -> Process:
        await self._write_new(record)
        ownership = None if self.node is None else (1, self.node)
        if ownership is not None and not await self.store.claim_owner(record.pid, *ownership):
            raise ProcessStateError(f"pid {record.pid} was taken by another node as it was created")
        process = Process(self, record, program, Journal(self.store, record.pid, owner=ownership))
        self._procs[record.pid] = process
        if owner is not None:
            owner.children[record.pid] = record.limits
            owner.keep_child(process)
            if owner.record.stop_reason is StopReason.KILLED:
                process.request_stop(StopReason.KILLED)
        process.start()
        return process

    async def _write_new(self, record: ProcessRecord) -> None:
        """Give ``record`` the next free pid and write it. Where the store can claim an address
        atomically, a pid another kernel on the same store took meanwhile is skipped.

        Where the store also appends (``capabilities.append``: SQLite), the pid comes from a
        block this kernel claimed (``_spawn_process`` takes it, before the creation starts), and
        the record is appended: a spawn is one ``write()`` into the store's log, not a commit (a
        claim each cost a commit of its own, 100 to 200 µs on the project's machine; 10,000
        processes spawned one after another)."""
        if self.node is not None:
            await self._write_new_in_block(record)
            return
        capabilities = self.checkpointer.capabilities
        if capabilities.claims and capabilities.append:
            if not record.pid:
                record.pid = await self._pid_from_block(reuse=True)
            await self.store.append_process(record)
            return
        while True:
            self._next_pid += 1
            record.pid = self._next_pid
            if not self.checkpointer.capabilities.claims:
                await self.store.create_process(record)
                return
            if await self.store.claim_process(record):
                return
            self._next_pid = max(self._next_pid, await self.store.max_pid())

    async def _write_new_in_block(self, record: ProcessRecord) -> None:
        """A cluster node's pids: from a block of ``PID_BLOCK`` it claimed in the store, so that
        nodes spawning at once do not all race for the same next pid (each pid is still claimed)."""
        while True:
            record.pid = await self._pid_from_block(reuse=False)
            if await self.store.claim_process(record):
                return

    async def _pid_from_block(self, *, reuse: bool) -> int:
        """The next pid of the block of ``PID_BLOCK`` pids this kernel claimed in the store
        (``claim_pid_block``: of kernels racing for a block, one gets it), claiming the next
        free block when this one is used up.

        ``reuse`` (a kernel on one machine): the block holding the store's highest pid is taken
        where it is free, and numbering goes on after that pid, so that pids stay dense from one
        kernel to the next on the same file: a kernel hands its blocks back as it closes
        (``_release_pid_blocks``; one that crashed leaves its block taken, and the next kernel
        starts at the next block). The block's highest pid is read again once the block is
        ours: a kernel that held it before wrote every pid it used before handing it back. Without
        ``reuse`` (a cluster node) every block is a fresh one past the highest pid."""
        block = self._pid_block
        if block is not None and block[0] <= block[1] and not self._pid_waiters:
            pid = block[0]
            block[0] += 1
            return pid
        if self._closed:  # no block claimed after the kernel handed its blocks back
            raise ProcessStateError("this kernel is closed")
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[int] = loop.create_future()
        self._pid_waiters.append(waiter)
        if self._pid_handout is None:
            self._pid_handout = loop.create_task(self._hand_out_pids(reuse))
            self._pid_handout.add_done_callback(_retrieved)
        return await waiter

    async def _hand_out_pids(self, reuse: bool) -> None:
        """Claim blocks while spawns wait for a pid, giving each its pid in the order they asked.
        (Behind an asyncio.Lock they went on one a turn of the loop: 10,000 spawned at once took
        some 4,000 turns instead of 90; woken all at once for each block, each waited again for
        the next one, 65,000 wake-ups more.)"""
        waiters = self._pid_waiters
        try:
            while waiters:
                block = self._pid_block
                if block is None or block[0] > block[1]:
                    block = self._pid_block = await self._claim_pid_block(reuse)
                while waiters and block[0] <= block[1]:
                    waiter = waiters.popleft()
                    if not waiter.done():  # a spawn cancelled meanwhile takes no pid
                        waiter.set_result(block[0])
                        block[0] += 1
        except BaseException as exc:
            while waiters:
                waiter = waiters.popleft()
                if waiter.done():
                    continue
                if isinstance(exc, asyncio.CancelledError):
                    waiter.cancel()
                else:
                    waiter.set_exception(exc)
            raise
        finally:
            self._pid_handout = None

    async def _claim_pid_block(self, reuse: bool) -> list[int]:
        top = await self.store.max_pid()
        block = (top + 1) // PID_BLOCK if reuse else top // PID_BLOCK + 1
        owner = self.node or (self.monitor.id if self.monitor is not None else f"{socket.gethostname()}:{os.getpid()}")
        while True:
            if await self.store.claim_pid_block(block, owner):
                if not reuse:
                    return [block * PID_BLOCK, (block + 1) * PID_BLOCK - 1]
                self._held_pid_blocks.append(block)
                end = (block + 1) * PID_BLOCK
                first = max(block * PID_BLOCK, await self.store.max_pid(below=end) + 1, 1)
                if first < end:
                    return [first, end - 1]
            block += 1

    async def _release_pid_blocks(self) -> None:
        """Hand back the pid blocks this kernel holds (after every record it wrote: the store's
        delete comes after its appends), so that the next kernel on the file numbers on from
        this one's last pid. Where that fails, the next kernel starts at a fresh block."""
        blocks, self._held_pid_blocks = self._held_pid_blocks, []
        self._pid_block = None
        if blocks and self.checkpointer.capabilities.delete_checkpoints:
            with contextlib.suppress(RingzeroError):
                await self.store.release_pid_blocks(blocks)

    def _process(self, pid: int) -> Process:
        if isinstance(pid, bool) or not isinstance(pid, int):
            raise InvalidArgument(f"a pid is an integer, not {pid!r}")
        process = self._procs.get(pid) or self._ended.get(pid)
        if process is None:
            raise ProcessNotFound(pid)
        return process

    def _retire(self, process: Process) -> None:
        """A process has ended: it leaves the live table (see ``_procs``)."""
        if self._procs.get(process.pid) is process:
            del self._procs[process.pid]
            self._ended[process.pid] = process
            for gate in self._gates.values():
                gate.forget(process.pid)

    def get(self, pid: int) -> ProcessHandle:
        """The handle of a process this kernel runs, or ran and something still holds (a
        handle, its parent). Raises ProcessNotFound; ``ps(all=True)`` reads every record."""
        return ProcessHandle(self, self._process(pid))

    async def handle(self, pid: int) -> ProcessHandle:
        """Like ``get``, but a process this kernel does not hold is read from the store: one that
        ended, or one that runs elsewhere or waits there for a resume (its handle reads its
        state from the store, sends through ``send`` and waits for its end in the store)."""
        try:
            return self.get(pid)
        except ProcessNotFound:
            record = await self.store.load_process(pid)
            if record is None:
                raise
            if not record.status.terminal:
                return ProcessHandle(self, Process(self, record, _missing_program, Journal(self.store, pid)))
            return ProcessHandle(self, self._ended_process(record))

    async def _ended_in_store(self, process: Process) -> None:
        """Wait until the store records the end of ``process``, which runs elsewhere; its record
        is then the stored one."""
        while True:
            record = await self.store.load_process(process.pid)
            if record is not None:
                process.record = record
                if record.status.terminal:
                    return
            await asyncio.sleep(STORE_POLL)

    async def remote(self, pid: int) -> RemoteProcessHandle:
        """The handle of a process the distributed scheduler placed on another machine."""
        if self.placement is None:
            raise InvalidArgument("remote() needs a distributed scheduler (RayScheduler)")
        if isinstance(pid, bool) or not isinstance(pid, int):
            raise InvalidArgument(f"a pid is an integer, not {pid!r}")
        return await RemoteProcessHandle(self.placement, {"pid": pid, "name": "", "status": "created",
                                                          "program": ""}).refresh()

    def _ended_process(self, record: ProcessRecord) -> Process:
        ended = Process(self, record, _missing_program, Journal(self.store, record.pid))
        ended.settle()
        self._ended[record.pid] = ended
        return ended

    async def ps(self, *, all: bool = False) -> list[ProcessInfo]:
        """This kernel's live processes, and ended ones something still holds, by pid; with
        ``all``, every process the store knows."""
        held = dict(self._ended.items())  # items() iterates safely while the collector runs
        held.update(self._procs)
        for process in held.values():
            process.snapshot()
        rows = {pid: ProcessInfo.of(p.record) for pid, p in held.items()}
        if all:
            for record in await self.store.load_processes():
                rows.setdefault(record.pid, ProcessInfo.of(record))
        return [rows[pid] for pid in sorted(rows)]

    async def kill(self, pid: int) -> None:
        """Stop process ``pid`` and its live children; waits until each end is recorded."""
        await self._kill(self._process(pid))

    async def _kill(self, process: Process) -> None:
        if not process.status.terminal:
            process.request_stop(StopReason.KILLED)  # first: from now on no child of it runs
        while process.spawning:  # children being created land (and stop) before we walk them
            await asyncio.gather(*process.spawning, return_exceptions=True)
        for child_pid in list(process.children):
            if child_pid in self._procs:
                await self._kill(self._procs[child_pid])
        for remote in list(process.remote_children.values()):
            # On its node; a child that has ended is left as it is, and one whose node is gone with
            # nobody to take it over (ProcessNotFound) has nothing left to stop.
            with contextlib.suppress(ProcessNotFound):
                await remote.kill()
        if not process.over and process.task is not None:
            await shielded(process.finished)

    def idle_for_outside(self) -> dict[int, str]:
        """Where every live process waits for something only the outside world can give, what
        each waits for (``"message"``: a recv without a timeout, its mailbox empty; ``"resume"``:
        paused; ``"child"``: a wait for a child that itself waits so); else an empty dict. Such
        a kernel makes no more progress by itself: ``ringzero resume`` ends there, leaving them
        durable in the store, and ``ringzero serve`` lets them go until something arrives."""
        waits: dict[int, str] = {}
        for pid, process in self._procs.items():
            current = process.in_syscall
            if process.record.paused and process.status is ProcessStatus.PAUSED:
                waits[pid] = "resume"
            elif process.status is ProcessStatus.WAITING and current is not None and current[0] == "recv" \
                    and not current[1] and not len(process.mailbox):
                waits[pid] = "message"
            elif process.status is ProcessStatus.WAITING and current is not None and current[0] == "wait":
                waits[pid] = "child"
            else:
                return {}
        return waits

    # ------------------------------------------------------------------ messages
    def _check_message(self, pid: int, message: JSON, priority: int) -> None:
        size = json_size(message, f"a message to pid {pid}")
        if size > MAX_MESSAGE_BYTES:
            raise InvalidArgument(f"a message to pid {pid} is {size:,} bytes of JSON, over the {MAX_MESSAGE_BYTES:,} a "
                                  "mailbox takes: send a reference to the data (a file, a memory key) instead")
        if isinstance(priority, bool) or not isinstance(priority, int) or priority < 0:
            raise InvalidArgument(f"message priority must be a non-negative integer, got {priority!r}")
        if isinstance(pid, bool) or not isinstance(pid, int):
            raise InvalidArgument(f"a pid is an integer, not {pid!r}")

    async def send(self, pid: int, message: JSON, *, priority: int = DEFAULT_PRIORITY) -> None:
        """Put ``message`` in the mailbox of process ``pid``, wherever it is: run by this kernel,
        by a kernel in another OS process or on another node on this store (which delivers it
        within a second of its next monitor tick), or in no host at all (a process waiting in the
        store after a crash, or between the wake-ups of ``ringzero serve``), where the message is
        stored and the process gets it when it is next resumed. Durable when this returns.

        Raises ProcessNotFound for a pid the store does not know and ProcessStateError for one
        that has ended."""
        self._check_message(pid, message, priority)
        await self.start()
        if pid in self._procs:
            await self._deliver(pid, message, priority, sender=None)
            return
        record = await self.store.load_process(pid)
        if record is None:
            raise ProcessNotFound(pid)
        if record.status.terminal:
            raise ProcessStateError(f"pid {pid} has {record.status.value}; it receives no messages")
        from ringzero.core.monitor import deliver_elsewhere

        await deliver_elsewhere(self, pid, message, priority)

    async def _deliver(self, pid: int, message: JSON, priority: int, sender: int | None, *,
                       mail_id: str | None = None, maybe_delivered: bool = False) -> None:
        """Store the message durably, then put it in the live mailbox. ``maybe_delivered``: a
        resumed sender's live send, which its host may have delivered before it died without
        journaling it; a mail with the same ``mail_id`` in the target's mailbox means it was."""
        if maybe_delivered and mail_id is not None and any(
                body.get("id") == mail_id for _, body in await self.store.mail(pid)):
            return
        target = self._process(pid)
        if target.status.terminal:
            raise ProcessStateError(f"pid {pid} has {target.status.value}; it receives no messages")
        seq = target.next_mail_seq()
        await self.store.append_mail(pid, seq, priority, message, sender, mail_id)
        target.mailbox.put(Mail(priority, seq, message, sender))

    # ------------------------------------------------------------------ budgets
    async def _adopt(self, parent: Process, child_pid: int, child_limits: Limits) -> None:
        """Attach a child's reservation to its parent; settle at once if the child is done."""
        parent.children[child_pid] = child_limits
        child = self._procs.get(child_pid)
        record = child.record if child is not None else await self.store.load_process(child_pid)
        if record is not None and record.status.terminal and child_pid in parent.children:
            from ringzero.core.budget import Spend

            parent.meter.settle(parent.children.pop(child_pid), Spend.from_dict(record.spent))

    def _adopt_remote_child(self, parent: Process, child: RemoteProcessHandle, child_limits: Limits) -> None:
        """A child on another node: its reservation is held here and settled, with what it
        spent, when it ends there (a watch on its node follows it if it moves)."""
        parent.children[child.pid] = child_limits
        parent.remote_children[child.pid] = child

        async def settle_at_end() -> None:
            self._settle_remote_child(parent, child.pid, await child.ended())

        watch = asyncio.ensure_future(settle_at_end())
        self._remote_watches.add(watch)
        watch.add_done_callback(self._remote_watches.discard)
        watch.add_done_callback(_retrieved)

    @staticmethod
    def _settle_remote_child(parent: Process, pid: int, ended: Mapping[str, Any]) -> None:
        """Refund ``parent`` what its remote child ``pid`` did not spend (once: by whichever of
        the watch and ``ctx.wait`` sees the end first)."""
        from ringzero.core.budget import Spend

        if pid in parent.children:
            parent.meter.settle(parent.children.pop(pid), Spend.from_dict(ended.get("spent") or {}))

    async def _any_handle(self, pid: int) -> ProcessHandle | RemoteProcessHandle:
        """The handle of ``pid``, here or (on a cluster node) on another node."""
        try:
            return await self.handle(pid)
        except ProcessNotFound:
            if self.child_placement is None:
                raise
            return await RemoteProcessHandle(self.child_placement, {"pid": pid, "name": "", "status": "created",
                                                                    "program": ""}).refresh()

    def _child_finished(self, child: Process) -> None:
        parent = self._procs.get(child.record.parent) if child.record.parent is not None else None
        self._retire(child)
        if parent is not None and child.pid in parent.children:
            parent.meter.settle(parent.children.pop(child.pid), child.meter.spent)

    # ------------------------------------------------------------------ recovery
    async def recover(
        self, programs: Mapping[str, Program] | None = None, *, pids: Collection[int] | None = None,
        from_node: str | None = None,
    ) -> list[ProcessHandle]:
        """Resume every unfinished process in the store that this kernel is not running (only
        those in ``pids`` when given: a cluster node taking over a dead node's processes).

        Each program is imported again by ``module:qualname`` (or looked up in ``programs``
        by that reference or by process name) and re-run; its recorded syscalls are served
        from the journal, so no LLM call or tool run is repeated. Recovery never turns
        recoverable work into a failure: a process whose program cannot be imported, or whose
        next live call needs an LLM provider or tool this kernel was not given, stops without
        ending; its handle's ``wait()`` raises ``NotResumed`` saying what was missing, and a
        later ``recover()`` with what it needs finishes it. The handles returned are those of
        the processes started, then those left unfinished at once. A kernel with a ``node``
        first claims each process's next ownership epoch and leaves the ones another node
        claimed first: of several nodes resuming one process, exactly one runs it. With
        ``from_node`` it takes only processes that node still owns (the failover of a dead node:
        one another survivor took meanwhile is left to it).
        """
        await self.start()
        wanted = None if pids is None else set(pids)
        taken: dict[int, tuple[int, str] | None] = {}
        everything = await self.store.load_processes()
        open_parents = {r.pid for r in everything if not r.status.terminal}
        self._children_by_spawn.update((r.spawn_id, r.pid) for r in everything
                                       if r.spawn_id is not None and r.parent in open_parents)
        for record in everything:
            if record.pid in self._procs or record.status.terminal:
                continue  # an ended one is read from the store if a resumed parent asks for it
            if wanted is not None and record.pid not in wanted:
                continue
            owner = None if self.node is None else await self._take_over(record.pid, from_node)
            if self.node is None or owner is not None:
                taken[record.pid] = owner
        records = []
        if taken and self.node is not None:
            # A process taken from another node starts once that node's ownership lease has run
            # out: if it is alive after all, its next check stops it before this one runs, and
            # what it recorded until then is read below.
            await asyncio.sleep(OWNER_RECHECK)
        if taken:
            # Each starts from the state it was spawned with: its replay rebuilds the rest.
            records = [r for r in await self.store.load_processes(as_spawned=True)
                       if r.pid in taken and not r.status.terminal]
        to_start: list[Process] = []
        unfinished: list[Process] = []
        for record in records:
            program, why = _resolve(record, programs or {})
            start = RunStart.of(record.run_start)  # where its current run began (continue-as-new)
            journal = Journal(self.store, record.pid, start.of_this_run(await self.store.journal(record.pid)),
                              owner=taken[record.pid], base=start.journal_base)
            journal.resumed = True
            process = Process(
                self, record, program or _missing_program, journal,
                transition_seq=await self.store.last_seq(record.pid, "transitions"),
                mail_seq=await self.store.last_seq(record.pid, "mailbox"),
            )
            process.recovered = True
            if start.journal_base:
                process.sends, process.spawns = start.sends, start.spawns
                process.meter.charge(**(start.spent or {}))
            if program is None:  # left as the crash left it, for a resume that can import it
                process.left_unfinished = NotResumed(record.pid, record.name, ProgramNotFound(
                    f"cannot import its program {record.program!r} (pass recover(programs={{...}}), or make it "
                    f"importable from where you resume): {why}"))
                process.end_unfinished()
                unfinished.append(process)
                continue
            self._procs[record.pid] = process
            consumed = {_received_seq(e.outcome) for e in journal.entries
                        if e.kind == "recv" and e.outcome.get("value")}
            for seq, body in await self.store.mail(record.pid):
                if seq not in consumed and not start.received_before(seq):
                    process.mailbox.put(Mail(int(body["priority"]), seq, body["message"], body.get("sender")))
            to_start.append(process)
        for process in to_start:  # only now: a parent's replayed spawn finds every child loaded
            process.start()
        return [ProcessHandle(self, process) for process in [*to_start, *unfinished]]

    def _spawned_before_crash(self, parent: Process, spawn_id: str) -> int | None:
        """The pid of the child a resumed ``parent`` created with this spawn before its host
        died without journaling the spawn: the resumed spawn takes it instead of a second one."""
        if not parent.recovered:
            return None
        return self._children_by_spawn.pop(spawn_id, None)

    async def _take_over(self, pid: int, from_node: str | None) -> tuple[int, str] | None:
        """Claim the next ownership epoch of ``pid`` for this kernel's node: (epoch, node), or
        None when another node claimed it first, or (with ``from_node``) took it from that node."""
        assert self.node is not None
        current = await self.store.owner(pid)
        if from_node is not None and (current is None or current[1] != from_node):
            return None
        epoch = (current[0] if current else 0) + 1
        return (epoch, self.node) if await self.store.claim_owner(pid, epoch, self.node) else None


def _require(value: Any, protocol: type, what: str, example: str) -> None:
    """InvalidArgument unless ``value`` implements ``protocol`` (its methods, checked now rather
    than as an AttributeError at the first call)."""
    if not isinstance(value, protocol):
        raise InvalidArgument(f"{what} must be a ringzero {protocol.__name__} ({example}), not "
                              f"{type(value).__name__} {value!r:.60}")


STORE_POLL = 0.25
"""Seconds between reads of the store while a handle waits for a process that runs elsewhere."""

_WARNED: set[str] = set()


def _recorded_reference(program: Program) -> str:
    """The reference ``program`` is journaled by; a program in a script that no other process
    can import (a REPL, a notebook, ``python -c``) is warned about once: after a crash only
    ``recover(programs={...})`` in a process that defines it again can resume it."""
    reference, importable = program_reference(program)
    if not importable and getattr(program, "__module__", None) == "__main__" and reference not in _WARNED:
        _WARNED.add(reference)
        warnings.warn(f"program {reference!r} is defined where no other Python process can import it; after a "
                      "crash, only recover(programs={...}) in a process that defines it again can resume it "
                      "(define it in a module or a script file for `ringzero resume`)", RuntimeWarning, stacklevel=4)
    return reference


def _resolve_reference(reference: str) -> Any:
    try:
        return import_reference(reference, "the program")
    except InvalidArgument:
        return None


def _retrieved(future: asyncio.Future[Any]) -> None:
    """Mark a background future's exception as seen (whoever awaits it still gets it)."""
    if not future.cancelled():
        future.exception()


def _received_seq(outcome: Mapping[str, Any]) -> int:
    """The mailbox seq a journaled recv consumed."""
    return int(outcome["value"]["seq"])


async def _missing_program(ctx: Any, *args: Any) -> None:  # pragma: no cover - never started
    raise AssertionError("not run")


def _resolve(record: ProcessRecord, programs: Mapping[str, Program]) -> tuple[Program | None, str]:
    """The program of ``record`` (from ``programs``, else imported), or None and why not."""
    if record.program in programs:
        return programs[record.program], ""
    if record.name in programs:
        return programs[record.name], ""
    try:
        target = import_reference(record.program, "the program")
    except InvalidArgument as exc:
        return None, str(exc)
    if not inspect.iscoroutinefunction(target):
        return None, f"{record.program!r} is not an async function"
    return target, ""


def _gates(llm: LLMProvider | LLMGate | Mapping[str, LLMProvider | LLMGate] | None) -> dict[str, LLMGate]:
    if llm is None:
        return {}
    if isinstance(llm, Mapping):
        return {name: _gate(value) for name, value in llm.items()}
    return {"default": _gate(llm)}


def _gate(value: LLMProvider | LLMGate) -> LLMGate:
    if isinstance(value, LLMGate):
        return value
    if not callable(getattr(value, "complete", None)):
        raise InvalidArgument(f"llm must be an LLMProvider (with async complete()) or an LLMGate, not {value!r}")
    return LLMGate(value)
