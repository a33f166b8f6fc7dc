"""The runtime: the process table and the kernel's side of every syscall.

``Process`` and ``Context`` see this object, as ``process.Host``, and nothing else of the kernel:
it creates a process, retires it, delivers its mail, adopts its children and settles their
budgets, kills a tree of processes, and emits events. It stands above the rest of the engine
(which names it only through ``Host``), so it imports them and none imports it back.
``Kernel`` (``ringzero.core.kernel``) is the users' facade over it. Its methods are internal
to ``ringzero.core`` (and to schedulers that run kernels on cluster nodes): free to change, not
for programs to call.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import time
import warnings
import weakref
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ringzero.core._engine.budget import Spend
from ringzero.core._engine.cluster import Cluster
from ringzero.core._engine.handles import DEFAULT_PRIORITY, ProcessHandle
from ringzero.core._engine.journal import Journal
from ringzero.core._engine.lifecycle import launch
from ringzero.core._engine.mailbox import Mail, check_message
from ringzero.core._engine.pids import PidAllocator
from ringzero.core._engine.process import Process
from ringzero.core._engine.transitions import TransitionWriter
from ringzero.core.contract.errors import InvalidArgument, NoProvider, ProcessNotFound, ProcessStateError
from ringzero.core.contract.protocols import Checkpointer, Executor, Scheduler, Tool
from ringzero.core.contract.records import Event
from ringzero.core.contract.store import ProcessRecord
from ringzero.core.contract.types import JSON, Limits, Program, StopReason
from ringzero.core.support import holders, loop_pool
from ringzero.core.support.gate import LLMGate
from ringzero.core.support.memory import MemoryStore
from ringzero.core.support.monitor import deliver_elsewhere
from ringzero.core.support.no_telemetry import NO_TELEMETRY, NoTelemetry
from ringzero.core.support.references import program_reference
from ringzero.core.support.telemetry import Telemetry
from ringzero.core.support.timeouts import retrieved, shielded, started_eagerly

__all__ = ["Runtime", "missing_program"]

NO_LIMITS = Limits()
"""The limits of every process spawned without any: one frozen object, not one each."""

_WARNED: set[str] = set()


class Runtime:
    """The process table of one kernel, and what its processes ask of it (``process.Host``)."""

    def __init__(self, *, checkpointer: Checkpointer, executor: Executor, scheduler: Scheduler,
                 tools: Mapping[str, Tool], gates: dict[str, LLMGate], cluster: Cluster,
                 telemetry_from: tuple[Any, Any, bool | None]) -> None:
        self.checkpointer = checkpointer
        self.executor = executor
        self.scheduler = scheduler
        self.store = cluster.store
        self.memory = MemoryStore(checkpointer)
        self.tools: dict[str, Tool] = dict(tools)
        self.gates = gates
        self.cluster = cluster
        self.procs: dict[int, Process] = {}
        """Live processes. One that ends leaves this table for ``ended``, where it stays only
        while something holds it (a handle, its parent), so memory does not grow with the number
        of processes a long-lived kernel has run."""
        self.ended: weakref.WeakValueDictionary[int, Process] = weakref.WeakValueDictionary()
        self.listeners: list[Callable[[Event], None]] = []
        self.transitions = TransitionWriter(checkpointer)
        self.pids = PidAllocator(self.store, node=cluster.node, owner=self._pid_owner)
        self.monitor_id: str | None = None
        """The id of the kernel's ``Monitor`` (its activity row in the store), where it has one."""
        self.telemetry: NoTelemetry = NO_TELEMETRY
        """Spans and metrics, set at ``start`` (``NO_TELEMETRY`` where there are no OpenTelemetry
        providers)."""
        self.closed = False
        self.claimed_wakes = 0
        """Stored processes this kernel took by a claim (``claim_wake``): its monitor then says
        when it closes, so that a resumer on another machine need not wait for its row to age."""
        self.held_elsewhere: dict[int, str] = {}
        """Stored processes ``recover`` left alone because a live kernel holds them: pid -> its host id."""
        self.replay_only = False
        """A replay check's kernel: a syscall past its journal raises ``ReplayEnded`` instead of
        running (``ringzero.core._engine.replay_check``)."""
        self._started = False
        self._telemetry_from = telemetry_from
        self._children_by_spawn: dict[str, int] = {}

    def only_replay(self) -> None:
        """From now on, a syscall past its journal raises ``ReplayEnded`` (a replay check)."""
        self.replay_only = True

    def close(self) -> None:
        """The kernel is closing: no new process is taken."""
        if self._started and not self.closed:
            holders.OPEN[self.host_id] -= 1
        self.closed = True

    def monitored_as(self, monitor_id: str) -> None:
        """A ``Monitor`` writes this kernel's activity row as ``monitor_id``: the owner its pid
        blocks are taken in, and who a message to a process of another kernel is from."""
        self.monitor_id = monitor_id

    def join_cluster(self, cluster: Cluster, pids: PidAllocator) -> None:
        """Run as a node of ``cluster``, numbering its processes with ``pids`` (``Kernel.join_cluster``)."""
        self.cluster, self.pids = cluster, pids

    async def start(self) -> None:
        """Detect telemetry and number pids on after what the store holds (once)."""
        if self._started:
            return
        self._started = True
        holders.OPEN[self.host_id] += 1
        loop_pool.install(asyncio.get_running_loop())  # threads blocked on this loop never starve it
        tracer_provider, meter_provider, capture_content = self._telemetry_from
        self.telemetry = Telemetry.detect(tracer_provider, meter_provider, capture_content,
                                          lambda: Counter(p.status.value for p in self.procs.values())) or NO_TELEMETRY
        await self.pids.start()

    @property
    def claims_wakes(self) -> bool:
        """Whether every wake of a stored process (a timer, a message, a resume, a retry) is
        claimed first, as the next owner in the store: a kernel on a store other kernels may
        share (``multi_process``)."""
        return self.checkpointer.capabilities.multi_process

    @property
    def host_id(self) -> str:
        """Who this kernel is in the store's claims: its cluster node, else its monitor's id
        (its host and OS pid where it has no monitor)."""
        return self._pid_owner()

    async def claim_wake(self, pid: int, epoch: int) -> tuple[int, str] | None:
        """Take stored process ``pid`` for this kernel before it runs here again, as owner
        ``epoch + 1`` (``Cluster.claim_wake``); None where another kernel took it first."""
        owner = await self.cluster.claim_wake(pid, self.host_id, epoch)
        self.claimed_wakes += owner is not None
        return owner

    def _pid_owner(self) -> str:
        if self.cluster.node is not None:
            return self.cluster.node
        return self.monitor_id or f"{socket.gethostname()}:{os.getpid()}"

    # ------------------------------------------------------------------ the table
    def runs(self, pid: int) -> bool:
        """Whether process ``pid`` is live in this kernel."""
        return pid in self.procs

    def process(self, pid: int) -> Process:
        """The live process ``pid``, or an ended one something still holds."""
        if isinstance(pid, bool) or not isinstance(pid, int):
            raise InvalidArgument(f"a pid is an integer, not {pid!r}")
        process = self.procs.get(pid) or self.ended.get(pid)
        if process is None:
            raise ProcessNotFound(pid)
        return process

    def get(self, pid: int) -> ProcessHandle:
        return ProcessHandle(self, self.process(pid))

    async def held(self, pid: int) -> Process:
        """``process``, or one made of the stored record of a process this kernel does not hold."""
        try:
            return self.process(pid)
        except ProcessNotFound:
            record = await self.store.load_process(pid)
            if record is None:
                raise
            if not record.status.terminal:
                return Process(self, record, missing_program, Journal(self.store, pid))
            return self.ended_process(record)

    def ended_process(self, record: ProcessRecord) -> Process:
        ended = Process(self, record, missing_program, Journal(self.store, record.pid))
        ended.settle()
        self.ended[record.pid] = ended
        return ended

    def retire(self, process: Process) -> None:
        """A process has ended: it leaves the live table (see ``procs``)."""
        if self.procs.get(process.pid) is process:
            del self.procs[process.pid]
            self.ended[process.pid] = process
            for gate in self.gates.values():
                gate.forget(process.pid)

    def release(self, process: Process) -> None:
        """``process`` is let go without ending (``keeper``): it leaves the live table, and lives on
        in the store only."""
        if self.procs.get(process.pid) is process:
            del self.procs[process.pid]
            for gate in self.gates.values():
                gate.forget(process.pid)

    def child_finished(self, child: Process) -> None:
        """Retire ``child`` and refund its parent what it did not spend."""
        parent = self.procs.get(child.record.parent) if child.record.parent is not None else None
        self.retire(child)
        if parent is not None:
            parent.settle_child(child.pid, child.meter.spent)

    def save_soon(self, process: Process) -> None:
        self.transitions.save_soon(process)

    async def flush(self) -> None:
        await self.transitions.flush()

    def emit(self, kind: str, pid: int, data: Mapping[str, JSON]) -> None:
        if not self.listeners:
            return  # the common case, at every transition
        event = Event(kind, pid, data, time.time())
        for listener in list(self.listeners):
            listener(event)

    def gate(self, name: str = "default") -> LLMGate:
        """The LLM gate of provider ``name``."""
        if name not in self.gates:
            configured = ", ".join(sorted(self.gates)) or "none"
            raise NoProvider(f"no LLM provider named {name!r} (configured: {configured}); pass llm= to Kernel")
        return self.gates[name]

    # ------------------------------------------------------------------ spawning
    async def spawn_process(self, program: Program, args: Sequence[JSON], *, name: str | None, priority: int,
                            limits: Limits | None, parent: int | None, remote_parent: int | None = None,
                            spawn_id: str | None = None) -> Process:
        """Create and start a process. ``remote_parent``: the pid of a parent on another cluster
        node, recorded as the parent (whose kernel holds the budget reservation and waits for the
        end) with no local owner."""
        if self.closed:
            raise ProcessStateError("this kernel is closed")
        if isinstance(priority, bool) or not isinstance(priority, int) or priority < 0:
            raise InvalidArgument(f"priority must be a non-negative integer (0 is most urgent), got {priority!r}")
        if limits is not None and not isinstance(limits, Limits):
            raise InvalidArgument(f"limits must be a ringzero.Limits, not {type(limits).__name__}")
        if name is not None and not isinstance(name, str):
            raise InvalidArgument(f"a process name is a string, not {type(name).__name__} {name!r}")
        reference = _recorded_reference(program)
        owner = None if parent is None else self.process(parent)
        await self.start()
        pid = await self.pids.take() if self.pids.taken_first else 0
        record = ProcessRecord(
            pid=pid, name=name or program.__name__, program=reference,
            args=tuple(args), priority=priority, limits=limits or NO_LIMITS,
            parent=parent if remote_parent is None else remote_parent, spawn_id=spawn_id,
        )
        # A kill of the parent cannot cut the child's creation short: it starts in this turn
        # (nothing interrupts that), and where it waits (a claim over the network: PostgreSQL, a
        # cluster node's pid block) it goes on in a task of its own, in the parent's
        # ``spawning`` before this call awaits anything. Once its record is written it is in the
        # table and in its parent's children, or stopped at once if the parent was killed
        # meanwhile: never a half-made child that runs on unseen, or a record that recover()
        # would bring back to life. Where the store writes the record at once (SQLite's log, the
        # in-memory store), the spawn returns in this turn: no task, no turn of the loop.
        creation = started_eagerly(self._create(record, program, owner))
        if creation.done():
            return creation.result()
        creation.add_done_callback(retrieved)  # its caller may be gone (killed) when it fails
        if owner is not None:
            owner.track_spawning(creation)
        return await shielded(creation)

    async def _create(self, record: ProcessRecord, program: Program, owner: Process | None) -> Process:
        await self.pids.write_new(record)
        ownership = self.cluster.ownership
        if ownership is not None and not await self.store.claim_owner(record.pid, *ownership):
            raise ProcessStateError(f"pid {record.pid} was taken by another node as it was created")
        process = Process(self, record, program, Journal(self.store, record.pid, owner=ownership))
        self.procs[record.pid] = process
        if owner is not None:
            owner.reserve(record.pid, record.limits)
            owner.keep_child(process)
            if owner.record.stop_reason is StopReason.KILLED:
                process.request_stop(StopReason.KILLED)
        launch(process)
        return process

    def remember_spawns(self, records: Sequence[ProcessRecord]) -> None:
        """Recovered children by ``spawn_id``, whose open parents may resume their spawn."""
        open_parents = {r.pid for r in records if not r.status.terminal}
        self._children_by_spawn.update((r.spawn_id, r.pid) for r in records
                                       if r.spawn_id is not None and r.parent in open_parents)

    def spawned_before_crash(self, parent: Process, spawn_id: str) -> int | None:
        """The pid of the child a resumed ``parent`` created with this spawn before its host
        died without journaling the spawn: the resumed spawn takes it instead of a second one."""
        if not parent.recovered:
            return None
        return self._children_by_spawn.pop(spawn_id, None)

    # ------------------------------------------------------------------ mail
    async def send(self, pid: int, message: JSON, priority: int = DEFAULT_PRIORITY) -> None:
        """Deliver to ``pid`` wherever it is (see ``Kernel.send``)."""
        check_message(pid, message, priority)
        await self.start()
        await self.deliver(pid, message, priority, sender=None)

    async def deliver(self, pid: int, message: JSON, priority: int, sender: int | None, *,
                      mail_id: str | None = None, maybe_delivered: bool = False) -> None:
        """Store the message durably, then put it in the live mailbox; to a process this kernel
        does not run, through the store (``deliver_elsewhere``: the kernel that runs it, or its
        mailbox there, for whoever brings it back). ``maybe_delivered``: a resumed sender's live
        send, which its host may have delivered before it died without journaling it; a mail
        with the same ``mail_id`` in the target's mailbox means it was."""
        if maybe_delivered and mail_id is not None and any(
                body.get("id") == mail_id for _, body in await self.store.mail(pid)):
            return
        target = self.procs.get(pid)
        if target is None and pid not in self.ended:
            record = await self.store.load_process(pid)
            if record is None:
                raise ProcessNotFound(pid)
            if record.status.terminal:
                raise ProcessStateError(f"pid {pid} has {record.status.value}; it receives no messages")
            await deliver_elsewhere(self.checkpointer, self.store, self.monitor_id, pid, message, priority,
                                    sender=sender, mail_id=mail_id)
            return
        target = self.process(pid)
        if target.status.terminal:
            raise ProcessStateError(f"pid {pid} has {target.status.value}; it receives no messages")
        seq = target.next_mail_seq()
        await self.store.append_mail(pid, seq, priority, message, sender, mail_id)
        target.mailbox.put(Mail(priority, seq, message, sender))

    async def take_stored_mail(self, pid: int) -> None:
        """Put into the live mailbox of ``pid`` the messages stored for it in the store that it has
        not had (``deliver_elsewhere`` stored them before this kernel listed it)."""
        process = self.procs.get(pid)
        if process is None:
            return
        for seq, body in await self.store.mail(pid):
            process.stored_mail(Mail(int(body["priority"]), seq, body["message"], body.get("sender")))

    # ------------------------------------------------------------------ budgets and kills
    async def adopt(self, parent: Process, child_pid: int, child_limits: Limits) -> None:
        """Attach a child's reservation to its parent; settle at once if the child is done."""
        parent.reserve(child_pid, child_limits)
        child = self.procs.get(child_pid)
        record = child.record if child is not None else await self.store.load_process(child_pid)
        if record is not None and record.status.terminal:
            parent.settle_child(child_pid, Spend.from_dict(record.spent))

    async def kill_tree(self, process: Process) -> None:
        """Stop ``process`` and its live children, here and on other nodes; waits for each end."""
        if not process.status.terminal:
            process.request_stop(StopReason.KILLED)  # first: from now on no child of it runs
        while process.spawning:  # children being created land (and stop) before we walk them
            await asyncio.gather(*process.spawning, return_exceptions=True)
        for child_pid in list(process.children):
            if child_pid in self.procs:
                await self.kill_tree(self.procs[child_pid])
        for remote in list(process.remote_children.values()):
            # On its node; a child that has ended is left as it is, and one whose node is gone with
            # nobody to take it over (ProcessNotFound) has nothing left to stop.
            with contextlib.suppress(ProcessNotFound):
                await remote.kill()
        if not process.over and process.task is not None:
            await shielded(process.finished)


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


async def missing_program(ctx: Any, *args: Any) -> None:  # pragma: no cover - never started
    """The program of a process this kernel holds only as a record (never started)."""
    raise AssertionError("not run")
