"""What ``ringzero top`` reads and writes in a store: each kernel's activity, and commands to it.

A kernel's state database says where every process is at its last transition; it does not
say which syscall a process is in now, what it has spent since, or how long the LLM gate's
line is. So each kernel with live processes writes one small activity row a second (the
``Monitor``), and ``ringzero top``, in any OS process, on any machine that reaches the store,
reads it beside the process table. The same tick reads the commands ``top`` left for the
processes this kernel runs (pause, resume, kill) and the messages another OS process sent them
(``Kernel.send``, ``ringzero send``), and carries them out: control goes through the store, so
it reaches a kernel in another process as it reaches one on another node.

=========================  ===========  ================================================
thread                     namespace    one checkpoint per
=========================  ===========  ================================================
``ringzero/activity``      ``""``       kernel: its live processes' syscalls and spend,
                                        its gates' line, calls and tokens (replaced)
``ringzero/commands``      ``""``       command: ``{"pid", "action", "at"}`` (kept; a send
                                        also has ``message`` and ``priority``)
``ringzero/commands``      done         command: which kernel took it, and how it went
=========================  ===========  ================================================

The kernel's own side (the ``Monitor`` that writes the row and carries commands out) is the
engine's: ``ringzero.core._engine.monitor``. ``deliver_elsewhere``, here, sends a message to a
process another kernel runs, through its command rows.

A kernel with no live process writes nothing and reads nothing, so an idle kernel costs the
store nothing; one whose store fails goes on running (monitoring never stops a process).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

from ringzero.core.contract.errors import InvalidArgument, ProcessStateError
from ringzero.core.contract.protocols import Checkpointer
from ringzero.core.contract.store import KernelStore, dumps, loads
from ringzero.core.contract.types import JSON, NO_METADATA, Checkpoint

__all__ = [
    "ACTIONS", "ACTIVITY", "COMMANDS", "COMMAND_WINDOW", "MAX_LISTED", "RECENT_COMMANDS",
    "KernelActivity", "carried_out", "command_outcome", "deliver_elsewhere", "hosts_of", "read_activity",
    "send_command", "take_stored_commands",
]

ACTIVITY = "ringzero/activity"
COMMANDS = "ringzero/commands"
ACTIONS = ("pause", "resume", "kill", "send", "wake")
"""What a command asks of the kernel that runs its process; ``wake``: a message was stored for
a process that a kernel let go (``ringzero.core._engine.keeper``), which brings it back."""
MAX_LISTED = 1000
"""Live processes an activity row lists (those beyond are counted in ``more``): the row is
written every second, and 100,000 idle processes must not make it megabytes."""
COMMAND_WINDOW = 60.0
"""Seconds after which a command nobody took is left alone (its target was not running)."""
RECENT_COMMANDS = 50
"""The newest commands a tick reads: more than a person at a keyboard makes in a second."""


@dataclass(frozen=True)
class KernelActivity:
    """One kernel's latest activity row, as ``ringzero top`` reads it."""

    kernel: str
    at: float
    interval: float
    closed: bool
    processes: dict[int, dict[str, Any]]
    """Per live pid: ``status``, ``paused``, ``syscall`` (kind, or None between syscalls),
    ``detail``, ``in_syscall_s``, ``wake_at`` (when the timer it waits on fires, wall clock; None
    without one), ``tokens``, ``cost``, ``llm_calls``, ``steps``, ``wall_s``, ``sessions`` (its
    sessions holding an interpreter now)."""
    more: int
    gates: dict[str, dict[str, Any]]
    """Per gate: ``waiting`` (calls in line), ``in_flight``, ``calls``, ``rate_limited``,
    ``retries``, ``failures``, ``tokens``, ``calls_per_s``, ``tokens_per_s``, ``closed_for_s``."""
    tools: dict[str, Any] = field(default_factory=dict)
    """The kernel's host tool threads: ``threads``, ``running``, ``overrunning`` (tools still
    running after their run's wall limit ended the wait), ``stalls`` (times a tool held the event
    loop over 100 ms) and, after one, ``stalled_by`` (the tool) and ``stall_s``."""

    def fresh(self, now: float | None = None) -> bool:
        """True while the kernel is alive as far as anyone can tell: not closed, and its last row
        is not older than three of its ticks (a kernel killed with -9 stops writing)."""
        now = time.time() if now is None else now
        return not self.closed and now - self.at <= 3 * self.interval + 1.0


async def read_activity(checkpointer: Checkpointer) -> list[KernelActivity]:
    """Every kernel's latest activity row on this store (fresh or not: see ``fresh``)."""
    out = []
    async for cp in checkpointer.list(ACTIVITY, ""):
        body = loads(cp.payload, f"activity row {cp.id}")
        out.append(KernelActivity(
            kernel=str(body.get("kernel", cp.id)), at=float(body.get("at", 0.0)),
            interval=float(body.get("interval", 1.0)), closed=bool(body.get("closed", False)),
            processes={int(p["pid"]): p for p in body.get("processes", [])}, more=int(body.get("more", 0)),
            gates=dict(body.get("gates") or {}), tools=dict(body.get("tools") or {}),
        ))
    return out


