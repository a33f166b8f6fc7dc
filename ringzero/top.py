"""``ringzero top``: a live view of the processes in a state database, with keys to control them.

It reads what any kernel on the store writes (``ringzero.core.support.monitor``): the process table,
and each live kernel's activity row (the syscall each process is in now, its spend so far,
the LLM gate's line and rate). Pause, resume and kill are commands left in the store; the
kernel that runs the process carries them out at its next tick, whether it is in this OS
process, another one, or on another cluster node. Drawn with rich's ``Live`` on the
terminal's alternate screen; keys are read from the terminal in cbreak mode.

Keys: up/down select, ``s`` next sort column, ``S`` reverse the order, ``/`` filter (Enter to
apply, Esc to clear), ``a`` live processes only, ``p`` pause, ``r`` resume, ``k`` kill (``y``
to confirm), ``q`` quit.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import os
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from rich.console import Console, Group, JustifyMethod
from rich.live import Live
from rich.table import Table
from rich.text import Text

from ringzero.core.contract.errors import RingzeroError
from ringzero.core.contract.outcomes import number
from ringzero.core.contract.protocols import Checkpointer
from ringzero.core.contract.store import KernelStore, ProcessRecord
from ringzero.core.support.monitor import KernelActivity, command_outcome, read_activity, send_command
from ringzero.demo import STATUS_STYLE

__all__ = ["SORT_KEYS", "TopView", "run_top"]

SORT_KEYS = ("pid", "tokens", "cost", "llm", "wall", "priority", "status", "name")
_DESCENDING = {"tokens", "cost", "llm", "wall"}
"""Sorted biggest first by default: what a person looks for first is what spends the most."""
COMMAND_PATIENCE = 5.0
"""Seconds ``top`` waits for a kernel to take a command before it says none did."""
_KEY_HELP = ("↑↓ select · s sort · S reverse · / filter · a live only · p pause · r resume · k kill · q quit")


@dataclass
class Row:
    """One process as ``top`` shows it: its record, with its kernel's live activity over it."""

    pid: int
    name: str
    status: str
    paused: bool
    priority: int
    parent: int | None
    tokens: int
    cost: float
    llm: int
    wall: float
    syscall: str
    stop_reason: str
    sessions: int
    live: bool
    """Run by a kernel that wrote an activity row lately (a fresh one)."""

    @classmethod
    def of(cls, record: ProcessRecord, activity: dict[str, Any] | None) -> Row:
        spent = record.spent
        row = cls(pid=record.pid, name=record.name, status=record.status.value, paused=record.paused,
                  priority=record.priority, parent=record.parent, tokens=int(number(spent.get("tokens"))),
                  cost=number(spent.get("cost")), llm=int(number(spent.get("llm_calls"))),
                  wall=record.wall_seconds, syscall="", sessions=0,
                  stop_reason="" if record.stop_reason is None else record.stop_reason.value, live=False)
        if activity is not None and not record.status.terminal:  # the kernel's memory is newer than the row
            row.live = True
            row.status, row.paused = str(activity["status"]), bool(activity["paused"])
            row.tokens, row.cost = int(activity["tokens"]), float(activity["cost"])
            row.llm, row.wall = int(activity["llm_calls"]), float(activity["wall_s"])
            row.sessions = int(activity.get("sessions") or 0)  # a kernel of an older version writes none
            if activity.get("syscall"):
                row.syscall = f"{activity['syscall']} {activity['in_syscall_s']:.1f}s"
                if activity.get("wake_at"):
                    wakes = datetime.datetime.fromtimestamp(float(activity["wake_at"])).strftime("%H:%M:%S")
                    row.syscall += f", wakes {wakes}"
        return row

    def sort_value(self, key: str) -> Any:
        return {"pid": self.pid, "tokens": self.tokens, "cost": self.cost, "llm": self.llm, "wall": self.wall,
                "priority": self.priority, "status": self.status, "name": self.name.lower()}[key]

    @property
    def ended(self) -> bool:
        return self.status in ("exited", "failed", "killed")


@dataclass
class Snapshot:
    rows: list[Row]
    kernels: list[KernelActivity]
    at: float
    failing_schedules: dict[str, str] = field(default_factory=dict)
    """Schedules that cannot fire, by name: why (their row's ``problem``)."""


