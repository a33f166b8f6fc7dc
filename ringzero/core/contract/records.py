"""The kernel's records as they are stored: a process record, a journal entry, the effects of a
run, and the compact JSON every row's payload is (see ``ringzero.core.contract.store`` for the layout)."""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from ringzero.core.contract.errors import CheckpointerError
from ringzero.core.contract.outcomes import Outcome, Value, number
from ringzero.core.contract.types import JSON, Checkpoint, Limits, ProcessStatus, StopReason, strict_json

__all__ = [
    "CODE_RUNS",
    "Effects",
    "Ending",
    "Event",
    "JournalEntry",
    "ProcessInfo",
    "ProcessRecord",
    "Waiting",
    "dumps",
    "effect_id",
    "effect_key",
    "loads",
    "merged_record",
    "new_row",
    "process_thread",
    "received_seq",
    "row_key",
    "spend_in_journal",
    "waiting_json",
    "waiting_of",
]

CODE_RUNS = frozenset({"exec", "session"})
"""The syscall kinds that run code (``ctx.exec``, a session's step): their records hold an
``ExecResult``, and the tools the code calls run under them."""


def dumps(value: Any) -> bytes:
    """Compact JSON bytes; NaN and infinities are refused (not JSON)."""
    return strict_json(value).encode()


def loads(payload: bytes, where: str) -> Any:
    try:
        return json.loads(payload)
    except ValueError as exc:
        raise CheckpointerError(f"{where} holds a record that is not ringzero JSON: {exc}") from exc


def new_row(thread_id: str, namespace: str, id: str, parent_id: str | None, payload: bytes,
             metadata: Mapping[str, JSON]) -> Checkpoint:
    """``Checkpoint(...)`` with these fields and no writes, made the fast way
    (``Checkpoint.without_writes``): a row a process writes at every step."""
    return Checkpoint.without_writes(thread_id, namespace, id, parent_id, payload, metadata)


def row_key(n: int) -> str:
    return f"{n:012d}"


def process_thread(pid: int) -> str:
    return f"ringzero/process/{pid}"


class Ending(NamedTuple):
    """What a record holds of how a process ended (``ProcessRecord.end``)."""

    stop_reason: StopReason | None
    error: dict[str, str] | None
    result: JSON
    state: dict[str, JSON]


Waiting = tuple[str, "float | None", "int | None"]
"""What a waiting process waits on: (``on``, ``until``, ``mail``). ``on``: a ``message``, a
``timer`` or a ``child``; ``until``: its timer's wall-clock deadline (None: no timer); ``mail``,
for a message, the last mailbox seq delivered to it, every mail up to it received when it began
to wait (None where it is not known so: mail was waiting in its mailbox). A plain tuple of plain
values, which the garbage collector stops tracking: every waiting process holds one."""


def waiting_json(waiting: Waiting) -> dict[str, JSON]:
    on, until, mail = waiting
    return {"on": on, "until": until, "mail": mail}


def waiting_of(data: Any) -> Waiting | None:
    """A ``Waiting`` read back from a status row (None where the row holds none)."""
    if not isinstance(data, dict) or not isinstance(data.get("on"), str):
        return None
    until, mail = data.get("until"), data.get("mail")
    return (data["on"], None if until is None else float(until), None if mail is None else int(mail))


