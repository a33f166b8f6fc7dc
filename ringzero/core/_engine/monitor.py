"""A kernel's side of ``ringzero top`` (see ``ringzero.core.support.monitor`` for what it
reads and writes in the store): the ``Monitor`` task that writes the kernel's activity row and
carries out the commands left for its processes."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import socket
import time
from collections.abc import Coroutine, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ringzero.core._engine.session import open_sessions
from ringzero.core.contract.errors import RingzeroError
from ringzero.core.contract.outcomes import number
from ringzero.core.contract.store import dumps, loads
from ringzero.core.contract.types import JSON, NO_METADATA, Checkpoint
from ringzero.core.support.gate import LLMGate
from ringzero.core.support.monitor import (
    ACTIVITY,
    COMMAND_WINDOW,
    COMMANDS,
    MAX_LISTED,
    RECENT_COMMANDS,
)
from ringzero.core.support.timeouts import cancel_and_wait, retrieved
from ringzero.core.support.tool_pool import pools_in_use

if TYPE_CHECKING:
    from ringzero.core._engine.keeper import Keeper
    from ringzero.core._engine.runtime import Runtime

__all__ = ["Monitor"]

_kernels = itertools.count(1)


def _gate_row(name: str, gate: LLMGate, before: Mapping[str, float] | None, seconds: float) -> dict[str, JSON]:
    now = gate.snapshot()
    row: dict[str, JSON] = {**now, "name": name, "calls_per_s": 0.0, "tokens_per_s": 0.0}
    if before is not None and seconds > 0:
        row["calls_per_s"] = round((now["calls"] - before["calls"]) / seconds, 2)
        row["tokens_per_s"] = round((now["tokens"] - before["tokens"]) / seconds, 1)
    return row


@dataclass
class Monitor:
    """A kernel's side of ``ringzero top``: the activity row and the commands (one task)."""

    runtime: Runtime
    interval: float = 1.0
    id: str = field(default_factory=lambda: f"{socket.gethostname()}:{os.getpid()}:{next(_kernels)}")
    _task: asyncio.Task[None] | None = None
    _wrote_idle: bool = True
    _written: bool = False
    _seen: dict[str, None] = field(default_factory=dict)
    _gates_before: dict[str, dict[str, float]] = field(default_factory=dict)
    _ticked: float = field(default_factory=time.monotonic)
    _acting: set[asyncio.Task[None]] = field(default_factory=set)
    _keeper: Keeper | None = None

    def tick_every(self, seconds: float) -> None:
        self.interval = seconds

    def wakes_for(self, keeper: Keeper) -> None:
        """Take the ``wake`` commands left for the processes ``keeper`` let go: a kernel that let
        processes go reads the commands at every tick, even with none live."""
        self._keeper = keeper

    def start(self) -> None:
        """Start ticking on the running loop (again, where the kernel moved to a new loop)."""
        task = self._task
        if task is None or task.done() or task.get_loop() is not asyncio.get_running_loop():
            self._task = asyncio.get_running_loop().create_task(self._run(), name=f"ringzero-monitor-{self.id}")

    async def aclose(self) -> None:
        """Stop ticking, and mark the row closed (a closed kernel is not shown as alive)."""
        task, self._task = self._task, None
        if task is None or task.get_loop() is not asyncio.get_running_loop():
            return  # one on a loop that has gone ended with it
        await cancel_and_wait((task,))  # a tick can lose one cancellation (psycopg's pool waits with wait_for)
        if not task.cancelled():
            task.result()  # an error that ended the ticks early
        for acting in list(self._acting):
            acting.cancel()
        if self._written or self.runtime.claimed_wakes:  # a kernel that wrote a row (or holds claims) says it is gone
            with contextlib.suppress(Exception):
                await self._write({"kernel": self.id, "at": time.time(), "interval": self.interval, "closed": True,
                                   "processes": [], "gates": {}})

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            try:
                await self.tick()
            except (RingzeroError, OSError):  # the store is down: the processes see it themselves
                continue

    async def tick(self) -> None:
        """Write the activity row and take this kernel's commands (nothing when idle)."""
        live = list(self.runtime.procs.values())
        if not live and self._wrote_idle:
            if self._keeper is not None and self._keeper.let_go:
                await self._take_commands()
            return
        await self._write(self._activity(live))
        self._written, self._wrote_idle = True, not live
        if live:
            await self._take_commands()

    def _activity(self, live: list[Any]) -> dict[str, JSON]:
        now = time.monotonic()
        seconds, self._ticked = now - self._ticked, now
        processes: list[JSON] = []
        for process in live[:MAX_LISTED]:
            spent = process.meter.spent_dict()
            current = process.in_syscall
            processes.append({
                "pid": process.pid, "status": process.status.value, "paused": process.record.paused,
                "syscall": None if current is None else current[0],
                "detail": None if current is None else current[1][:80],
                "in_syscall_s": None if current is None else round(now - current[2], 2),
                "wake_at": process.wake_at,
                "tokens": spent.get("tokens", 0), "cost": spent.get("cost", 0.0),
                "llm_calls": spent.get("llm_calls", 0), "steps": spent.get("steps", 0),
                "wall_s": round(process.wall_seconds, 2), "sessions": open_sessions(process),
            })
        gates: dict[str, JSON] = {}
        for name, gate in self.runtime.gates.items():
            row = _gate_row(name, gate, self._gates_before.get(name), seconds)
            self._gates_before[name] = {"calls": number(row["calls"]), "tokens": number(row["tokens"])}
            gates[name] = row
        return {"kernel": self.id, "node": self.runtime.cluster.node, "at": time.time(), "interval": self.interval,
                "closed": False, "processes": processes, "more": max(0, len(live) - MAX_LISTED), "gates": gates,
                "tools": pools_in_use(self.runtime.executor)}

    async def _write(self, body: Mapping[str, JSON]) -> None:
        await self.runtime.checkpointer.put(Checkpoint(thread_id=ACTIVITY, namespace="", id=self.id,
                                                      payload=dumps(body), metadata=NO_METADATA))

    async def _take_commands(self) -> None:
        """Carry out the new commands for processes this kernel runs. Where several kernels share
        the store, the one that claims a command's ``done`` row acts; each acts in a task of its
        own, so a kill that waits for a process to end does not hold the next tick."""
        fresh = []
        for cp in await self._new_commands():
            body = loads(cp.payload, f"command {cp.id}")
            pid = int(body.get("pid", -1))
            if time.time() - float(body.get("at", 0)) > COMMAND_WINDOW:
                continue
            if body.get("action") == "wake":  # no claim: each step of it is idempotent
                if pid in self.runtime.procs:  # runs here, not yet listed when the message was stored
                    self._acting_on(self.runtime.take_stored_mail(pid))
                elif self._keeper is not None:
                    self._keeper.wake(pid)
            elif pid in self.runtime.procs:
                fresh.append((cp.id, body))
        for command_id, body in fresh:  # in the order sent
            if not await self._claim(command_id):
                continue
            self._acting_on(self._act(command_id, int(body["pid"]), str(body["action"]), body))

    async def _new_commands(self) -> list[Checkpoint]:
        """The commands not seen before, oldest first: the newest ``RECENT_COMMANDS``, and the
        pages before them while every one is new (a burst of messages to processes let go
        leaves a ``wake`` each, more than one read holds)."""
        new: list[Checkpoint] = []
        before: str | None = None
        while True:
            page = [cp async for cp in self.runtime.checkpointer.list(COMMANDS, "", before=before,
                                                                      limit=RECENT_COMMANDS)]
            unseen = [cp for cp in page if cp.id not in self._seen]
            new += unseen
            if len(unseen) < RECENT_COMMANDS:
                break
            before = page[-1].id
            if loads(page[-1].payload, f"command {page[-1].id}").get("at", 0) < time.time() - COMMAND_WINDOW:
                break
        new.reverse()
        for cp in new:  # oldest first, so that the oldest are forgotten first
            self._seen[cp.id] = None
        while len(self._seen) > max(4 * RECENT_COMMANDS, 2 * len(new)):  # a dict keeps insertion order
            del self._seen[next(iter(self._seen))]
        return new

    def _acting_on(self, action: Coroutine[Any, Any, None]) -> None:
        """Carry ``action`` out in a task of its own (stopped with the monitor)."""
        task = asyncio.get_running_loop().create_task(action)
        self._acting.add(task)
        task.add_done_callback(self._acting.discard)
        task.add_done_callback(retrieved)

    async def _claim(self, command_id: str) -> bool:
        row = Checkpoint(thread_id=COMMANDS, namespace="done", id=command_id,
                         payload=dumps({"kernel": self.id, "state": "taken", "message": ""}), metadata=NO_METADATA)
        if self.runtime.checkpointer.capabilities.claims:
            return await self.runtime.checkpointer.claim(row)
        await self.runtime.checkpointer.put(row)
        return True

    async def _act(self, command_id: str, pid: int, action: str, body: Mapping[str, Any]) -> None:
        state, message = "done", f"{action} pid {pid}: done"
        try:
            handle = self.runtime.get(pid)
            if action == "send":
                await handle.send(body.get("message"), priority=int(body.get("priority", 10)))
            elif action == "kill":
                await handle.kill()
            elif action == "pause":
                await handle.pause()
            elif action == "resume":
                await handle.resume()
            else:
                state, message = "failed", f"unknown action {action!r}"
        except RingzeroError as exc:
            state, message = "failed", f"{action} pid {pid}: {exc}"
        with contextlib.suppress(RingzeroError, OSError):
            await self.runtime.checkpointer.put(Checkpoint(
                thread_id=COMMANDS, namespace="done", id=command_id,
                payload=dumps({"kernel": self.id, "state": state, "message": message}), metadata=NO_METADATA))
