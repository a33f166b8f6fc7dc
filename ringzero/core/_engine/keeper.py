"""Letting waiting processes go: a host of many (``ringzero serve``) keeps in memory only the
processes that run, and finds the others in the store when something wakes them.

A top-level process that has waited ``after`` seconds for a message or on a timer (``recv``,
``sleep``, ``sleep_until``) is let go: the status row its ``waiting`` transition wrote says
what it waits on (``ProcessRecord.waiting``), its task stops as at a shutdown (nothing ends,
nothing is recorded), and it leaves the process table; what the kernel keeps of it is one
entry here, its pid and its timer's deadline. It comes back (``wake``: read from the store
and replayed from its journal, as ``recover`` does) when a message is sent to it, from this
kernel or from any other OS process (the message is stored, and a ``wake`` command left for
the monitor, which takes it at its next tick), or when its timer is due.

Not let go: a child (its parent may wait on its end in memory), a parent with children that
have not ended, a paused process, one that waits on a child, one with mail not yet received.
"""

from __future__ import annotations

import asyncio
import heapq
import time
from collections.abc import Mapping
from typing import Any

from ringzero.core._engine.handles import ProcessHandle
from ringzero.core._engine.lifecycle import launch
from ringzero.core._engine.process import Process
from ringzero.core._engine.recovery import load, recover
from ringzero.core._engine.runtime import Runtime
from ringzero.core.contract.errors import RingzeroError
from ringzero.core.contract.records import waiting_of
from ringzero.core.contract.types import ProcessStatus, Program
from ringzero.core.support.holders import Holders
from ringzero.core.support.timeouts import retrieved

__all__ = ["Keeper"]


