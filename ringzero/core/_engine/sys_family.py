"""The syscalls between processes (``ctx.send``, ``ctx.spawn``, ``ctx.wait``): mail delivered once,
children created once and given a slice of the budget, ends waited for without a run slot,
here or on another cluster node."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ringzero.core._engine.handles import ProcessHandle, any_handle, handle_of, process_of
from ringzero.core._engine.mailbox import check_message
from ringzero.core._engine.syscall import syscall
from ringzero.core.contract.errors import (
    BudgetExceeded,
    InvalidArgument,
    NonDeterminismError,
    ProcessFailed,
    ProcessNotFound,
)
from ringzero.core.contract.outcomes import NONE, Outcome, Stopped, Value
from ringzero.core.contract.remote import RemoteProcessHandle, SpawnRequest
from ringzero.core.contract.types import JSON, Limits, ProcessStatus, Program, StopReason
from ringzero.core.support.references import check_program, program_reference
from ringzero.core.support.timeouts import fail_after, shielded

if TYPE_CHECKING:
    from ringzero.core._engine.process import Process

__all__ = ["send", "spawn", "wait"]


async def send(process: Process, to: int | ProcessHandle | RemoteProcessHandle, message: JSON, *,
               priority: int = 10) -> None:
    """``Context.send`` (see there), for ``process``."""
    pid = to.pid if isinstance(to, (ProcessHandle, RemoteProcessHandle)) else to
    runtime = process.runtime
    check_message(pid, message, priority)
    # Whether the target can take it is asked only live: a replayed send was delivered, to a
    # process that may have ended since. The id is the send's place in program order, the
    # same when the program is re-run, so a send that was delivered but not yet journaled
    # when the host died is not delivered twice (``Runtime.deliver``).
    mail_id = process.next_send()

    async def live() -> Outcome:
        await runtime.deliver(pid, message, priority, sender=process.pid, mail_id=mail_id,
                              maybe_delivered=process.recovered)
        return NONE

    await syscall(process, "send", {"to": pid, "message": message, "priority": priority}, f"to {pid}", live)


async def spawn(
    process: Process,
    program: Program,
    *args: JSON,
    name: str | None = None,
    priority: int | None = None,
    limits: Limits | None = None,
) -> ProcessHandle | RemoteProcessHandle:
    """``Context.spawn`` (see there), for ``process``."""
    runtime = process.runtime
    check_program(program, args)
    child_limits = process.meter.carve(limits)
    child_priority = process.record.priority if priority is None else priority

    created: list[int] = []
    placed: list[RemoteProcessHandle] = []
    spawn_id = process.next_spawn()

    async def live() -> Outcome:
        orphan = runtime.spawned_before_crash(process, spawn_id)
        if orphan is not None:  # created before the host died, but the spawn was not journaled
            return Value(orphan)
        if runtime.cluster.child_placement is not None:
            request = SpawnRequest(program=program_reference(program)[0], args=list(args),
                                   name=name or program.__name__, priority=child_priority, limits=child_limits)
            remote = await runtime.cluster.child_placement.place_child(request, parent=process.pid)
            if remote is not None:
                placed.append(remote)
                process.adopt_remote_child(remote, child_limits)
                return Value(remote.pid)
        child = await runtime.spawn_process(program, args, name=name, priority=child_priority,
                                            limits=child_limits, parent=process.pid, spawn_id=spawn_id)
        created.append(child.pid)  # create() registered it with this process already
        return Value(child.pid)

    reference = program_reference(program)[0]
    fp = {"program": reference, "args": list(args), "name": name, "priority": child_priority,
          "limits": child_limits.to_dict()}
    outcome = await syscall(process, "spawn", fp, reference, live)
    child_pid = outcome.value if isinstance(outcome, Value) else None
    if not isinstance(child_pid, int):
        raise NonDeterminismError(f"pid {process.pid}: the spawn recorded here holds no pid: {outcome!r:.200}")
    if placed:
        return placed[0]
    if not created:  # replayed after a crash: the child was loaded by recover(), or has ended
        await runtime.adopt(process, child_pid, child_limits)
    try:
        handle = await handle_of(runtime, child_pid)
    except ProcessNotFound:
        # Replayed, and the child runs on another node: follow it from here.
        remote = None if created else await runtime.cluster.remote_handle(child_pid)
        if remote is None:
            raise
        if child_pid in process.children:
            process.adopt_remote_child(remote, process.children[child_pid])
        return remote
    if not created:
        process.keep_child(process_of(handle))
    return handle


async def wait(process: Process, child: ProcessHandle | RemoteProcessHandle | int,
               timeout: float | None = None) -> JSON:
    """``Context.wait`` (see there), for ``process``."""
    runtime = process.runtime

    if isinstance(child, bool) or not isinstance(child, (int, ProcessHandle, RemoteProcessHandle)):
        raise InvalidArgument(f"ctx.wait takes a child's handle or pid (a pid is an integer), not {child!r:.60}")
    pid = child if isinstance(child, int) else child.pid
    target = child if not isinstance(child, int) else await any_handle(runtime, pid)

    async def live(left: float | None) -> Outcome:
        if isinstance(target, RemoteProcessHandle):
            ended = await target.ended(left)
            process.remote_child_ended(target.pid, ended)  # as a local child's end does
            status, reason, detail, result = (ProcessStatus(ended["status"]), ended.get("stop_reason"),
                                              ended.get("error"), ended.get("result"))
        else:
            async with fail_after(left):
                await shielded(process_of(target).finished)
            record = process_of(target).record
            status, result = record.status, record.result
            reason = None if record.stop_reason is None else record.stop_reason.value
            detail = dict(record.error) if record.error else None
        if status is ProcessStatus.EXITED:
            return Value(result)
        return Stopped(status.value, reason, detail)

    outcome = await syscall(process, "wait", {"pid": pid}, str(pid), live, waits=True, timeout=timeout)
    if isinstance(outcome, Stopped):
        reason = StopReason(outcome.reason) if outcome.reason else None
        failed = BudgetExceeded if reason and reason.value.startswith("budget_") else ProcessFailed
        raise failed(target.pid, outcome.status, reason, outcome.detail)
    return outcome.value if isinstance(outcome, Value) else None