@dataclass
class ProcessRecord:
    """Everything needed to show a process in ``ps`` and to resume it after a crash."""

    pid: int
    name: str
    program: str
    """``module:qualname`` of the program, so that a new host can import it again."""
    args: Sequence[JSON]
    """A tuple where the kernel made the record: the empty one is shared, and one of plain
    values is not tracked by the garbage collector (a list is, in every idle process)."""
    priority: int
    limits: Limits
    parent: int | None = None
    status: ProcessStatus = ProcessStatus.CREATED
    stop_reason: StopReason | None = None
    paused: bool = False
    result: JSON = None
    error: dict[str, str] | None = None
    spent: dict[str, JSON] = field(default_factory=dict)
    wall_seconds: float = 0.0
    state: dict[str, JSON] = field(default_factory=dict)
    created_at: float = field(default_factory=time.time)
    updated_at: float = field(default_factory=time.time)
    spawn_id: str | None = None
    """``parent-pid:n`` for the parent's n-th ``ctx.spawn`` in program order: how a resumed
    parent finds the child it created before a crash cut it off from journaling the spawn."""
    run_start: dict[str, JSON] | None = None
    """Where the current run began, for a process that called ``ctx.continue_as_new`` (None
    for one still in its first run): see ``ringzero.core._engine.new_run.RunStart``."""
    waiting: Waiting | None = None
    """What a waiting process waits on (None while it does not wait). Kept in the status row, so
    that a host finds what wakes a waiting process without replaying it."""

    # What changes a record: each change its own method, so that the record says what may
    # change and the kernel's modules never set its fields one by one.
    def numbered(self, pid: int) -> None:
        """The pid its store gave it, when first written."""
        self.pid = pid

    def move_to(self, status: ProcessStatus) -> None:
        self.status = status

    def ask_to_stop(self, reason: StopReason) -> None:
        """Stop for ``reason``: the first reason asked for holds."""
        if self.stop_reason is None:
            self.stop_reason = reason

    def waits_on(self, waiting: Waiting | None) -> None:
        """It waits on ``waiting`` (see the field), or (None) no longer."""
        self.waiting = waiting

    def set_paused(self, paused: bool) -> None:
        self.paused = paused

    def count(self, spent: dict[str, JSON], wall_seconds: float) -> None:
        """What it has spent and how long it has been alive, as of now."""
        self.spent, self.wall_seconds = spent, wall_seconds

    def stamp(self) -> float:
        """Mark it as written now; returns the time."""
        self.updated_at = time.time()
        return self.updated_at

    def end(self, *, stop_reason: StopReason, error: dict[str, str] | None, result: JSON,
            state: dict[str, JSON]) -> Ending:
        """Fill in how it ended (before the end is written); returns what it held before, for
        ``undo_end`` where the end could not be written."""
        before = Ending(self.stop_reason, self.error, self.result, self.state)
        self.stop_reason, self.error, self.result, self.state = stop_reason, error, result, state
        return before

    def undo_end(self, before: Ending) -> None:
        """Back to what it held before ``end``: the end was not written, and a resume goes on."""
        self.stop_reason, self.error, self.result, self.state = before

    def begin_run(self, args: Sequence[JSON], state: dict[str, JSON], run_start: dict[str, JSON]) -> None:
        """A new run of the same process (``ctx.continue_as_new``)."""
        self.args, self.state, self.run_start = args, state, run_start

    def to_json(self) -> dict[str, JSON]:
        return {
            "pid": self.pid,
            "name": self.name,
            "program": self.program,
            "args": list(self.args),
            "priority": self.priority,
            "limits": self.limits.to_dict(),
            "parent": self.parent,
            "status": self.status.value,
            "stop_reason": None if self.stop_reason is None else self.stop_reason.value,
            "paused": self.paused,
            "result": self.result,
            "error": None if self.error is None else {key: text for key, text in self.error.items()},
            "spent": self.spent,
            "wall_seconds": self.wall_seconds,
            "state": self.state,
            "created_at": self.created_at,
            "updated_at": self.updated_at,
            **({"spawn_id": self.spawn_id} if self.spawn_id is not None else {}),
            **({"run_start": self.run_start} if self.run_start is not None else {}),
            **({"waiting": waiting_json(self.waiting)} if self.waiting is not None else {}),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ProcessRecord:
        return cls(
            pid=int(data["pid"]),
            name=str(data["name"]),
            program=str(data["program"]),
            args=list(data.get("args") or []),
            priority=int(data["priority"]),
            limits=Limits.from_dict(data.get("limits")),
            parent=data.get("parent"),
            status=ProcessStatus(data["status"]),
            stop_reason=None if data.get("stop_reason") is None else StopReason(data["stop_reason"]),
            paused=bool(data.get("paused", False)),
            result=data.get("result"),
            error=data.get("error"),
            spent=dict(data.get("spent") or {}),
            wall_seconds=float(data.get("wall_seconds", 0.0)),
            state=dict(data.get("state") or {}),
            created_at=float(data.get("created_at", 0.0)),
            updated_at=float(data.get("updated_at", 0.0)),
            spawn_id=data.get("spawn_id"),
            run_start=data.get("run_start"),
            waiting=waiting_of(data.get("waiting")),
        )


@dataclass(frozen=True)
class JournalEntry:
    """One recorded syscall: its kind, a fingerprint of its arguments, and its outcome."""

    seq: int
    kind: str
    fingerprint: str
    summary: str
    outcome: Outcome
    """What happened (``ringzero.core.contract.outcomes``)."""
    at: float | None = None
    """When it was recorded (wall clock); None in a record written before records were timed."""


def effect_id(key: str) -> str:
    """The row id of an effect's key: ``"7"`` (syscall #7) or ``"7.3"`` (the third tool call
    that the code of exec #7 made), zero-padded so that ids sort in program order."""
    slot, _, call = key.partition(".")
    return f"{int(slot):012d}.{int(call):06d}" if call else f"{int(slot):012d}"


def effect_key(row_id: str) -> str:
    slot, _, call = row_id.partition(".")
    return f"{int(slot)}.{int(call)}" if call else str(int(slot))


@dataclass(frozen=True)
class Effects:
    """What a resumed process's store says of its effects: the keys of calls whose intent was
    recorded (``intents``), the recorded results of tool calls made by sandboxed code
    (``calls``, by key ``<slot>.<n>``), and the timers its waiting syscalls set (``timers``, by
    slot: each entry's outcome a ``Value`` of its wall-clock deadline)."""

    intents: frozenset[str]
    calls: Mapping[str, JournalEntry]
    timers: Mapping[int, JournalEntry] = field(default_factory=dict)


def merged_record(first: dict[str, Any], status: dict[str, Any] | None, state: dict[str, Any] | None) -> ProcessRecord:
    """A process record: its first row with the status and state rows laid over it."""
    return ProcessRecord.from_json({**first, **(status or {}), **(state or {})})


@dataclass(frozen=True)
class Event:
    """Something that happened to a process: a ``transition`` or a ``budget_warning``
    (``Kernel.subscribe``)."""

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
    wake_at: float | None = None
    """When the timer it waits on fires (wall clock), where it waits on one."""

    @classmethod
    def of(cls, record: ProcessRecord) -> ProcessInfo:
        """The row of ``record``. A process asked to pause shows as paused at once, as in
        ``ringzero top``, though it stops only at its next syscall boundary (one in the middle of
        a model call finishes that call first)."""
        spent = record.spent
        status = ProcessStatus.PAUSED if record.paused and not record.status.terminal else record.status
        return cls(
            pid=record.pid, name=record.name, parent=record.parent, priority=record.priority,
            status=status, stop_reason=record.stop_reason,
            tokens=int(number(spent.get("tokens"))), llm_calls=int(number(spent.get("llm_calls"))),
            steps=int(number(spent.get("steps"))), cost=number(spent.get("cost")),
            wall_seconds=record.wall_seconds,
            wake_at=None if record.waiting is None or record.status.terminal else record.waiting[1],
        )


def spend_in_journal(entries: list[JournalEntry]) -> dict[str, float]:
    """What a process's recorded syscalls consumed, read from its journal: what ``recover()``
    charges it again as it replays them. Its status row is written at lifecycle transitions,
    so after a crash it can lag behind; ``ringzero ps`` shows the larger of the two."""
    spend = {"tokens": 0.0, "cost": 0.0, "llm_calls": 0.0, "steps": float(len(entries)), "exec_seconds": 0.0}
    for entry in entries:
        outcome = entry.outcome
        value = outcome.value if isinstance(outcome, Value) else None
        if not isinstance(value, dict):
            continue
        if entry.kind == "llm":
            usage = value.get("usage")
            if isinstance(usage, dict):
                spend["llm_calls"] += 1
                spend["tokens"] += number(usage.get("input_tokens")) + number(usage.get("output_tokens"))
                spend["cost"] += number(usage.get("cost"))
        elif entry.kind in CODE_RUNS:
            spend["exec_seconds"] += number(value.get("duration"))
    return spend


def received_seq(entry: JournalEntry) -> int | None:
    """The mailbox seq a journaled ``recv`` consumed (None: another syscall, or a ``recv`` that
    timed out)."""
    outcome = entry.outcome
    got = outcome.value if entry.kind == "recv" and isinstance(outcome, Value) else None
    seq = got.get("seq") if isinstance(got, dict) else None
    return seq if isinstance(seq, int) else None