async def send_command(checkpointer: Checkpointer, pid: int, action: str,
                       details: Mapping[str, JSON] | None = None) -> str:
    """Ask whichever kernel runs ``pid`` to ``action`` it (pause, resume, kill, or send it the
    ``message`` in ``details``); returns the command's id, for ``command_outcome``. The kernel
    acts at its next tick (within a second)."""
    if action not in ACTIONS:
        raise InvalidArgument(f"a command is one of {', '.join(ACTIONS)}, not {action!r}")
    command_id = f"{time.time_ns():020d}-{uuid.uuid4().hex[:8]}"
    body = {**(details or {}), "pid": pid, "action": action, "at": time.time()}
    await checkpointer.put(Checkpoint(thread_id=COMMANDS, namespace="", id=command_id, payload=dumps(body),
                                      metadata={"pid": pid, "action": action}))
    return command_id


async def hosts_of(checkpointer: Checkpointer, pid: int, own: str | None) -> list[KernelActivity]:
    """The live kernels (other than ``own``) whose latest activity row lists ``pid``."""
    return [a for a in await read_activity(checkpointer) if a.fresh() and pid in a.processes and a.kernel != own]


async def carried_out(checkpointer: Checkpointer, command_id: str, until: float | None) -> dict[str, Any] | None:
    """The command's outcome once a kernel has carried it out (not only taken it), or None at
    ``until`` (monotonic seconds; None: however long it takes)."""
    while True:
        outcome = await command_outcome(checkpointer, command_id)
        if outcome is not None and outcome["state"] != "taken":
            return outcome
        if until is not None and time.monotonic() >= until:
            return None
        await asyncio.sleep(0.05)


async def take_stored_commands(checkpointer: Checkpointer, pids: Collection[int], action: str,
                               taker: str) -> list[int]:
    """Claim the recent ``action`` commands for ``pids``, processes that no kernel hosts (they
    wait in the store: ``ringzero serve`` between wake-ups): the pids whose command ``taker``
    took, to carry out itself."""
    taken: list[int] = []
    async for cp in checkpointer.list(COMMANDS, "", limit=RECENT_COMMANDS):
        body = loads(cp.payload, f"command {cp.id}")
        pid = int(body.get("pid", -1))
        if body.get("action") != action or pid not in pids or time.time() - float(body.get("at", 0)) > COMMAND_WINDOW:
            continue
        done = {"kernel": taker, "state": "done", "message": f"{action} pid {pid}: done in the store"}
        row = Checkpoint(thread_id=COMMANDS, namespace="done", id=cp.id, payload=dumps(done), metadata=NO_METADATA)
        if await checkpointer.claim(row):
            taken.append(pid)
    return taken


async def command_outcome(checkpointer: Checkpointer, command_id: str) -> dict[str, Any] | None:
    """``{"kernel", "state": "taken"|"done"|"failed", "message"}`` once a kernel took the
    command, else None."""
    cp = await checkpointer.get(COMMANDS, "done", command_id)
    return None if cp is None else dict(loads(cp.payload, f"command {command_id}"))


async def deliver_elsewhere(checkpointer: Checkpointer, store: KernelStore, own: str | None, pid: int, message: JSON,
                            priority: int, *, sender: int | None = None, mail_id: str | None = None) -> None:
    """Deliver a message to ``pid``, a process this kernel does not run (``Kernel.send``).

    Where a live kernel on the store lists it (its activity row is fresh), that kernel is asked
    to deliver it (a ``send`` command, taken at its next tick). Where none does, or none takes
    the command within a few of its ticks, the message is stored in the process's mailbox (the
    command's ``done`` row is claimed first, so that exactly one of the host and this sender
    delivers it), and a ``wake`` command is left: a kernel that let the process go brings it
    back, and one that runs it without having listed it yet takes the message from the store,
    each at its next tick; with no host, whoever resumes it gets it. ``own``: the sending
    kernel's monitor id, if any; ``sender`` and ``mail_id``: a process's send (see
    ``Runtime.deliver``)."""
    hosts = await hosts_of(checkpointer, pid, own)
    if hosts:
        command_id = await send_command(checkpointer, pid, "send", {"message": message, "priority": priority})
        until = time.monotonic() + 3 * max(a.interval for a in hosts) + 1
        outcome = await carried_out(checkpointer, command_id, until)
        if outcome is None:  # not taken in time: store it, unless the host takes it meanwhile
            stored = {"kernel": own or "sender", "state": "done", "message": f"send to pid {pid}: stored for its host"}
            row = Checkpoint(thread_id=COMMANDS, namespace="done", id=command_id, payload=dumps(stored),
                             metadata=NO_METADATA)
            if not checkpointer.capabilities.claims or await checkpointer.claim(row):
                outcome = None
            else:  # the host took it after all: it delivers
                outcome = await carried_out(checkpointer, command_id, None)
        if outcome is not None:
            if outcome["state"] == "failed":
                raise ProcessStateError(str(outcome["message"]))
            return
    while True:
        seq = await store.last_seq(pid, "mailbox") + 1
        if await store.store_mail(pid, seq, priority, message, sender, mail_id):
            break
    await send_command(checkpointer, pid, "wake")