async def live_activity(checkpointer: Checkpointer) -> tuple[list[KernelActivity], dict[int, dict[str, Any]]]:
    """The kernels that wrote an activity row lately, and what each says of the processes it
    runs now, by pid (the newest row's word where two name one pid): one query."""
    kernels = [k for k in await read_activity(checkpointer) if k.fresh()]
    live: dict[int, dict[str, Any]] = {}
    for kernel in sorted(kernels, key=lambda k: k.at):
        live.update(kernel.processes)
    return kernels, live


async def read_snapshot(checkpointer: Checkpointer) -> Snapshot:
    """The process table, the live kernels' activity, merged, and the schedules that cannot fire."""
    store = KernelStore(checkpointer)
    records = await store.load_processes()
    kernels, live = await live_activity(checkpointer)
    failing = {str(s["name"]): str(s["problem"]) for s in await store.schedules()
               if s.get("problem") is not None and not s.get("removed")}
    return Snapshot([Row.of(r, live.get(r.pid)) for r in records], kernels, time.time(), failing)


@dataclass
class TopView:
    """What ``top`` shows and the state of its keys; ``handle`` takes one key, ``render`` draws."""

    where: str
    snapshot: Snapshot = field(default_factory=lambda: Snapshot([], [], time.time()))
    sort: str = "pid"
    reverse: bool = False
    filter: str = ""
    live_only: bool = False
    selected: int | None = None
    """The pid of the selected process (it stays selected as rows move)."""
    message: str = ""
    editing: str | None = None
    """The filter being typed, or None."""
    confirm_kill: int | None = None
    quit: bool = False
    height: int = 40
    requests: list[tuple[int, str]] = field(default_factory=list)
    """Commands asked for by keys, sent by the loop: (pid, action)."""

    def rows(self) -> list[Row]:
        rows = [r for r in self.snapshot.rows if not (self.live_only and r.ended)]
        if self.filter:
            needle = self.filter.lower()
            rows = [r for r in rows if needle in r.name.lower() or needle in r.status or needle in r.syscall
                    or needle == str(r.pid)]
        descending = (self.sort in _DESCENDING) != self.reverse
        rows.sort(key=lambda r: (r.sort_value(self.sort), -r.pid if descending else r.pid), reverse=descending)
        return rows

    def _selected_row(self, rows: list[Row]) -> Row | None:
        return next((r for r in rows if r.pid == self.selected), None)

    # ------------------------------------------------------------------ keys
    def handle(self, key: str) -> None:
        if self.editing is not None:
            self._edit_filter(key)
            return
        if self.confirm_kill is not None:
            pid, self.confirm_kill = self.confirm_kill, None
            if key in ("y", "Y"):
                self.requests.append((pid, "kill"))
                self.message = f"kill pid {pid}: sent"
            else:
                self.message = f"kill pid {pid}: cancelled"
            return
        rows = self.rows()
        if key in ("up", "down"):
            self._move(rows, -1 if key == "up" else 1)
        elif key == "s":
            self.sort = SORT_KEYS[(SORT_KEYS.index(self.sort) + 1) % len(SORT_KEYS)]
            self.reverse = False
        elif key == "S":
            self.reverse = not self.reverse
        elif key == "/":
            self.editing = self.filter
        elif key == "a":
            self.live_only = not self.live_only
        elif key in ("q", "Q"):
            self.quit = True
        elif key in ("p", "r", "k"):
            self._command(self._selected_row(rows), {"p": "pause", "r": "resume", "k": "kill"}[key])

    def _move(self, rows: list[Row], step: int) -> None:
        if not rows:
            return
        pids = [r.pid for r in rows]
        if self.selected not in pids:
            self.selected = pids[0 if step > 0 else -1]
            return
        self.selected = pids[max(0, min(len(pids) - 1, pids.index(self.selected) + step))]

    def _edit_filter(self, key: str) -> None:
        assert self.editing is not None
        if key == "enter":
            self.filter, self.editing = self.editing.strip(), None
        elif key == "escape":
            self.filter, self.editing = "", None
        elif key == "backspace":
            self.editing = self.editing[:-1]
        elif len(key) == 1 and key.isprintable():
            self.editing += key

    def _command(self, row: Row | None, action: str) -> None:
        if row is None:
            self.message = f"select a process first (↑↓), then {action} it"
        elif row.ended:
            self.message = f"pid {row.pid} ({row.name}) has already {row.status}"
        elif action == "resume" and not row.paused:
            self.message = f"pid {row.pid} ({row.name}) is not paused"
        elif action == "kill":
            self.confirm_kill = row.pid
            self.message = f"kill pid {row.pid} ({row.name})? y to confirm, any other key to cancel"
        else:
            self.requests.append((row.pid, action))
            self.message = f"{action} pid {row.pid}: sent"

    # ------------------------------------------------------------------ drawing
    def render(self) -> Group:
        rows = self.rows()
        if self.selected is not None and self._selected_row(rows) is None:
            self.selected = None
        counts = Counter("paused" if r.paused and not r.ended else r.status for r in self.snapshot.rows)
        summary = ", ".join(f"{n} {status}" for status, n in sorted(counts.items()))
        header = Text.assemble(("ringzero top", "bold"), f" · {self.where} · ",
                               time.strftime("%H:%M:%S", time.localtime(self.snapshot.at)),
                               f" · {len(self.snapshot.rows)} processes ({summary or 'none'})",
                               f" · {len(self.snapshot.kernels)} live kernel(s)")
        lines: list[Any] = [header, *self._gate_lines()]
        order = "↑" if (self.sort in _DESCENDING) == self.reverse else "↓"
        filtering = f"/{self.editing}▏" if self.editing is not None else (self.filter or "none")
        lines.append(Text(f"sort: {self.sort} {order} · filter: {filtering} · "
                          f"{'live only' if self.live_only else 'all'} · {len(rows)} shown", style="dim"))
        lines.append(self._table(rows))
        lines.append(Text(_KEY_HELP, style="dim"))
        lines.append(Text(self.message, style="bold yellow" if self.confirm_kill is not None else "bold"))
        return Group(*lines)

    def _gate_lines(self) -> Iterator[Text]:
        for name, problem in sorted(self.snapshot.failing_schedules.items()):
            yield Text(f"schedule {name} cannot fire: {problem}", style="bold yellow")
        for kernel in self.snapshot.kernels:
            for name, gate in sorted(kernel.gates.items()):
                closed = f" · closed {gate['closed_for_s']:.1f}s by a 429" if gate.get("closed_for_s") else ""
                yield Text(f"gate {name} ({kernel.kernel}): {gate['waiting']} waiting · {gate['in_flight']} in "
                           f"flight · {gate['calls_per_s']:.1f} calls/s · {gate['tokens_per_s']:.0f} tokens/s · "
                           f"{gate['calls']} calls, {gate['rate_limited']} rate-limited, {gate['retries']} "
                           f"retried{closed}")
            tools = kernel.tools
            if tools.get("overrunning"):  # a tool that ignored its run's wall limit still holds a thread
                yield Text(f"host tools ({kernel.kernel}): {tools['running']} running in {tools['threads']} threads · "
                           f"{tools['overrunning']} past their run's wall limit", style="bold yellow")
            if tools.get("stalled_by"):  # a tool held the GIL: every agent of that host stopped meanwhile
                yield Text(f"host tools ({kernel.kernel}): {tools['stalled_by']} held the event loop "
                           f"{tools['stall_s']:.2f} s ({tools['stalls']} stall(s)): declare it @ringzero.cpu_bound",
                           style="bold yellow")

    def _table(self, rows: list[Row]) -> Table:
        table = Table(box=None, pad_edge=False, header_style="bold reverse", expand=False)
        columns: tuple[tuple[str, JustifyMethod], ...] = (
            ("", "left"), ("PID", "right"), ("NAME", "left"), ("STATUS", "left"), ("PRI", "right"), ("PARENT", "right"),
            ("TOKENS", "right"), ("COST $", "right"), ("LLM", "right"), ("WALL s", "right"), ("SESS", "right"),
            ("SYSCALL NOW", "left"))
        for column, justify in columns:
            table.add_column(column, justify=justify, no_wrap=True)
        room = max(3, self.height - 9 - sum(_tool_lines(k) for k in self.snapshot.kernels))
        start = 0
        if self.selected is not None:
            index = next(i for i, r in enumerate(rows) if r.pid == self.selected)
            start = max(0, index - room + 1)
        for r in rows[start:start + room]:
            status = "paused" if r.paused and not r.ended else r.status
            shown = f"{status} ({r.stop_reason})" if r.ended and r.stop_reason not in ("", "returned", status) \
                else status
            chosen = r.pid == self.selected
            table.add_row(">" if chosen else "", str(r.pid), r.name[:24],
                          Text(shown, style=STATUS_STYLE.get(status, "")), str(r.priority),
                          "" if r.parent is None else str(r.parent), f"{r.tokens:,}",
                          f"{r.cost:.4f}", str(r.llm), f"{r.wall:.1f}", str(r.sessions) if r.sessions else "",
                          r.syscall,
                          style="reverse" if chosen else None)
        if len(rows) > start + room:
            table.add_row("", "", f"… {len(rows) - start - room} more")
        return table


