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
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import astuple, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.table import Table

from ringzero.core.contract.errors import InvalidArgument, NotResumed, RingzeroError
from ringzero.core.contract.outcomes import InDoubt
from ringzero.core.support.timeouts import wait_until_set

if TYPE_CHECKING:
    from ringzero.core.contract.store import KernelStore
    from ringzero.core.kernel import Event, Kernel, ProcessHandle

__all__ = ["FACTORY_SIGNATURE", "KernelFactory", "Start", "StoreCounts", "build_kernel", "check_factory", "fork_one",
           "parse_message", "recover_all", "resume", "retry_one", "send", "serve"]

KernelFactory = Callable[[Any], "Kernel"]

FACTORY_SIGNATURE = ("def make_kernel(db):  # db: a pathlib.Path (SQLite), or a URL string (postgresql://, "
                     "a registered store's)\n"
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

    try:
        kernel = factory(db)
    except RingzeroError:
        raise
    except Exception as exc:  # the user's factory: its error, in one line, not a traceback of ours
        raise InvalidArgument(f"--kernel {spec!r} raised {type(exc).__name__}: {exc}") from None
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

    def __add__(self, other: StoreCounts) -> StoreCounts:
        return StoreCounts(*(a + b for a, b in zip(astuple(self), astuple(other), strict=True)))

    def __sub__(self, other: StoreCounts) -> StoreCounts:
        return StoreCounts(*(a - b for a, b in zip(astuple(self), astuple(other), strict=True)))

    @classmethod
    async def read(cls, store: KernelStore, pids: Sequence[int], *, below: int | None = None) -> StoreCounts:
        """The counts of ``pids``' records (of slots before ``below`` only, where given)."""
        counts = cls()
        for pid in pids:
            for entry in await store.journal(pid):
                if below is None or entry.seq < below:
                    counts.syscalls += 1
                    counts.in_doubt_raised += isinstance(entry.outcome, InDoubt)
                    counts.in_doubt_rerun += "rerun" in entry.outcome.beside
            for call in (await store.effects(pid)).calls.values():
                if below is None or call.seq < below:
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


Start = Callable[["Kernel"], Awaitable[tuple[list["ProcessHandle"], StoreCounts]]]
"""What a resume starts: the handles of the processes it runs, and what their records held
before (the ``StoreCounts`` the report subtracts)."""


async def recover_all(kernel: Kernel) -> tuple[list[ProcessHandle], StoreCounts]:
    """``ringzero resume``: every unfinished process."""
    unfinished = [r.pid for r in await kernel.store.load_processes() if not r.status.terminal]
    before = {pid: await StoreCounts.read(kernel.store, [pid]) for pid in unfinished}
    handles = await kernel.recover()
    return handles, sum((before.get(h.pid, StoreCounts()) for h in handles), StoreCounts())


def retry_one(pid: int) -> Start:
    """``ringzero retry PID``: the failed process ``pid``, from its journal."""
    async def start(kernel: Kernel) -> tuple[list[ProcessHandle], StoreCounts]:
        before = await StoreCounts.read(kernel.store, [pid])
        return [await kernel.retry(pid)], before
    return start


def fork_one(pid: int, at: int) -> Start:
    """``ringzero fork PID --at SLOT``: a new process, ``pid``'s journal up to ``at`` copied."""
    async def start(kernel: Kernel) -> tuple[list[ProcessHandle], StoreCounts]:
        before = await StoreCounts.read(kernel.store, [pid], below=at)  # what the copy holds
        return [await kernel.fork(pid, at=at)], before
    return start


async def resume(kernel: Kernel, console: Console, *, db: str, kernel_spec: str | None,
                 start: Start = recover_all) -> tuple[int, Ends]:
    """One resume: every unfinished process (or what ``start`` starts), until each has ended or
    waits on the outside. Returns the exit code (1 where something failed or could not be
    resumed) and the ends."""
    async with kernel:
        handles, before = await start(kernel)
        console.print(f"found {len(handles)} unfinished process(es)" if start is recover_all else
                      "started " + ", ".join(f"pid {h.pid}" for h in handles))
        for pid, holder in sorted(kernel.runtime.held_elsewhere.items()):
            console.print(f"  pid {pid}: run by another live kernel ({holder}), left alone")
        ends = await _follow(kernel, handles, console)
        await kernel.flush()
        done = ends.done = await StoreCounts.read(kernel.store, [h.pid for h in handles]) - before
    replayed = sum(h.replayed_syscalls for h in handles)
    _report(console, handles, ends, done, replayed, db=db, kernel_spec=kernel_spec)
    return (1 if ends.failed or ends.unfinished else 0), ends


LET_GO_AFTER = 1.0
"""Seconds a process served by ``serve`` waits for a message or on a timer before it is let go."""


async def serve(make: Callable[[], Kernel], console: Console, *, db: str, kernel_spec: str | None,
                poll: float = 0.5) -> int:
    """Host the store's unfinished processes in one kernel, and fire its schedules, until every
    process has ended and no schedule is left (``Kernel.fire_schedules``): processes that
    wait for a message or on a timer are let go (``Kernel.let_go_waiting``: no task, no memory,
    their status row saying what they wait on) and brought back when a message comes for one
    (``ringzero send``, ``Kernel.send`` from any OS process) or its timer is due, so that a wake-up
    replays only its own process. Ends with 0, or 1 where a process failed or could not be resumed."""
    kernel = make()
    keeper = kernel.let_go_waiting(LET_GO_AFTER)
    failed: list[int] = []
    an_end = asyncio.Event()

    def ended(event: Event) -> None:
        if event.kind == "transition" and event.data.get("to") in ("exited", "failed", "killed"):
            if event.data["to"] != "exited":
                failed.append(event.pid)
            console.print(f"  pid {event.pid}: {event.data['to']}")
            an_end.set()

    async with kernel:
        await kernel.start()
        kernel.subscribe(ended)
        firer = kernel.fire_schedules()
        let_go, handles = await keeper.adopt()
        unfinished = [h for h in handles if h.status.value not in ("exited", "failed", "killed") and h.elsewhere]
        console.print(f"found {len(let_go) + len(handles)} unfinished process(es): {len(let_go)} waiting in the "
                      f"store for a message or a timer (let go, not replayed), {len(handles)} resumed")
        for handle in unfinished:
            console.print(f"  pid {handle.pid} {handle.name}: [bold red]not resumed[/]")
        for handle in handles:
            if handle.info().status.value == "paused":
                console.print(f"  pid {handle.pid} is paused: resume it with ringzero top --db {db} (key r)")
        console.print("serving: a process that waits for a message or a timer is let go (none is held in memory) "
                      "and brought back when one comes for it (ringzero send) or its timer is due ...")
        schedules = await kernel.schedules()
        if schedules:
            console.print(f"firing {len(schedules)} schedule(s): " + ", ".join(
                f"{s.name} (next {s.next_firing.isoformat(timespec='seconds') if s.next_firing else 'paused'})"
                for s in schedules))
        # A process leaves the table a moment after its end's event: looked at again then.
        while kernel.hosting or await kernel.schedules() or await firer.unsettled():
            an_end.clear()
            await wait_until_set(an_end, poll)
    console.print("every process has ended" + (f"; {len(failed)} did not exit" if failed else ""))
    return 1 if failed or unfinished else 0


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
        f"again (idempotent, or under their idempotency key), {done.in_doubt_raised} left to the program (raised "
        "as ToolInDoubt, or told to the model where a tool node has in_doubt=\"report\")")
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


def parse_message(text: str, what: str = "the message") -> Any:
    """The JSON a command line gives (``ringzero send``'s message, ``settle --result``);
    InvalidArgument naming what is wrong."""
    import json

    try:
        return json.loads(text)
    except ValueError as exc:
        raise InvalidArgument(f"{what} must be JSON (quote a string: '\"yes\"'), not {text!r}: {exc}") from None


async def send(kernel: Kernel, pid: int, message: Any, priority: int, console: Console) -> int:
    """Send, and say what becomes of the message: read now by a process waiting for one, or at
    its next ``ctx.recv``."""
    async with kernel:
        await kernel.send(pid, message, priority=priority)
        record = await kernel.store.load_process(pid)
    waiting = record is not None and record.waiting is not None and record.waiting[0] == "message"
    if waiting:
        console.print(f"sent to pid {pid}, which waits for it: its host reads it now (none hosts it? ringzero resume "
                      "or ringzero serve delivers it)")
    else:
        status = record.status.value if record is not None else "unknown"
        console.print(f"sent to pid {pid}, which does not wait for a message now ({status}): it reads it at its "
                      "next ctx.recv()")
    return 0
