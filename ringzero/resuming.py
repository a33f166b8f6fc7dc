"""``ringzero resume``, ``ringzero serve`` and ``ringzero send``: finishing what a crash left.

``resume`` runs every unfinished process in a store until each has ended or waits for
something only the outside world gives (a message, a resume, a child that waits so) or a timer
further off than ``HORIZON``, then stops, leaving those durable in the store (a timer's
deadline with it), and reports what it did, counted from the store: syscalls replayed from the
journal, made live, and calls in doubt with how each was settled, and when each sleeper wakes.

``serve`` (``resume --serve``) goes on: once everything left waits, it lets the processes go
(none is held in memory) and watches the store; a message sent to one (``ringzero send`` or
``Kernel.send`` from any OS process), or the first timer falling due, resumes them again,
until every process has ended.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import inspect
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.table import Table

from ringzero.core.contract.errors import InvalidArgument, NotResumed, RingzeroError
from ringzero.core.contract.outcomes import InDoubt
from ringzero.core.contract.records import received_seq

if TYPE_CHECKING:
    from ringzero.core.contract.store import KernelStore
    from ringzero.core.kernel import Kernel, ProcessHandle

__all__ = ["FACTORY_SIGNATURE", "KernelFactory", "StoreCounts", "build_kernel", "check_factory", "parse_message",
           "resume", "send", "serve"]

KernelFactory = Callable[[Any], "Kernel"]

FACTORY_SIGNATURE = ("def make_kernel(db):  # db: a pathlib.Path (SQLite) or a postgresql:// DSN string\n"
                     "    return Kernel(checkpointer=SqliteCheckpointer(db), llm=..., tools=..., executor=...)")
"""What ``--kernel module:function`` names, as its help and its errors show it."""

HORIZON = 10.0
"""Seconds ahead within which a timer's firing is waited for by ``resume``: a sleep, or a
``recv``/``wait`` timeout, that fires later leaves the resume free to stop (it says when it
wakes), and ``serve`` wakes it when it is due."""

IDLE_CHECKS = 3
"""Looks in a row (a tenth of a second apart) that must find every process waiting on the
outside before a resume stops: a message just delivered is received meanwhile."""


def check_factory(factory: Any, spec: str) -> KernelFactory:
    """``factory`` if it is a function taking the database; InvalidArgument showing the
    signature otherwise."""
    if not callable(factory):
        raise InvalidArgument(f"--kernel {spec!r} is not a function; it must be one like\n{FACTORY_SIGNATURE}")
    try:
        inspect.signature(factory).bind(Path("state.db"))
    except TypeError as exc:
        raise InvalidArgument(f"--kernel {spec!r} cannot be called with the database ({exc}); it must be a function "
                              f"like\n{FACTORY_SIGNATURE}") from None
    except ValueError:  # no signature to read (a builtin): called as it is
        pass
    made: KernelFactory = factory
    return made


def build_kernel(factory: KernelFactory, db: Path | str, spec: str | None) -> Kernel:
    from ringzero.core.kernel import Kernel

    kernel = factory(db)
    if not isinstance(kernel, Kernel):
        raise InvalidArgument(f"--kernel {spec!r} returned {type(kernel).__name__}, not a ringzero Kernel; it must be "
                              f"a function like\n{FACTORY_SIGNATURE}")
    return kernel


@dataclass
class StoreCounts:
    """What a store's journals hold of some processes: top-level syscalls recorded, tool calls
    recorded under execs, and in-doubt calls, raised to the program or run again."""

    syscalls: int = 0
    code_calls: int = 0
    in_doubt_raised: int = 0
    in_doubt_rerun: int = 0

    def __sub__(self, other: StoreCounts) -> StoreCounts:
        return StoreCounts(self.syscalls - other.syscalls, self.code_calls - other.code_calls,
                           self.in_doubt_raised - other.in_doubt_raised, self.in_doubt_rerun - other.in_doubt_rerun)

    @classmethod
    async def read(cls, store: KernelStore, pids: Sequence[int]) -> StoreCounts:
        counts = cls()
        for pid in pids:
            for entry in await store.journal(pid):
                counts.syscalls += 1
                counts.in_doubt_raised += isinstance(entry.outcome, InDoubt)
                counts.in_doubt_rerun += "rerun" in entry.outcome.beside
            for call in (await store.effects(pid)).calls.values():
                counts.code_calls += 1
                counts.in_doubt_rerun += "rerun" in call.outcome.beside
        return counts


@dataclass
class Ends:
    """How each resumed process stood when the resume stopped."""

    finished: dict[int, str]
    failed: dict[int, str]
    unfinished: dict[int, str]
    waiting: dict[int, str]
    """pid -> what it waits for: ``message``, ``resume`` (paused), ``child`` or ``timer``."""
    wakes: dict[int, float] = field(default_factory=dict)
    """pid -> when (wall clock) the timer of a waiting process fires, where it waits on one."""
    done: StoreCounts | None = None
    """What the resume recorded, counted from the store."""


async def resume(kernel: Kernel, console: Console, *, db: str, kernel_spec: str | None) -> tuple[int, Ends]:
    """One resume: every unfinished process, until each has ended or waits on the outside.
    Returns the exit code (1 where something failed or could not be resumed) and the ends."""
    async with kernel:
        unfinished = [r.pid for r in await kernel.store.load_processes() if not r.status.terminal]
        before = await StoreCounts.read(kernel.store, unfinished)
        handles = await kernel.recover()
        console.print(f"found {len(handles)} unfinished process(es)")
        ends = await _follow(kernel, handles, console)
        await kernel.flush()
        done = ends.done = await StoreCounts.read(kernel.store, unfinished) - before
    replayed = sum(h.replayed_syscalls for h in handles)
    _report(console, handles, ends, done, replayed, db=db, kernel_spec=kernel_spec)
    return (1 if ends.failed or ends.unfinished else 0), ends


async def serve(make: Callable[[], Kernel], console: Console, *, db: str, kernel_spec: str | None,
                poll: float = 0.5) -> int:
    """Resume, then host: whenever the processes left all wait on the outside, let them go and
    watch the store; a new message to one, or a new unfinished process, resumes them again.
    Ends once no process is unfinished (0), or where one failed or could not be resumed (1)."""
    while True:
        code, ends = await resume(make(), console, db=db, kernel_spec=kernel_spec)
        if code or not ends.waiting:
            return code
        due = min(ends.wakes.values(), default=None)
        console.print(f"serving: {len(ends.waiting)} process(es) wait; none is held in memory. Watching the store "
                      "for messages (ringzero send)" + ("" if due is None else f" and for the first timer, due at "
                                                        f"{_when(due)}") + " ...")
        paused = [pid for pid, why in ends.waiting.items() if why == "resume"]
        async with make() as watcher:
            seen = await _mail_marks(watcher.store)
            # Mail stored while the resume ran (after a process had read its mailbox) wakes them now.
            while not await _unread_mail(watcher.store, ends.waiting):
                left = None if due is None else due - time.time()
                if left is not None and left <= 0:
                    break
                # Another OS process writes the store: only a read tells.
                await asyncio.sleep(poll if left is None else min(poll, left))
                if await _mail_marks(watcher.store) != seen or await _resumed(watcher, paused):
                    break


async def _resumed(kernel: Kernel, paused: Sequence[int]) -> bool:
    """Carry out the resume commands (``ringzero top``'s ``r``) left for ``paused``, processes
    that wait in the store: each is marked not paused there, for the next wake-up to run."""
    from ringzero.core.support.monitor import take_stored_commands

    if not paused or not kernel.checkpointer.capabilities.claims:
        return False
    taken = await take_stored_commands(kernel.checkpointer, paused, "resume", "ringzero serve")
    for pid in taken:
        record = await kernel.store.load_process(pid)
        if record is not None and not record.status.terminal:
            record.set_paused(False)
            await kernel.store.put_rows([kernel.store.status_row(record)])
    return bool(taken)


async def _unread_mail(store: KernelStore, waiting: Mapping[int, str]) -> bool:
    """Whether a process that waits for a message has one in the store that it has not received."""
    for pid, why in waiting.items():
        if why != "message":
            continue
        received = {received_seq(e) for e in await store.journal(pid)}
        if any(seq not in received for seq, _ in await store.mail(pid)):
            return True
    return False


async def _mail_marks(store: KernelStore) -> dict[int, int]:
    """The last mail seq of every unfinished process: what changes when one gets a message."""
    return {r.pid: await store.last_seq(r.pid, "mailbox") for r in await store.load_processes()
            if not r.status.terminal}


async def _follow(kernel: Kernel, handles: Sequence[ProcessHandle], console: Console) -> Ends:
    """Follow the resumed processes (a live table in a terminal, a line as each ends) until each
    has ended or every live one waits on the outside world."""
    from rich.live import Live

    ends = Ends({}, {}, {}, {})

    async def follow(handle: ProcessHandle) -> None:
        try:
            value = await handle.wait()
            ends.finished[handle.pid] = repr(value)
            said = repr(value)
        except NotResumed as exc:
            ends.unfinished[handle.pid] = str(exc.cause)
            said = f"[bold red]not resumed[/]: {exc.cause}"
        except RingzeroError as exc:
            ends.failed[handle.pid] = str(exc)
            said = str(exc)
        console.print(f"  pid {handle.pid} {handle.name}: {said} (replayed {handle.replayed_syscalls}, made live "
                      f"{handle.live_syscalls})")

    def table() -> Table:
        view = Table(title="resuming", title_justify="left")
        for column in ("pid", "name", "status", "replayed", "live", "syscall now"):
            view.add_column(column, justify="right" if column in ("pid", "replayed", "live") else "left")
        for h in handles:
            view.add_row(str(h.pid), h.name, h.status.value, str(h.replayed_syscalls), str(h.live_syscalls),
                         h.syscall_now or "")
        return view

    followers = {asyncio.ensure_future(follow(h)) for h in handles}
    quiet = 0
    with Live(table(), console=console, refresh_per_second=4, transient=True,
              redirect_stdout=False) if console.is_terminal else contextlib.nullcontext() as live:
        while followers:
            _, followers = await asyncio.wait(followers, timeout=0.1)
            if live is not None:
                live.update(table())
            waits = kernel.idle_for_outside(HORIZON)
            quiet = quiet + 1 if waits else 0
            if quiet >= IDLE_CHECKS:
                ends.waiting.update(waits)
                ends.wakes.update((h.pid, h.wake_at.timestamp()) for h in handles
                                  if h.pid in waits and h.wake_at is not None)
                break
    for follower in followers:
        follower.cancel()
    await asyncio.gather(*followers, return_exceptions=True)
    return ends


def _report(console: Console, handles: Sequence[ProcessHandle], ends: Ends, done: StoreCounts, replayed: int, *,
            db: str, kernel_spec: str | None) -> None:
    waiting = sum(w == "message" for w in ends.waiting.values())
    paused = sum(w == "resume" for w in ends.waiting.values())
    children = sum(w == "child" for w in ends.waiting.values())
    sleeping = sum(w == "timer" for w in ends.waiting.values())
    in_doubt = done.in_doubt_raised + done.in_doubt_rerun
    resumed = len(handles) - len(ends.unfinished)
    console.print(
        f"resumed {resumed} process(es): {len(ends.finished)} finished, {len(ends.failed)} failed, {waiting} waiting "
        f"for a message, {paused} paused, {children} waiting for a child, {sleeping} asleep; {replayed} recorded "
        f"syscall(s) replayed from the journal (no LLM call or tool run made again), {done.syscalls} made live, "
        f"{done.code_calls} tool call(s) from code recorded; {in_doubt} call(s) in doubt: {done.in_doubt_rerun} run "
        f"again (idempotent, or under their idempotency key), {done.in_doubt_raised} raised as ToolInDoubt in the "
        "program")
    kernel_flag = f" --kernel {kernel_spec}" if kernel_spec else ""
    for pid, why in sorted(ends.waiting.items()):
        wakes = ends.wakes.get(pid)
        until = "" if wakes is None else f" (its timeout fires at {_when(wakes)})"
        if why == "message":
            console.print(f"  pid {pid} waits for a message{until}: ringzero send --db {db} {pid} '<JSON>', then "
                          f"ringzero resume --db {db}{kernel_flag} (or keep ringzero serve --db {db}{kernel_flag} "
                          "running)")
        elif why == "timer" and wakes is not None:
            console.print(f"  pid {pid} sleeps until {_when(wakes)}: ringzero resume --db {db}{kernel_flag} after "
                          f"that wakes it (or keep ringzero serve --db {db}{kernel_flag} running, which wakes it then)")
        elif why == "resume":
            console.print(f"  pid {pid} is paused: it stays so in the store; resume it with ringzero top --db {db} "
                          f"(key r) while ringzero serve --db {db}{kernel_flag} runs")
    if ends.unfinished:
        hint = (" No --kernel was given: the default kernel has no LLM provider and no tools; pass --kernel "
                "module:function returning your configured Kernel.") if kernel_spec is None else ""
        console.print(f"[bold red]{len(ends.unfinished)} process(es) could not be resumed[/] and are left unfinished "
                      f"in the store, as they were; a resume with what they need finishes them.{hint}")


def _when(deadline: float) -> str:
    """A wall-clock deadline as a reader wants it: local time, and how far off it is."""
    at = datetime.datetime.fromtimestamp(deadline).astimezone()
    left = deadline - time.time()
    off = f"in {left:.0f} s" if left < 120 else f"in {left / 60:.0f} min" if left < 7200 else f"in {left / 3600:.1f} h"
    return f"{at.isoformat(timespec='seconds')} ({off})" if left > 0 else f"{at.isoformat(timespec='seconds')} (due)"


def parse_message(text: str) -> Any:
    """The JSON a ``ringzero send`` command line gives; InvalidArgument naming what is wrong."""
    import json

    try:
        return json.loads(text)
    except ValueError as exc:
        raise InvalidArgument(f"the message must be JSON (quote a string: '\"yes\"'), not {text!r}: {exc}") from None


async def send(kernel: Kernel, pid: int, message: Any, priority: int, console: Console) -> int:
    async with kernel:
        await kernel.send(pid, message, priority=priority)
    console.print(f"sent to pid {pid}")
    return 0