# ---------------------------------------------------------------------- the terminal
_SEQUENCES = {"\x1b[A": "up", "\x1b[B": "down", "\x1bOA": "up", "\x1bOB": "down"}


def _tool_lines(kernel: KernelActivity) -> int:
    """The lines a kernel takes above the table: one per gate, and one for each warning about
    its host tools (past their wall limit, holding the event loop)."""
    return len(kernel.gates) + bool(kernel.tools.get("overrunning")) + bool(kernel.tools.get("stalled_by"))


def parse_keys(data: str) -> list[str]:
    """Keys in what the terminal sent: arrows by name, Enter, Esc and Backspace by name, the
    rest as the characters typed."""
    keys, i = [], 0
    while i < len(data):
        three = data[i:i + 3]
        if three in _SEQUENCES:
            keys.append(_SEQUENCES[three])
            i += 3
            continue
        if data[i] == "\x1b" and three.startswith("\x1b["):  # another sequence (a function key): skipped
            end = i + 2
            while end < len(data) and not data[end].isalpha() and data[end] != "~":
                end += 1
            i = end + 1
            continue
        char = data[i]
        keys.append({"\r": "enter", "\n": "enter", "\x1b": "escape", "\x7f": "backspace", "\b": "backspace"}
                    .get(char, char))
        i += 1
    return keys


