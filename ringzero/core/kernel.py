"""The Kernel: creates processes, routes their syscalls, and resumes them after a crash.

    async with Kernel(llm=provider) as kernel:
        p = await kernel.spawn(program, "arg", name="miner", priority=5, limits=Limits(tokens=50_000))
        await p.pause(); await p.resume()
        print(await p.wait(), await kernel.ps())

Defaults need no setup: SQLite in ``./.ringzero/state.db``, the local asyncio scheduler, and
the Monty executor (a sandboxed Python subset in worker processes, started on first use).

This module is the users' facade. What processes ask of the kernel lives in the runtime
(``ringzero.core._engine.runtime``), pids in ``pids``, transition writes in ``transitions``, resuming in
``recovery`` and a kernel's part in a cluster in ``cluster``.
"""

from __future__ import annotations

import asyncio
import datetime
import math
import os
import socket
import time
from collections.abc import Callable, Collection, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any

from ringzero.core._engine.cluster import Cluster
from ringzero.core._engine.handles import DEFAULT_PRIORITY, ProcessHandle, handle_of
from ringzero.core._engine.keeper import Keeper
from ringzero.core._engine.monitor import Monitor
from ringzero.core._engine.pids import PidAllocator
from ringzero.core._engine.recovery import fork, recover, retry
from ringzero.core._engine.replay_check import ReplayReport, check_replays, copy_rows
from ringzero.core._engine.runtime import NO_LIMITS, Runtime
from ringzero.core._engine.schedules import Schedule, ScheduleFirer, ScheduleSpec, schedule_spec
from ringzero.core.contract.errors import InvalidArgument, ProcessStateError, WrongEventLoop
from ringzero.core.contract.protocols import Checkpointer, Executor, LLMProvider, Scheduler, Tool, check_backend
from ringzero.core.contract.records import Event, ProcessInfo
from ringzero.core.contract.remote import ChildPlacement, Placement, RemoteProcessHandle
from ringzero.core.contract.store import KernelStore
from ringzero.core.contract.types import JSON, Limits, ProcessStatus, Program
from ringzero.core.support.backends import defaults
from ringzero.core.support.gate import LLMGate
from ringzero.core.support.memory import MemoryStore
from ringzero.core.support.references import check_program, importing, unguarded_script
from ringzero.core.support.telemetry import Telemetry
from ringzero.core.support.timeouts import cancel_and_wait

__all__ = ["Event", "Kernel", "ProcessHandle", "ProcessInfo"]


