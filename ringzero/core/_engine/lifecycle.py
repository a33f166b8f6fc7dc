"""A process's life as its task lives it: it starts, runs its program (again from the top for
each ``continue_as_new``), and ends, its end recorded before anybody waiting is woken."""

from __future__ import annotations

import asyncio
import traceback
from typing import TYPE_CHECKING

from ringzero.core._engine.context import Context, enter
from ringzero.core._engine.new_run import ContinueAsNew, begin_new_run
from ringzero.core._engine.session import close_sessions, open_sessions
from ringzero.core.contract.errors import (
    CheckpointerError,
    KernelInterrupt,
    NonDeterminismError,
    NotResumed,
    NotSerializable,
)
from ringzero.core.contract.types import ProcessStatus, StopReason, ensure_json, json_form, json_problem
from ringzero.core.support.live import ReplayEnded

if TYPE_CHECKING:
    from ringzero.core._engine.process import Process

__all__ = ["finish", "launch", "run", "run_in_span"]


def launch(process: Process) -> None:
    """Start ``process``'s task. Without telemetry the task runs ``run`` itself: one coroutine
    fewer in the await chain every idle process holds."""
    process.start(run_in_span(process) if process.runtime.telemetry.enabled else run(process))


async def run_in_span(process: Process) -> None:
    """``run`` inside the process's span."""
    process.entering()
    telemetry = process.runtime.telemetry
    process.traced(telemetry.process_started(process, process.span_parent))
    try:
        await run(process)
    finally:
        span = process.span
        if span is not None:
            process.traced(None)
            telemetry.process_ended(span, process)


async def run(process: Process) -> None:
    process.entering()
    status, reason, error = ProcessStatus.EXITED, StopReason.RETURNED, None
    try:
        if process.record.stop_reason is not None:  # stopped before it ever ran
            raise asyncio.CancelledError(process.record.stop_reason.value)
        await process.move_to(ProcessStatus.READY)
        await process.acquire_slot()
        await process.move_to(ProcessStatus.RUNNING, "recovered" if process.journal.length else "")
        process.arm_watchdog()
        ctx = Context(process)
        enter(ctx)  # this task's context: programs and the tasks they start see it
        while True:
            try:
                process.returned(await process.program(ctx, *process.record.args))
                break
            except ContinueAsNew as again:
                await begin_new_run(process, again)
    except asyncio.CancelledError:
        if process.fenced is None and process.left_unfinished is None and process.record.stop_reason is None:
            # The kernel is shutting down: leave the record as a crash would, so that
            # recover() resumes this process later.
            raise
    except NonDeterminismError as exc:
        status, reason, error = ProcessStatus.FAILED, StopReason.NON_DETERMINISM, _error_info(exc)
    except ReplayEnded as exc:  # a replay check's process, stopped at the end of its journal
        status, reason, error = ProcessStatus.FAILED, StopReason.RAISED, _error_info(exc)
    except (Exception, KernelInterrupt) as exc:  # ToolInDoubt, unhandled, ends the program as any error
        status, reason, error = ProcessStatus.FAILED, StopReason.RAISED, _error_info(exc)
    finally:
        process.release_slot()
        process.disarm_watchdog()
        if open_sessions(process):
            await close_sessions(process)
    if process.fenced is not None or process.left_unfinished is not None:
        # Fenced: the new owner finishes it; this kernel lets go, silently. Left unfinished:
        # recover() finishes it, once the kernel has what it needs or the store is back.
        if process.left_unfinished is not None:
            if isinstance(process.left_unfinished, NotResumed):
                await process.back_as_loaded()
            await process.runtime.flush()  # its transitions so far, as a shutdown leaves them
        process.end_unfinished()
        return
    if process.record.stop_reason is not None:  # killed, or a budget ran out
        status, reason = ProcessStatus.KILLED, process.record.stop_reason
    try:
        await finish(process, status, reason, error)
    except CheckpointerError as exc:  # its end is not recorded: it is not over, for recover()
        process.unfinished_because(exc)
        process.end_unfinished()
        return
    # Ended and recorded: its task, done now, is let go with its coroutine and its context
    # (five objects for the garbage collector to walk in every process a handle still
    # holds). A task that ends with an exception is kept, for whoever awaits it.
    process.let_go_of_task()


async def finish(process: Process, status: ProcessStatus, reason: StopReason, error: dict[str, str] | None) -> None:
    """Record the end of the process, refund its parent, and wake its waiters.

    Nothing cancels this (request_stop leaves a finishing process alone), and waiters are
    woken even if the store fails, with that failure.
    """
    process.finishing_now()
    record = process.record
    state = record.state
    problem = json_problem(state, "ctx.state")
    if problem is not None:  # kept in a JSON form, and the process fails: a resume would see other state
        state = {str(key): json_form(value) for key, value in state.items()}
        if status is ProcessStatus.EXITED:
            status, reason, error = ProcessStatus.FAILED, StopReason.RAISED, _error_info(NotSerializable(problem))
    result = record.result
    if status is ProcessStatus.EXITED:
        try:
            result = ensure_json(process.value, "the program's return value")
        except NotSerializable:
            result = repr(process.value)
    before = process.end_as(reason, error, result, state)
    try:
        # The result with the end, ahead of it: whoever reads an ended status finds what the
        # process left.
        await process.move_to(status, reason.value)
    except BaseException as exc:
        # Not ended: the record is the unfinished one the store holds, for recover() to resume
        # (a stop reason left on it would read as a stop before the program ran again).
        process.not_ended(before)
        process.settle(exc)
        raise
    try:
        process.runtime.child_finished(process)
    finally:  # its end is recorded: its waiters wake, even where the bookkeeping after it failed
        process.settle()


def _error_info(exc: BaseException) -> dict[str, str]:
    return {
        "type": type(exc).__name__,
        "message": str(exc),
        "traceback": "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)),
    }