@contextlib.contextmanager
def _keys_from_terminal(deliver: Callable[[str], None]) -> Iterator[None]:
    """Read keys from the terminal (cbreak: one at a time, not echoed) until the block ends."""
    import termios
    import tty

    fd = sys.stdin.fileno()
    saved = termios.tcgetattr(fd)
    loop = asyncio.get_running_loop()

    def readable() -> None:
        for key in parse_keys(os.read(fd, 64).decode(errors="replace")):
            deliver(key)

    tty.setcbreak(fd)
    loop.add_reader(fd, readable)
    try:
        yield
    finally:
        loop.remove_reader(fd)
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)


async def run_top(checkpointer: Checkpointer, where: str, console: Console, *, interval: float = 1.0,
                  once: bool = False, sort: str = "pid", filter: str = "") -> int:
    """Show the store's processes until ``q`` (once, as a table, with ``once`` or without a terminal)."""
    view = TopView(where, sort=sort, filter=filter, height=console.height)
    view.snapshot = await read_snapshot(checkpointer)
    if once or not console.is_terminal or not sys.stdin.isatty():
        view.height = 9 + len(view.snapshot.rows) + sum(_tool_lines(k) for k in view.snapshot.kernels)  # every row
        console.print(view.render())
        return 0
    pressed: list[str] = []
    pending: dict[str, tuple[int, str, float]] = {}
    with _keys_from_terminal(pressed.append), Live(view.render(), console=console, screen=True,
                                                   auto_refresh=False) as live:
        next_read = time.monotonic() + interval
        while not view.quit:
            await asyncio.sleep(0.05)
            changed = bool(pressed)
            while pressed:
                view.handle(pressed.pop(0))
            try:
                for pid, action in view.requests:
                    pending[await send_command(checkpointer, pid, action)] = (pid, action, time.monotonic())
                if time.monotonic() >= next_read:
                    next_read = time.monotonic() + interval
                    changed = True
                    view.snapshot = await read_snapshot(checkpointer)
                    await _follow(checkpointer, pending, view)
            except RingzeroError as exc:  # the store is down (a restart): say so, keep the last view, try again
                view.message = f"cannot reach the store: {exc}"
            view.requests.clear()
            if changed and not view.quit:
                view.height = console.height
                live.update(view.render(), refresh=True)
    return 0


async def _follow(checkpointer: Checkpointer, pending: dict[str, tuple[int, str, float]], view: TopView) -> None:
    """Say how the commands sent went, once their kernel has carried them out."""
    for command_id, (pid, action, sent) in list(pending.items()):
        outcome = await command_outcome(checkpointer, command_id)
        if outcome is not None and outcome.get("state") != "taken":
            view.message = str(outcome.get("message") or f"{action} pid {pid}: {outcome.get('state')}")
            del pending[command_id]
        elif outcome is None and time.monotonic() - sent > COMMAND_PATIENCE:
            view.message = (f"{action} pid {pid}: no live kernel took it (is the kernel that runs pid {pid} "
                            "running, with ringzero's monitor on?)")
            del pending[command_id]