class Kernel:
    """Agents as processes: pid, lifecycle, budgets, mailboxes, syscalls, durable execution.

    Users call ``spawn``, ``recover``, ``get``/``handle``, ``ps``, ``kill``, ``send``,
    ``subscribe``, ``gate``, ``start``/``aclose``. ``runtime`` is the kernel's side of the
    syscalls (internal to ``ringzero.core`` and cluster schedulers)."""

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
        node: str | None = None,
    ) -> None:
        backends = defaults()  # what stands behind a protocol the caller left out or named
        if checkpointer is None or isinstance(checkpointer, (str, Path)):
            checkpointer = backends.checkpointer(checkpointer, Path(state_dir))
        if executor is None or isinstance(executor, str):
            executor = backends.executor(executor)
        check_backend(executor, Executor, "executor")  # the checkpointer: by KernelStore, below
        if scheduler is not None:
            check_backend(scheduler, Scheduler, "scheduler")
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
        placement: Placement | None = None
        if scheduler.capabilities.distributed:
            if not isinstance(scheduler, Placement):
                raise InvalidArgument(
                    f"{type(scheduler).__name__} says it is distributed but has no place()/owner_of()")
            placement = scheduler
        self.cluster = Cluster(KernelStore(checkpointer), placement=placement, node=node)
        """Where processes go and what this kernel owns in a cluster (``ringzero.core._engine.cluster``)."""
        self.runtime = Runtime(checkpointer=checkpointer, executor=executor, scheduler=scheduler, tools=tools or {},
                               gates=_gates(llm), cluster=self.cluster,
                               telemetry_from=(tracer_provider, meter_provider, capture_content))
        self.store: KernelStore = self.cluster.store
        self.memory: MemoryStore = self.runtime.memory
        """Long-term memory (``ctx.memory``); set ``kernel.memory.embed`` to search by embeddings."""
        self.tools: dict[str, Tool] = self.runtime.tools
        self.monitor: Monitor | None = None if monitor_interval is None else Monitor(self.runtime,
                                                                                    float(monitor_interval))
        """What ``ringzero top`` reads and how it controls this kernel's processes from another OS
        process: an activity row a second while processes live, and commands taken from the store
        (``ringzero.core.support.monitor``). ``monitor_interval=None`` turns it off."""
        if self.monitor is not None:
            self.runtime.monitored_as(self.monitor.id)
        self.keeper: Keeper | None = None
        """What lets waiting processes go, once ``let_go_waiting`` is asked (None before)."""
        self.schedule_firer: ScheduleFirer | None = None
        """What fires the store's schedules, once ``fire_schedules`` is asked (None before)."""
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closed = False
        if placement is not None:
            placement.attach(self)

    @property
    def node(self) -> str | None:
        """The cluster node this kernel runs on (None on one machine). A kernel with a node takes
        ownership of its processes in the store (a claimed epoch) and records their journals only
        into free slots, so another node can take them over."""
        return self.cluster.node

    @property
    def placement(self) -> Placement | None:
        """Where new top-level processes go when the scheduler spans machines."""
        return self.cluster.placement

    @property
    def child_placement(self) -> ChildPlacement | None:
        """Where children spawned here may go instead of this kernel (set by a cluster worker)."""
        return self.cluster.child_placement

    @property
    def telemetry(self) -> Telemetry | None:
        """OpenTelemetry spans and metrics (``ringzero.core.support.telemetry``), set when the kernel
        starts: from ``tracer_provider``/``meter_provider``, else the providers the application
        set globally; None where there are neither (or no ``ringzero[otel]``). Prompts and
        completions go on spans only with ``capture_content=True`` (or
        ``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=true``)."""
        telemetry = self.runtime.telemetry
        return telemetry if isinstance(telemetry, Telemetry) else None

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
        await self.runtime.start()
        if self.monitor is not None:
            self.monitor.start()  # again on a new loop, if the kernel moved to one
        if self.keeper is not None:
            self.keeper.start()
        if self.schedule_firer is not None:
            self.schedule_firer.start()

    def _check_loop(self) -> None:
        """A kernel lives on one event loop: the one it is started on (its processes are tasks
        there). Another loop gets a named error instead of a hang."""
        running = asyncio.get_running_loop()
        if self._loop is None or self._loop.is_closed():
            self._loop = running
        elif self._loop is not running:
            raise WrongEventLoop("this kernel runs on the event loop it was started on; call it there (from "
                                 "another thread, ringzero.core.support.loops.run_on(loop, ...) reaches it)")

    async def aclose(self) -> None:
        """Stop running processes as a host shutdown would (``recover()`` resumes them), then
        close the executor, the checkpointer and the gates (the kernel owns what it was given:
        a later use of them raises ``Closed``)."""
        if self._closed:
            return
        self._closed = True
        self.runtime.close()
        self.cluster.stop_watching()
        if self.schedule_firer is not None:
            await self.schedule_firer.aclose()
        if self.keeper is not None:
            await self.keeper.aclose()  # what it let go stays in the store
        procs = self.runtime.procs
        running = {p.task: p for p in procs.values() if p.task is not None and not p.task.done()}
        # Cancelled again while it runs on, as a kill is (Process.request_stop): not while it
        # records its end.
        await cancel_and_wait(running, again=lambda task: not running[task].finishing)
        await self.flush()  # the transitions processes made before they were stopped
        if self.monitor is not None:
            await self.monitor.aclose()
        for process in list(procs.values()):
            # Retrieved (``Process.settle``), so that nobody is warned of it: a process stopped by the
            # shutdown (even one cut off while recording its end) is resumed by recover() later.
            process.settle(ProcessStateError(f"pid {process.pid}: the kernel shut down"))
        await self.cluster.aclose()
        await self.executor.aclose()
        await self.runtime.pids.release()
        await self.checkpointer.aclose()
        for gate in self.runtime.gates.values():  # HTTP providers close their connections
            await gate.aclose()

    def let_go_waiting(self, after: float = 1.0, programs: Mapping[str, Program] | None = None) -> Keeper:
        """Keep in memory only the processes that run: a top-level process that has waited
        ``after`` seconds for a message or on a timer is let go (no task, nothing replayed held;
        its status row says what it waits on) and brought back, replayed from its journal, when
        a message comes for it (from any OS process on the store) or its timer is due
        (``ringzero.core._engine.keeper``). For a host of many waiting processes, such as
        ``ringzero serve``: a handle taken before its process was let go does not follow it back
        (``Kernel.handle`` gives one that does). ``programs`` as for ``recover``. The monitor
        then ticks every quarter of a second, to take the messages for them from the store."""
        if self.keeper is None:
            if isinstance(after, bool) or not isinstance(after, (int, float)) or not after > 0:
                raise InvalidArgument(f"let_go_waiting takes a positive number of seconds, not {after!r}")
            if self.monitor is None:
                raise InvalidArgument("let_go_waiting needs the kernel's monitor, which takes the messages for the "
                                      "processes let go from the store (monitor_interval=None turns it off)")
            self.keeper = Keeper(self.runtime, float(after), programs)
            if self.monitor is not None:
                self.monitor.wakes_for(self.keeper)
                self.monitor.tick_every(min(self.monitor.interval, 0.25))
            if self.runtime.pids.started:  # started already: it looks from now on
                self.keeper.start()
        return self.keeper

    async def schedule(self, program: Program, *args: JSON, name: str,
                       every: datetime.timedelta | float | None = None, cron: str | None = None,
                       missed: str = "once", start: datetime.datetime | None = None) -> Schedule:
        """Spawn ``program(ctx, *args)`` at each slot of ``every`` (a timedelta, or seconds, from
        ``start``, now by default) or of ``cron`` (an expression croniter reads, in UTC: ``"0 7 *
        * *"`` is 07:00 UTC daily; ``ringzero[cron]``), exactly once per slot, as a top-level
        process named ``name``, by whichever kernel on the store fires schedules
        (``fire_schedules``; ``ringzero serve`` does): see ``ringzero.core._engine.schedules``.
        ``missed``: what a slot that passed while nothing fired becomes: ``"once"`` (one firing
        for all of them, the default), ``"all"`` (each), ``"skip"`` (none). Durable in the store:
        asking again with the same arguments returns the schedule as it is; with others, it
        replaces it (its firings stay)."""
        spec = schedule_spec(program, args, name=name, every=every, cron=cron, missed=missed, start=start)
        await self.start()
        current = await self.store.schedule(name)
        if current is not None:
            held = ScheduleSpec.from_json(current)
            if not held.removed and (held.program, list(held.args), held.every, held.cron, held.missed) == \
                    (spec.program, list(spec.args), spec.every, spec.cron, spec.missed):
                return Schedule(self.runtime, held)
        await self.store.put_schedule(name, spec.to_json())
        return Schedule(self.runtime, spec)

    async def schedules(self) -> list[Schedule]:
        """The store's schedules (not those removed)."""
        await self.start()
        return [Schedule(self.runtime, spec) for spec in map(ScheduleSpec.from_json, await self.store.schedules())
                if not spec.removed]

    def fire_schedules(self, programs: Mapping[str, Program] | None = None) -> ScheduleFirer:
        """Fire the store's schedules from this kernel (at least once a second it looks at them),
        with any other kernels on the store that do: each slot is fired by one of them
        (``ringzero.core._engine.schedules``). ``programs`` as for ``recover``."""
        if self.schedule_firer is None:
            host = self.monitor.id if self.monitor is not None else f"{socket.gethostname()}:{os.getpid()}"
            self.schedule_firer = ScheduleFirer(self.runtime, host, programs)
            if self.runtime.pids.started:
                self.schedule_firer.start()
        return self.schedule_firer

    @property
    def hosting(self) -> int:
        """The unfinished processes this kernel hosts: those in memory, and those it let go
        (``let_go_waiting``)."""
        return len(self.runtime.procs) + (0 if self.keeper is None else self.keeper.holding)

    def join_cluster(self, node: str) -> None:
        """Make this kernel cluster node ``node``'s (a cluster worker calls it on the kernel its
        factory built, before the kernel starts): see ``node``."""
        if self.runtime.pids.started:
            raise ProcessStateError("a kernel joins a cluster before it starts")
        self.cluster = Cluster(self.store, placement=self.cluster.placement, node=node)
        self.runtime.join_cluster(self.cluster, PidAllocator(self.store, node=node, owner=lambda: node))

    def place_children(self, placement: ChildPlacement | None) -> None:
        """Let children spawned here go to other nodes (``placement``), or keep them here (None)."""
        self.cluster.place_children(placement)

    async def flush(self) -> None:
        """Wait until every lifecycle transition made so far is in the store (each process's end
        is written before its ``wait`` returns; the transitions on the way, a moment later)."""
        await self.runtime.flush()

    def subscribe(self, listener: Callable[[Event], None]) -> Callable[[], None]:
        """Call ``listener`` for every event; returns a function that unsubscribes it."""
        listeners = self.runtime.listeners
        listeners.append(listener)
        return lambda: listeners.remove(listener)

    def gate(self, name: str = "default") -> LLMGate:
        """The LLM gate of provider ``name``."""
        return self.runtime.gate(name)

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
        runtime = self.runtime
        check_program(program, args)
        if resources is not None and (self.placement is None or parent is not None):
            raise InvalidArgument("resources= places a top-level process on a cluster node; it needs a distributed "
                                  "scheduler (RayScheduler) and no parent")
        if parent is None and self.placement is not None:
            if isinstance(priority, bool) or not isinstance(priority, int) or priority < 0:
                raise InvalidArgument(f"priority must be a non-negative integer (0 is most urgent), got {priority!r}")
            if limits is not None and not isinstance(limits, Limits):
                raise InvalidArgument(f"limits must be a ringzero.Limits, not {type(limits).__name__}")
            return await self.cluster.place(program, args, name=name, priority=priority, limits=limits or NO_LIMITS,
                                            resources=resources or {})
        child_limits = limits
        if parent is not None:
            owner = runtime.process(parent)
            if owner.status.terminal:
                raise ProcessStateError(f"pid {parent} has {owner.status.value}; it cannot have new children")
            child_limits = owner.meter.carve(limits)  # as ctx.spawn does: a slice of the parent's budget
        await self.start()  # its store open, its monitor ticking (and refused inside an import: see start)
        process = await runtime.spawn_process(program, args, name=name, priority=priority, limits=child_limits,
                                              parent=parent)
        return ProcessHandle(runtime, process)

    def get(self, pid: int) -> ProcessHandle:
        """The handle of a process this kernel runs, or ran and something still holds (a
        handle, its parent). Raises ProcessNotFound; ``ps(all=True)`` reads every record."""
        return self.runtime.get(pid)

    async def handle(self, pid: int) -> ProcessHandle:
        """Like ``get``, but a process this kernel does not hold is read from the store: one that
        ended, or one that runs elsewhere or waits there for a resume (its handle reads its
        state from the store, sends through ``send`` and waits for its end in the store)."""
        return await handle_of(self.runtime, pid)

    async def remote(self, pid: int) -> RemoteProcessHandle:
        """The handle of a process the distributed scheduler placed on another machine."""
        if self.placement is None:
            raise InvalidArgument("remote() needs a distributed scheduler (RayScheduler)")
        if isinstance(pid, bool) or not isinstance(pid, int):
            raise InvalidArgument(f"a pid is an integer, not {pid!r}")
        return await RemoteProcessHandle(self.placement, {"pid": pid, "name": "", "status": "created",
                                                          "program": ""}).refresh()

    async def ps(self, *, all: bool = False) -> list[ProcessInfo]:
        """This kernel's live processes, and ended ones something still holds, by pid; with
        ``all``, every process the store knows."""
        held = dict(self.runtime.ended.items())  # items() iterates safely while the collector runs
        held.update(self.runtime.procs)
        for process in held.values():
            process.snapshot()
        rows = {pid: ProcessInfo.of(p.record) for pid, p in held.items()}
        if all:
            for record in await self.store.load_processes():
                rows.setdefault(record.pid, ProcessInfo.of(record))
        return [rows[pid] for pid in sorted(rows)]

    async def kill(self, pid: int) -> None:
        """Stop process ``pid`` and its live children; waits until each end is recorded."""
        await self.runtime.kill_tree(self.runtime.process(pid))

    def idle_for_outside(self, horizon: float = math.inf) -> dict[int, str]:
        """Where every live process waits for something only the outside world or a distant
        timer can give, what each waits for (``"message"``: a recv, its mailbox empty;
        ``"resume"``: paused; ``"child"``: a wait for a child that itself waits so; ``"timer"``:
        a sleep), counting a wait whose timer fires more than ``horizon`` seconds from now (none,
        by default) as one on the outside; else an empty dict. Such a kernel makes no more
        progress by itself for now: ``ringzero resume`` ends there, leaving them durable in the
        store (each timer's deadline with them), and ``ringzero serve`` lets them go until
        something arrives or a timer is due (``ProcessHandle.wake_at``)."""
        waits: dict[int, str] = {}
        far = time.time() + horizon
        for pid, process in self.runtime.procs.items():
            current = process.in_syscall
            kind = current[0] if current is not None and process.status is ProcessStatus.WAITING else None
            distant = process.wake_at is None or process.wake_at > far
            if process.record.paused and process.status is ProcessStatus.PAUSED:
                waits[pid] = "resume"
            elif kind == "recv" and distant and not len(process.mailbox):
                waits[pid] = "message"
            elif kind == "wait" and distant:
                waits[pid] = "child"
            elif kind in ("sleep", "sleep_until") and process.wake_at is not None and process.wake_at > far:
                waits[pid] = "timer"
            else:
                return {}
        return waits

    async def send(self, pid: int | ProcessHandle | RemoteProcessHandle, message: JSON, *,
                   priority: int = DEFAULT_PRIORITY) -> None:
        """Put ``message`` in the mailbox of process ``pid`` (a pid, or its handle), wherever it
        is: run by this kernel, by a kernel in another OS process or on another node on this store
        (which delivers it within a second of its next monitor tick), or in no host at all (a
        process waiting in the store after a crash, or between the wake-ups of ``ringzero
        serve``), where the message is stored and the process gets it when it is next resumed.
        Durable when this returns.

        Raises ProcessNotFound for a pid the store does not know and ProcessStateError for one
        that has ended."""
        await self.start()
        await self.runtime.send(pid.pid if isinstance(pid, (ProcessHandle, RemoteProcessHandle)) else pid, message,
                                priority)

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
        return await recover(self.runtime, programs, pids=pids, from_node=from_node)

    async def retry(self, pid: int, programs: Mapping[str, Program] | None = None) -> ProcessHandle:
        """Resume a failed process from its journal: typically one a changed program failed with
        ``NonDeterminismError``, once the change is rolled back or put under ``ctx.patched``.
        Its end is taken back and it replays what it recorded, then runs live. InvalidArgument
        for a pid the store does not hold or a process that did not fail."""
        return await retry(self.runtime, pid, programs)

    async def fork(self, pid: int, *, at: int, programs: Mapping[str, Program] | None = None) -> ProcessHandle:
        """A new process that replays process ``pid``'s journal up to slot ``at`` (nothing
        before it runs again) and runs live from there: its program, arguments and limits, a
        new pid (so tools get new idempotency keys). The old process is untouched; children it
        spawned before ``at`` stay its own (the fork sees their recorded pids and results)."""
        return await fork(self.runtime, pid, at, programs)

    @classmethod
    async def check_replays(cls, source: Checkpointer, *, programs: Mapping[str, Program] | None = None,
                            pids: Collection[int] | None = None) -> list[ReplayReport]:
        """Replay the stored journals of ``source``'s processes (those in ``pids`` where given)
        against the code importable now, without one live call, and report per process whether
        it replays clean or where it first diverges (``ringzero replay --check``). The rows are
        copied into a kernel of its own in memory: nothing is written to ``source``."""
        async with cls(checkpointer=":memory:", monitor_interval=None) as kernel:
            await copy_rows(source, kernel.store.checkpointer)
            return await check_replays(kernel.runtime, programs, pids)


def _gates(llm: LLMProvider | LLMGate | Mapping[str, LLMProvider | LLMGate] | None) -> dict[str, LLMGate]:
    if llm is None:
        return {}
    if isinstance(llm, Mapping):
        return {name: _gate(value) for name, value in llm.items()}
    return {"default": _gate(llm)}


def _gate(value: LLMProvider | LLMGate) -> LLMGate:
    if isinstance(value, LLMGate):
        return value
    check_backend(value, LLMProvider, "llm")
    return LLMGate(value)
