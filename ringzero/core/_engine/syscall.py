"""The syscall boundary: every effect a program has passes here.

A syscall takes its journal slot in program order before its first await; a recorded one is
served from the journal (a resumed program makes no call twice), a live one passes the
process's boundary (pause, the scheduler's turn) and its budgets, and runs inside its span
through the effect engine (``ringzero.core._engine.effect.perform``: its intent where it is an effect
on the world, its live run, its record before the program sees it).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from ringzero.core._engine.effect import perform
from ringzero.core.contract.errors import CheckpointerError, Fenced
from ringzero.core.contract.fingerprints import fingerprint
from ringzero.core.contract.outcomes import Outcome
from ringzero.core.contract.types import ProcessStatus
from ringzero.core.support.live import RUNNING_LIVE, ReplayEnded

if TYPE_CHECKING:
    from ringzero.core._engine.process import Process

__all__ = ["syscall", "wait_begins", "wait_ends"]


async def syscall(
    process: Process,
    kind: str,
    args: Any,
    summary: str,
    live: Callable[..., Awaitable[Outcome]],
    *,
    needs: tuple[tuple[str, float], ...] = (),
    waits: bool = False,
    timeout: float | None = None,
    until: float | None = None,
    fp: str | None = None,
    about: Callable[[], dict[str, Any]] | None = None,
    retry_safe: Callable[[], bool] | None = None,
    slotted: bool = False,
) -> Outcome:
    """Run one syscall through the boundary, the journal and the budgets.

    ``needs`` are (resource, amount) that must be left before the call; ``waits`` marks
    syscalls that block on an event (recv, sleep, wait), which give their run slot back: their
    ``live`` takes the seconds it may wait (None: no limit). Those come from a durable timer:
    ``until`` (a wall-clock deadline the call names itself: ``sleep_until``) or ``timeout``
    seconds from when the syscall first ran live, a deadline journaled then (``Journal.timer``),
    so a program resumed after a crash waits only what was left, and one whose deadline passed
    meanwhile goes on at once. ``fp``
    is ``fingerprint(args)`` where the caller has a faster way to it (``ctx.llm``);
    ``about`` gives the attributes of the syscall's span, called only where telemetry is on.
    ``retry_safe`` marks a call with an effect on the world (a tool): its intent is recorded
    before it runs, and on resume one in flight at the crash is in doubt; ``retry_safe()`` says
    whether it may run again (else the outcome is ``InDoubt``, recorded, and the
    caller raises ``ToolInDoubt``). ``live`` may read its slot (``current_slot``) where it is
    such an effect or ``slotted`` (an exec, whose tool calls are named by it).
    """
    if process.fenced is not None:
        raise asyncio.CancelledError("fenced")
    if process.record.stop_reason is not None:
        process.stop_now(process.record.stop_reason)
    _charge_step(process)
    if process.meter.limited:
        for resource, amount in needs:
            reason = process.meter.crossed(resource, about_to_add=amount)
            if reason is not None:
                process.stop_now(reason)
    if RUNNING_LIVE.get() is process:
        # Made from inside another syscall's live run (a tool that asks the model): the
        # enclosing record holds its effect, so it takes no slot and a replay, which serves
        # that record, never makes it. Journaling it too would shift every later slot.
        return await live()
    # The journal slot is taken before the first await: program order, not finishing order.
    if fp is None:
        fp = fingerprint(args)
    journal = process.journal
    seq, outcome = journal.take_slot(kind, fp, summary)
    if outcome is None:
        if process.runtime.replay_only:
            raise ReplayEnded(process.pid, seq, kind)
        if process.pause_pending or process.runtime.scheduler.should_yield(process.pid, process.record.priority):
            await _boundary(process)
        current = process.syscall_began(kind, summary)
        try:
            if journal.owner is not None:
                await journal.check_owner()
            # Live, inside its span where telemetry is on. A waiting syscall (recv, sleep,
            # wait) runs the kernel's own code, which makes no syscall, so it is not marked
            # as running live (a token less held by every idle process).
            telemetry = process.runtime.telemetry
            opened = telemetry.syscall_opened(process, kind, seq, summary, about)
            try:
                if waits:
                    if timeout:  # a poll (timeout 0) sets no timer: there is nothing of it to resume
                        until = await journal.timer(seq, kind, fp, summary, timeout)
                    if until is not None:
                        telemetry.timer_set(opened, until)
                    left = 0.0 if timeout == 0 else None if until is None else max(0.0, until - time.time())
                    process.waits_for(kind, until)
                    await wait_begins(process)
                    waiting = live(left)
                    del live  # the bound method (``Mailbox.receive``): an object less per idle process
                    try:
                        outcome = await waiting
                    finally:
                        process.done_waiting()
                    await wait_ends(process)
                    outcome = await journal.fill(seq, kind, fp, summary, outcome)
                else:
                    token = RUNNING_LIVE.set(process)
                    try:
                        outcome = await perform(journal, seq, kind, fp, summary, live, retry_safe=retry_safe,
                                                slotted=slotted)
                    finally:
                        RUNNING_LIVE.reset(token)
            except BaseException as exc:
                telemetry.syscall_closed(opened, process, kind, None, exc)
                raise
            telemetry.syscall_closed(opened, process, kind, outcome, None)
        except CheckpointerError as exc:
            # The store could not record the syscall (or what it needed): the program must not
            # go on as if it had happened. It stops unfinished, for recover() to resume.
            process.leave_unfinished(exc)
        except Fenced as exc:
            # Another kernel owns the process now; whatever the program would do next is
            # its to do. Unwound as a cancellation, which a program does not catch.
            process.fence(exc)
            raise asyncio.CancelledError("fenced") from exc
        finally:
            process.syscall_ended(current)
    elif process.span is not None:
        process.runtime.telemetry.replayed(process.span, kind, seq)
    return outcome


def _charge_step(process: Process) -> None:
    meter = process.meter
    if not meter.limited:
        meter.charge_one("steps", 1)
        return
    reason = meter.crossed("steps", about_to_add=1)
    if reason is not None:
        process.stop_now(reason)
    meter.charge_one("steps", 1)
    process.check_budget()


async def _boundary(process: Process) -> None:
    """Where pause takes effect and equal-or-higher-priority processes get their turn."""
    resumed = process.resumed
    if resumed is not None:
        process.release_slot()
        process.park()  # before the PAUSED record is written, so it holds the wall time that stands still
        try:
            await process.move_to(ProcessStatus.PAUSED)
            await resumed.wait()
        finally:
            process.unpark()
        await process.move_to(ProcessStatus.READY, "resumed")
        await process.acquire_slot()
        await process.move_to(ProcessStatus.RUNNING)
    elif process.runtime.scheduler.should_yield(process.pid, process.record.priority):
        process.release_slot()
        await process.move_to(ProcessStatus.READY, "yielded")
        await process.acquire_slot()
        await process.move_to(ProcessStatus.RUNNING)

async def wait_begins(process: Process) -> None:
    """Before a syscall that blocks on an event (``waits``): the run slot goes back. Awaited
    before the wait, not around it, so no coroutine of its own sits in the await chain of
    every idle process."""
    process.release_slot()
    await process.move_to(ProcessStatus.WAITING)

async def wait_ends(process: Process) -> None:
    """After it: ready, then running once a slot is free again."""
    await process.move_to(ProcessStatus.READY)
    await process.acquire_slot()
    await process.move_to(ProcessStatus.RUNNING)
