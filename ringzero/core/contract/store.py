"""How the kernel lays its own records out in a Checkpointer.

Everything the kernel must not lose goes through the same protocol LangGraph's
checkpoints use, as compact JSON:

=================================  ===========  ====================================
thread                             namespace    one checkpoint per
=================================  ===========  ====================================
``ringzero/processes``             ``""``       process: what it is (written once, at spawn)
``ringzero/processes``             status       process: where it is (small, per transition)
``ringzero/processes``             state        process: ``ctx.state``, result, error (at
                                                checkpoints and at exit)
``ringzero/process/<pid>``         transitions  lifecycle transition
``ringzero/process/<pid>``         journal      syscall result, in program order
``ringzero/process/<pid>``         intents      effect about to run (a tool call): written before
                                                it starts, so that a resume knows it was in flight
``ringzero/process/<pid>``         calls        result of a tool that sandboxed code called, under
                                                its exec's slot (``<slot>.<n>``); the deadline of
                                                a waiting syscall's timer (``<slot>.0``)
``ringzero/process/<pid>``         mailbox      message delivered to the process
``ringzero/process/<pid>``         owner        cluster node that took the process (claimed,
                                                one per epoch; written only by cluster kernels)
``ringzero/process/<pid>``         placement    what a cluster node must have to run it (Ray's
                                                resources), and why none runs it now, if so
``ringzero/pid-blocks``            ``""``       block of 1000 pids a cluster node claimed
``ringzero/schedules``             ``""``       schedule: its program, period or cron, policy
``ringzero/schedule/<name>``       firings      firing of a schedule: claimed by the kernel that
                                                fires it, then its process's pid
``ringzero/schedule/<name>``       repairs      firing repaired after its kernel died firing it
=================================  ===========  ====================================

A process record is split so that what changes often is small: a transition writes two
rows of a few hundred bytes, whatever the size of ``ctx.state``, which is written only when
the program asks (``ctx.checkpoint()``) and when it ends. A record is read back by laying
the status and state rows over the first one (a store written by an older ringzero, with
whole records in the first row, reads the same). Ids are zero-padded so that they sort in
creation order, as the protocol requires.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from typing import Any

from ringzero.core.contract.outcomes import Outcome, Value, decode
from ringzero.core.contract.protocols import Appending, Batching, Checkpointer, check_backend
from ringzero.core.contract.records import (
    Effects,
    JournalEntry,
    ProcessRecord,
    dumps,
    effect_id,
    effect_key,
    loads,
    merged_record,
    new_row,
    process_thread,
    row_key,
    waiting_json,
)
from ringzero.core.contract.types import JSON, NO_METADATA, Checkpoint, strict_json

SCHEDULES = "ringzero/schedules"


def schedule_thread(name: str) -> str:
    return f"ringzero/schedule/{name}"


def firing_key(slot: float) -> str:
    """The row id of a firing at ``slot`` (wall clock, to the millisecond): ids sort in time."""
    return f"{round(slot * 1000):015d}"


__all__ = ["SCHEDULES", "Effects", "JournalEntry", "KernelStore", "ProcessRecord", "dumps", "effect_id", "effect_key",
           "firing_key", "loads", "process_thread", "schedule_thread"]

KERNEL_THREADS = "ringzero/"
"""The prefix of every thread the kernel writes (processes, journals, memory, activity): a
LangGraph saver sharing the store lists the rest."""
PROCESS_TABLE = "ringzero/processes"
PID_BLOCKS = "ringzero/pid-blocks"


class KernelStore:
    """Reads and writes the kernel's records through any Checkpointer."""

    def __init__(self, checkpointer: Checkpointer) -> None:
        check_backend(checkpointer, Checkpointer, "checkpointer")
        self.checkpointer = checkpointer
        capabilities = checkpointer.capabilities
        self._put_many: Callable[[Sequence[Checkpoint]], Awaitable[None]] | None = \
            checkpointer.put_many if capabilities.put_many and isinstance(checkpointer, Batching) else None
        appending = checkpointer if capabilities.append and isinstance(checkpointer, Appending) else None
        self._append_row: Callable[[Checkpoint], Awaitable[None]] = \
            checkpointer.put if appending is None else appending.append
        self._append_many: Callable[[Sequence[Checkpoint]], Awaitable[None]] | None = \
            None if appending is None else appending.append_many
        """Where the store appends (``capabilities.append``, SQLite): every record only this
        store, or recovery after a crash, reads back goes that way (journal, mail, transitions,
        status, state; a new process's record where its pid came from a block the kernel holds),
        one ``write()`` each instead of a commit; other connections see them once folded."""
        self._append_here: Callable[[Checkpoint], bool] | None = \
            getattr(checkpointer, "append_here", None) if appending is not None and capabilities.append_anywhere \
            else None
        """``append`` from any thread (``capabilities.append_anywhere``): None where the store has
        none, and the ``..._here`` writes below answer False."""

    async def save_process(self, record: ProcessRecord) -> None:
        """Write the whole record (its three rows)."""
        await self.checkpointer.put(self._process_row(record))
        await self.put_rows([self.state_row(record), self.status_row(record)])

    async def put_rows(self, rows: Sequence[Checkpoint]) -> None:
        """Write ``rows`` in one atomic step where the store can (``capabilities.append``: one
        record of its log; ``capabilities.put_many``: one commit, not one each), else one after
        another, in order."""
        if self._append_many is not None:
            await self._append_many(rows)
            return
        if self._put_many is not None and len(rows) > 1:
            await self._put_many(rows)
            return
        for row in rows:
            await self.checkpointer.put(row)

    @staticmethod
    def status_row(record: ProcessRecord) -> Checkpoint:
        """The row of where the process is: status, stop reason, pause flag, counters. Small;
        stamped now."""
        record.stamp()
        body = {"status": record.status.value,
                "stop_reason": None if record.stop_reason is None else record.stop_reason.value,
                "paused": record.paused, "spent": record.spent, "wall_seconds": record.wall_seconds,
                "updated_at": record.updated_at}
        if record.waiting is not None:  # with its parent: a host that lets it go reads no other row
            body["waiting"] = {**waiting_json(record.waiting), "parent": record.parent}
        return new_row(PROCESS_TABLE, "status", row_key(record.pid), None, dumps(body), {"status": record.status.value})

    @staticmethod
    def state_row(record: ProcessRecord) -> Checkpoint:
        """The row of ``ctx.state``, the result and the error."""
        body = {"state": record.state, "result": record.result, "error": record.error}
        return new_row(PROCESS_TABLE, "state", row_key(record.pid), None, dumps(body), {})

    async def begin_new_run(self, record: ProcessRecord) -> None:
        """Write the record of a process that starts a new run (``ctx.continue_as_new``): its
        first row, with the arguments, state and ``run_start`` the new run begins from, which a
        resume reads, then its state row. The first row is the commit point: a crash before it
        resumes the old run, after it the new one."""
        await self.checkpointer.put(self._process_row(record))
        await self.put_rows([self.state_row(record)])

    async def drop_journal_before(self, pid: int, base: int) -> None:
        """Delete the journal rows of slots up to ``base`` (and the intents and tool calls under
        them), where the store deletes single rows: a run started at ``base`` never reads them."""
        if not self.checkpointer.capabilities.delete_checkpoints:
            return
        for namespace in ("journal", "intents", "calls"):
            ids = [cp.id async for cp in self.checkpointer.list(process_thread(pid), namespace)
                   if int(cp.id.partition(".")[0]) <= base]
            if ids:
                await self.checkpointer.delete_checkpoints(process_thread(pid), namespace, ids)

    async def claim_process(self, record: ProcessRecord) -> bool:
        """Write a new process's first record only if its pid is free in the store (False if
        another kernel on this store took the pid first). Needs ``capabilities.claims``."""
        return await self.checkpointer.claim(self._process_row(record))

    async def append_process(self, record: ProcessRecord) -> None:
        """Write a new process's first record where its pid is this kernel's alone (from a pid
        block it holds), as one record of the store's log where it appends."""
        await self._append_row(self._process_row(record))

    async def create_process(self, record: ProcessRecord) -> None:
        """Write a new process's first record (where the store cannot claim)."""
        await self.checkpointer.put(self._process_row(record))

    @staticmethod
    def _process_row(record: ProcessRecord) -> Checkpoint:
        record.stamp()
        return Checkpoint(thread_id=PROCESS_TABLE, namespace="", id=row_key(record.pid),
                          payload=dumps(record.to_json()), metadata={"name": record.name})

    async def load_processes(self, *, as_spawned: bool = False) -> list[ProcessRecord]:
        """Every process the store knows, by pid: three queries, whatever their number.

        ``as_spawned``: each with ``ctx.state`` as it was when the process was spawned (or last
        restarted), not as last saved: what a resumed program starts from, since its replay
        rebuilds the rest (two queries)."""
        layers: dict[str, dict[str, Any]] = {"state": {}}
        for namespace in ("status",) if as_spawned else ("status", "state"):
            layers[namespace] = {cp.id: loads(cp.payload, f"process {namespace} {cp.id}")
                                 async for cp in self.checkpointer.list(PROCESS_TABLE, namespace)}
        records = [
            merged_record(loads(cp.payload, f"process record {cp.id}"), layers["status"].get(cp.id),
                    layers["state"].get(cp.id))
            async for cp in self.checkpointer.list(PROCESS_TABLE, "")
        ]
        return sorted(records, key=lambda r: r.pid)

    async def load_process(self, pid: int, *, as_spawned: bool = False) -> ProcessRecord | None:
        """The record of ``pid`` (None: the store has none); ``as_spawned`` as in ``load_processes``."""
        cp = await self.checkpointer.get(PROCESS_TABLE, "", row_key(pid))
        if cp is None:
            return None
        status = await self.checkpointer.get(PROCESS_TABLE, "status", row_key(pid))
        state = None if as_spawned else await self.checkpointer.get(PROCESS_TABLE, "state", row_key(pid))
        return merged_record(loads(cp.payload, f"process record {pid}"),
                       None if status is None else loads(status.payload, f"process status {pid}"),
                       None if state is None else loads(state.payload, f"process state {pid}"))

    async def max_pid(self, below: int | None = None) -> int:
        """The highest pid in the store (0: none); ``below``: the highest below that one."""
        async for cp in self.checkpointer.list(PROCESS_TABLE, "", before=None if below is None else row_key(below),
                                               limit=1):
            return int(cp.id)
        return 0

    @staticmethod
    def _row(pid: int, namespace: str, seq: int, body: Any, metadata: Mapping[str, JSON]) -> Checkpoint:
        return new_row(process_thread(pid), namespace, row_key(seq), row_key(seq - 1) if seq > 1 else None, dumps(body),
                        metadata)

    async def _read(self, pid: int, namespace: str) -> list[tuple[int, Any]]:
        rows = [
            (int(cp.id), loads(cp.payload, f"{namespace} of pid {pid}"))
            async for cp in self.checkpointer.list(process_thread(pid), namespace)
        ]
        rows.reverse()
        return rows

    @classmethod
    def transitions_row(cls, pid: int, steps: list[tuple[int, dict[str, JSON]]]) -> Checkpoint:
        """The row of lifecycle transitions ``(seq, {"from", "to", "at", "detail"})``, under the
        last one's seq (so that ``last_seq`` goes on from it): a lone transition as it is,
        several as ``{"steps": [...]}``."""
        seq, body = steps[-1]
        if len(steps) > 1:
            body = {"steps": [step for _, step in steps]}
        return cls._row(pid, "transitions", seq, body, NO_METADATA)

    async def transitions(self, pid: int) -> list[dict[str, Any]]:
        """Every lifecycle transition of ``pid``, in order."""
        out: list[dict[str, Any]] = []
        for _, body in await self._read(pid, "transitions"):
            out.extend(body.get("steps", [body]))
        return out

    async def last_seq(self, pid: int, namespace: str) -> int:
        async for cp in self.checkpointer.list(process_thread(pid), namespace, limit=1):
            return int(cp.id)
        return 0

    async def append_journal(self, pid: int, entry: JournalEntry, *, exclusive: bool = False) -> bool:
        """Write one journal record. ``exclusive`` writes it only where its slot is free (a
        claim) and returns False if another kernel recorded that slot first: the fence that
        keeps two kernels from both recording one process."""
        body = {"kind": entry.kind, "fp": entry.fingerprint, "summary": entry.summary,
                "outcome": entry.outcome.to_json(), "at": entry.at if entry.at is not None else round(time.time(), 3)}
        # No metadata: nothing filters journal rows, and encoding it cost a few µs a syscall.
        if not exclusive:
            await self.checkpointer.put(self._row(pid, "journal", entry.seq, body, NO_METADATA))
            return True
        return await self.checkpointer.claim(self._row(pid, "journal", entry.seq, body, NO_METADATA))

    async def record_outcome(self, pid: int, seq: int, kind: str, fp: str, summary: str, outcome: Outcome) -> None:
        """``append_journal`` of one machine's journal (not exclusive), from the entry's fields:
        it runs at every syscall."""
        await self._append_row(new_row(
            f"ringzero/process/{pid}", "journal", f"{seq:012d}", f"{seq - 1:012d}" if seq > 1 else None,
            strict_json({"kind": kind, "fp": fp, "summary": summary, "outcome": outcome.to_json(),
                         "at": round(time.time(), 3)}).encode(),
            NO_METADATA))

    async def journal_entry(self, pid: int, seq: int) -> JournalEntry | None:
        cp = await self.checkpointer.get(process_thread(pid), "journal", row_key(seq))
        if cp is None:
            return None
        body = loads(cp.payload, f"journal of pid {pid}")
        return _entry(seq, body)

    async def claim_pid_block(self, block: int, node: str) -> bool:
        """Take pid block ``block`` for ``node`` (False if another node has it)."""
        return await self.checkpointer.claim(Checkpoint(thread_id=PID_BLOCKS, namespace="", id=row_key(block),
                                                        payload=dumps({"node": node}), metadata={"node": node}))

    async def release_pid_blocks(self, blocks: Sequence[int]) -> None:
        """Hand back pid blocks a kernel claimed (``claim_pid_block``). Needs ``capabilities.delete_checkpoints``."""
        await self.checkpointer.delete_checkpoints(PID_BLOCKS, "", [row_key(block) for block in blocks])

    async def claim_owner(self, pid: int, epoch: int, node: str) -> bool:
        """Take process ``pid`` for ``node`` as owner number ``epoch`` (1 at spawn, one more at
        each move). Atomic: of kernels racing for one epoch, exactly one gets True."""
        body = {"node": node, "at": time.time()}
        return await self.checkpointer.claim(self._row(pid, "owner", epoch, body, {"node": node}))

    async def owner(self, pid: int) -> tuple[int, str] | None:
        """(epoch, node) of the latest owner of ``pid``, or None if no cluster kernel took it."""
        async for cp in self.checkpointer.list(process_thread(pid), "owner", limit=1):
            return int(cp.id), str(loads(cp.payload, f"owner of pid {pid}")["node"])
        return None

    async def owners(self) -> dict[int, tuple[int, str]]:
        """The latest owner (epoch, node) of every process a cluster kernel took: one query."""
        latest: dict[int, tuple[int, str]] = {}
        async for cp in self.checkpointer.list(None, "owner"):
            pid, epoch = int(cp.thread_id.rsplit("/", 1)[1]), int(cp.id)
            if epoch > latest.get(pid, (0, ""))[0]:
                latest[pid] = (epoch, str(loads(cp.payload, f"owner of pid {pid}")["node"]))
        return latest

    async def record_intent(self, pid: int, key: str, kind: str, fp: str, summary: str) -> None:
        """Record that effect ``key`` is about to run: durable before it starts."""
        await self._append_row(self._intent_row(pid, key, kind, fp, summary))

    def record_intent_here(self, pid: int, key: str, kind: str, fp: str, summary: str) -> bool:
        """``record_intent`` from any thread: True once durable; False where the store cannot
        take it there (``record_intent`` on the loop, then)."""
        append = self._append_here
        return append is not None and append(self._intent_row(pid, key, kind, fp, summary))

    @staticmethod
    def _intent_row(pid: int, key: str, kind: str, fp: str, summary: str) -> Checkpoint:
        body = {"kind": kind, "fp": fp, "summary": summary, "at": round(time.time(), 3)}
        return new_row(process_thread(pid), "intents", effect_id(key), None, dumps(body), NO_METADATA)

    @property
    def appends_anywhere(self) -> bool:
        """Whether the ``..._here`` writes can take records from any thread."""
        return self._append_here is not None

    async def intents(self, pid: int) -> dict[str, dict[str, Any]]:
        """Every intent recorded for ``pid`` by key (``{"kind", "fp", "summary", "at"}``, and
        ``"run_again": true`` where an operator released it: ``release_intent``)."""
        return {effect_key(cp.id): loads(cp.payload, f"intents of pid {pid}")
                async for cp in self.checkpointer.list(process_thread(pid), "intents")}

    async def release_intent(self, pid: int, key: str, body: Mapping[str, Any]) -> None:
        """Mark intent ``key`` (``body`` as ``intents`` read it) as released by an operator: the
        call is not in doubt any more, and a resume runs it again (``ringzero settle --run-again``)."""
        await self.checkpointer.put(new_row(process_thread(pid), "intents", effect_id(key), None,
                                            dumps({**body, "run_again": True}), NO_METADATA))

    async def drop_journal_entry(self, pid: int, seq: int) -> None:
        """Delete the journal record of slot ``seq`` (an operator's decision about a failed
        process's in-doubt call: its next resume runs that slot again). Needs
        ``capabilities.delete_checkpoints``."""
        await self.checkpointer.delete_checkpoints(process_thread(pid), "journal", [row_key(seq)])

    async def record_call(self, pid: int, key: str, kind: str, fp: str, summary: str, outcome: Outcome) -> None:
        """Record the outcome of a tool call made by sandboxed code (``key``: ``<slot>.<n>``)."""
        await self._append_row(self._call_row(pid, key, kind, fp, summary, outcome))

    def record_call_here(self, pid: int, key: str, kind: str, fp: str, summary: str, outcome: Outcome) -> bool:
        """``record_call`` from any thread: True once durable; False where the store cannot take
        it there (``record_call`` on the loop, then)."""
        append = self._append_here
        return append is not None and append(self._call_row(pid, key, kind, fp, summary, outcome))

    @staticmethod
    def _call_row(pid: int, key: str, kind: str, fp: str, summary: str, outcome: Outcome) -> Checkpoint:
        body = {"kind": kind, "fp": fp, "summary": summary, "outcome": outcome.to_json(), "at": round(time.time(), 3)}
        return new_row(process_thread(pid), "calls", effect_id(key), None, dumps(body), NO_METADATA)

    async def record_timer(self, pid: int, seq: int, fp: str, summary: str, deadline: float) -> None:
        """Record the deadline of the timer that waiting syscall ``seq`` set (as ``<seq>.0``
        among the tool calls: an exec's are numbered from 1)."""
        await self.record_call(pid, f"{seq}.0", "timer", fp, summary, Value(deadline))

    async def effects(self, pid: int) -> Effects:
        """The intents (but those an operator released), nested tool-call results and timers
        recorded for ``pid`` (two reads: a resumed process makes them once, at its first live
        effect or timer)."""
        intents = frozenset(key for key, body in (await self.intents(pid)).items() if not body.get("run_again"))
        return Effects(intents, *await self.calls(pid))

    async def calls(self, pid: int) -> tuple[dict[str, JournalEntry], dict[int, JournalEntry]]:
        """The results of the tool calls ``pid``'s code made, by key (``<slot>.<n>``), and the
        deadlines of its timers, by slot: one read."""
        calls: dict[str, JournalEntry] = {}
        timers: dict[int, JournalEntry] = {}
        async for cp in self.checkpointer.list(process_thread(pid), "calls"):
            body = loads(cp.payload, f"tool calls of pid {pid}")
            slot = int(cp.id.partition(".")[0])
            if body.get("kind") == "timer":
                timers[slot] = _entry(slot, body)
            else:
                calls[effect_key(cp.id)] = _entry(slot, body)
        return calls, timers

    async def note_placement(self, pid: int, resources: Mapping[str, float], waiting: str = "") -> None:
        """Record what a cluster node must have to run ``pid`` and, where no live node has it,
        why it waits (``waiting``; empty once placed)."""
        body = {"resources": dict(resources), "waiting": waiting}
        await self.checkpointer.put(new_row(process_thread(pid), "placement", row_key(0), None, dumps(body),
                                             NO_METADATA))

    async def placements(self) -> dict[int, dict[str, Any]]:
        """``{"resources", "waiting"}`` of every process placed with resources: one query."""
        out: dict[int, dict[str, Any]] = {}
        async for cp in self.checkpointer.list(None, "placement"):
            out[int(cp.thread_id.rsplit("/", 1)[1])] = loads(cp.payload, f"placement of {cp.thread_id}")
        return out

    async def journal(self, pid: int) -> list[JournalEntry]:
        return [
            _entry(seq, body)
            for seq, body in await self._read(pid, "journal")
        ]

    async def append_mail(self, pid: int, seq: int, priority: int, message: JSON, sender: int | None,
                          mail_id: str | None = None) -> None:
        body: dict[str, JSON] = {"priority": priority, "message": message, "sender": sender}
        if mail_id is not None:  # a process's send: its place in the sender's program order
            body["id"] = mail_id
        await self._append_row(self._row(pid, "mailbox", seq, body, {"priority": priority}))

    async def store_mail(self, pid: int, seq: int, priority: int, message: JSON, sender: int | None,
                         mail_id: str | None = None) -> bool:
        """Write a message that no live kernel delivers (``Kernel.send`` to a process in no host)
        at ``seq``, only where that seq is free if the store can claim (False: taken; try the
        next)."""
        body: dict[str, JSON] = {"priority": priority, "message": message, "sender": sender}
        if mail_id is not None:
            body["id"] = mail_id
        row = self._row(pid, "mailbox", seq, body, {"priority": priority})
        if self.checkpointer.capabilities.claims:
            return await self.checkpointer.claim(row)
        await self.checkpointer.put(row)
        return True

    async def last_mail_seqs(self) -> dict[int, int]:
        """The last mailbox seq of every process that has mail: one query over every mailbox
        (whose rows' ids repeat from one process to the next: not read in pages)."""
        last: dict[int, int] = {}
        async for cp in self.checkpointer.list(None, "mailbox"):
            owner, _, pid = cp.thread_id.rpartition("/")
            if owner == "ringzero/process" and pid.isdigit():
                last[int(pid)] = max(last.get(int(pid), 0), int(cp.id))
        return last

    async def statuses(self) -> AsyncIterator[tuple[int, dict[str, Any]]]:
        """(pid, status row) of every process, newest first, read a page at a time: what a host
        of many processes scans without holding every record at once (``load_processes`` does).
        A process with no status row yet (created, never moved) comes with its first row's
        ``status``."""
        seen: set[int] = set()
        async for cp in self._pages(PROCESS_TABLE, "status"):
            seen.add(int(cp.id))
            yield int(cp.id), loads(cp.payload, f"process status {cp.id}")
        async for cp in self._pages(PROCESS_TABLE, ""):
            if int(cp.id) not in seen:
                yield int(cp.id), {"status": loads(cp.payload, f"process record {cp.id}").get("status", "created")}

    async def _pages(self, thread_id: str | None, namespace: str, size: int = 1000) -> AsyncIterator[Checkpoint]:
        """Every row of ``namespace`` (in ``thread_id``, or any), ``size`` rows a read."""
        before: str | None = None
        while True:
            page = [cp async for cp in self.checkpointer.list(thread_id, namespace, before=before, limit=size)]
            for cp in page:
                yield cp
            if len(page) < size:
                return
            before = page[-1].id

    # ------------------------------------------------------------------ schedules
    async def put_schedule(self, name: str, spec: Mapping[str, JSON]) -> None:
        """Write schedule ``name`` (``ringzero.core._engine.schedules.ScheduleSpec``)."""
        await self.checkpointer.put(new_row(SCHEDULES, "", name, None, dumps(dict(spec)), NO_METADATA))

    async def schedule(self, name: str) -> dict[str, Any] | None:
        cp = await self.checkpointer.get(SCHEDULES, "", name)
        return None if cp is None else loads(cp.payload, f"schedule {name}")

    async def schedules(self) -> list[dict[str, Any]]:
        """Every schedule the store holds, removed ones included (they say so)."""
        return [loads(cp.payload, f"schedule {cp.id}") async for cp in self.checkpointer.list(SCHEDULES, "")]

    async def claim_firing(self, name: str, slot: float, namespace: str, body: Mapping[str, JSON]) -> bool:
        """Take the firing of schedule ``name`` at ``slot`` (``firings``), or its repair
        (``repairs``): True for the one kernel whose row this is (a claim where the store can)."""
        row = new_row(schedule_thread(name), namespace, firing_key(slot), None, dumps(dict(body)), NO_METADATA)
        if self.checkpointer.capabilities.claims:
            return await self.checkpointer.claim(row)
        await self.checkpointer.put(row)
        return True

    async def put_firing(self, name: str, slot: float, body: Mapping[str, JSON]) -> None:
        await self.checkpointer.put(new_row(schedule_thread(name), "firings", firing_key(slot), None,
                                            dumps(dict(body)), NO_METADATA))

    async def firings(self, name: str, limit: int | None = None) -> list[dict[str, Any]]:
        """The firings of schedule ``name``, newest first (each ``{"slot", "pid", ...}``)."""
        return [loads(cp.payload, f"firing {cp.id} of {name}")
                async for cp in self.checkpointer.list(schedule_thread(name), "firings", limit=limit)]

    async def spawned_as(self, spawn_id: str) -> int | None:
        """The pid of the process created with ``spawn_id``, if any (every first row read, a page
        at a time: asked only to repair a firing whose kernel died as it fired)."""
        async for cp in self._pages(PROCESS_TABLE, ""):
            if loads(cp.payload, f"process record {cp.id}").get("spawn_id") == spawn_id:
                return int(cp.id)
        return None

    async def mail(self, pid: int) -> list[tuple[int, dict[str, Any]]]:
        return await self._read(pid, "mailbox")


def _entry(seq: int, body: Mapping[str, Any]) -> JournalEntry:
    """A journal record read back: its outcome decoded (``ringzero.core.contract.outcomes``)."""
    return JournalEntry(seq, body["kind"], body["fp"], body.get("summary", ""), decode(body["outcome"]), body.get("at"))