class Keeper:
    """The processes a kernel let go, and what brings each back."""

    def __init__(self, runtime: Runtime, after: float, programs: Mapping[str, Program] | None = None) -> None:
        self.runtime = runtime
        self.after = after
        """Seconds a process waits before it is let go."""
        self.programs: Mapping[str, Program] = programs or {}
        self.let_go: dict[int, float | None] = {}
        """Pid of each process let go, with its timer's wall-clock deadline (None: no timer)."""
        self._epochs: dict[int, int] = {}
        """The owner each process let go had then (0: none), where wakes are claimed: its wake
        claims the next one, so that of kernels holding it let go, one brings it back."""
        self._due: list[tuple[float, int]] = []
        """(deadline, pid) of the timers of the processes let go: a heap, earliest first."""
        self._alarm: asyncio.TimerHandle | None = None
        self._stopping: dict[int, asyncio.Task[None]] = {}
        self._waking: dict[int, asyncio.Task[None]] = {}
        self._watch: asyncio.Task[None] | None = None

    @property
    def holding(self) -> int:
        """Processes let go here, and those being brought back."""
        return len(self.let_go) + len(self._waking)

    # ------------------------------------------------------------------ letting go
    def start(self) -> None:
        """Look for processes to let go, every half of ``after``, on the running loop."""
        if self._watch is None or self._watch.done():
            self._watch = asyncio.get_running_loop().create_task(self._look(), name="ringzero-keeper")

    async def _look(self) -> None:
        while True:
            await asyncio.sleep(max(0.05, self.after / 2))
            now = time.monotonic()
            for process in [p for p in self.runtime.procs.values() if self._may_let_go(p, now)]:
                try:
                    await self._let_go_of(process)
                except (RingzeroError, OSError):  # the store failed: it stays in memory, asked again later
                    break

    def _may_let_go(self, process: Process, now: float) -> bool:
        waiting, current = process.record.waiting, process.in_syscall
        if waiting is None or current is None or process.status is not ProcessStatus.WAITING:
            return False
        on, _, mail = waiting
        return (now - current[2] >= self.after and (on == "timer" or (on == "message" and mail is not None))
                and not len(process.mailbox) and not process.record.paused and process.record.parent is None
                and not process.children and not process.spawning and process.task is not None
                and not process.from_threads and process.fenced is None)

    async def _let_go_of(self, process: Process) -> None:
        await self.runtime.flush()  # its waiting transition, with what it waits on, is in the store
        if not self._may_let_go(process, time.monotonic()) or process.pid not in self.runtime.procs:
            return  # a message came meanwhile
        task = process.task
        assert task is not None
        # Synchronously, from here: a message sent from now on finds it let go, stored for it.
        self.runtime.release(process)
        owner = process.journal.owner
        self._keep(process.pid, process.wake_at, 0 if owner is None else owner[0])
        task.cancel()
        stopping = self._stopping[process.pid] = asyncio.ensure_future(_stopped(task))
        stopping.add_done_callback(lambda _: self._stopping.pop(process.pid, None))

    def _keep(self, pid: int, until: float | None, epoch: int) -> None:
        self.let_go[pid] = until
        self._epochs[pid] = epoch
        if until is not None:
            heapq.heappush(self._due, (until, pid))
            self._arm()

    # ------------------------------------------------------------------ bringing back
    def wake(self, pid: int) -> None:
        """Bring ``pid`` back, if it was let go here (a message came for it, or its timer)."""
        if pid not in self.let_go or pid in self._waking:
            return
        until, epoch = self.let_go.pop(pid), self._epochs.pop(pid, 0)
        waking = self._waking[pid] = asyncio.get_running_loop().create_task(self._bring_back(pid, until, epoch))
        waking.add_done_callback(lambda _: self._waking.pop(pid, None))
        waking.add_done_callback(retrieved)

    async def _bring_back(self, pid: int, until: float | None, epoch: int) -> None:
        stopping = self._stopping.get(pid)
        if stopping is not None:
            await stopping
        runtime = self.runtime
        if runtime.runs(pid):
            return
        owner = None
        try:
            if runtime.claims_wakes:  # one host per wake: another kernel that woke it first runs it
                owner = await runtime.claim_wake(pid, epoch)
                if owner is None:
                    return
            record = await runtime.store.load_process(pid, as_spawned=True)
            if record is None or record.status.terminal or runtime.runs(pid):
                return
            if record.updated_at and not record.paused:  # it waited all along, let go: that is wall time too
                record.count(record.spent, record.wall_seconds + max(0.0, time.time() - record.updated_at))
            process = await load(runtime, record, self.programs, owner)
        except (RingzeroError, OSError):  # the store failed: still let go, for the next message or its timer
            self._keep(pid, until, epoch if owner is None else owner[0])
            raise
        if process.left_unfinished is None:
            launch(process)

    def _arm(self) -> None:
        """Set the one alarm, for the earliest deadline."""
        if self._alarm is not None:
            self._alarm.cancel()
            self._alarm = None
        while self._due and self.let_go.get(self._due[0][1]) != self._due[0][0]:
            heapq.heappop(self._due)  # woken already, or let go again with another timer
        if self._due:
            loop = asyncio.get_running_loop()
            self._alarm = loop.call_at(loop.time() + max(0.0, self._due[0][0] - time.time()), self._ring)

    def _ring(self) -> None:
        self._alarm = None
        now = time.time()
        while self._due and self._due[0][0] <= now:
            _, pid = heapq.heappop(self._due)
            self.wake(pid)
        self._arm()

    # ------------------------------------------------------------------ from the store
    async def adopt(self) -> tuple[list[int], list[ProcessHandle]]:
        """Take the store's unfinished processes: let go at once (never replayed) each one whose
        status row says it waits on a message that has not come or on a timer not yet due, and
        resume the others (``recover``). Returns the pids let go and the handles ``recover``
        gives of the others (those it could not resume among them). The status rows are read a
        page at a time: a store of 100,000 waiting processes is not held in memory at once."""
        store = self.runtime.store
        delivered = await store.last_mail_seqs()
        holders = await Holders.read(store) if self.runtime.claims_wakes else Holders()
        now = time.time()
        let_go: list[int] = []
        resume: list[int] = []
        async for pid, row in store.statuses():
            if ProcessStatus(row["status"]).terminal or self.runtime.runs(pid):
                continue
            epoch, holder = holders.of(pid, self.runtime.host_id)
            if holder is not None:
                self.runtime.held_elsewhere[pid] = holder  # a live kernel runs it (or holds it let go)
                continue
            waits, until = _still_waits(row, delivered.get(pid, 0), now)
            if waits:
                let_go.append(pid)
                self._keep(pid, until, epoch)
            else:
                resume.append(pid)
        return let_go, await recover(self.runtime, self.programs, pids=resume) if resume else []

    async def aclose(self) -> None:
        """Stop looking and ringing (the kernel closes: whatever was let go stays in the store)."""
        if self._alarm is not None:
            self._alarm.cancel()
        for task in [self._watch, *self._waking.values()]:
            if task is not None:
                task.cancel()
        await asyncio.gather(*[t for t in [self._watch, *self._waking.values(), *self._stopping.values()]
                               if t is not None], return_exceptions=True)


def _still_waits(row: Mapping[str, Any], last_mail: int, now: float) -> tuple[bool, float | None]:
    """Whether the process of status row ``row`` waits, as the row says, on a message not yet
    come (every mail delivered to it received) or on a timer not yet due, a top-level process
    not paused; and its timer's deadline (None: none)."""
    waiting = waiting_of(row.get("waiting"))
    if row["status"] != ProcessStatus.WAITING.value or waiting is None or row.get("paused") \
            or row["waiting"].get("parent", 0) is not None:  # a child, or a row that does not say
        return False, None
    on, until, mail = waiting
    due = until is not None and until <= now
    waits = (on == "timer" and until is not None) or (on == "message" and mail is not None and last_mail <= mail)
    return waits and not due, until


async def _stopped(task: asyncio.Task[None]) -> None:
    """Wait for a process's task, cancelled, to have unwound."""
    await asyncio.gather(task, return_exceptions=True)
