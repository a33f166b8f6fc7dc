"""What users hold of a process: its handle.

A handle reaches its process through the kernel that runs it (``Host``: the runtime); it keeps
its process's record in memory for as long as it is held, the runtime does not.
"""

from __future__ import annotations

import asyncio
import datetime
from typing import TYPE_CHECKING, Any

from ringzero.core._engine.mailbox import check_message
from ringzero.core.contract.errors import BudgetExceeded, ProcessFailed, ProcessNotFound, ProcessStateError
from ringzero.core.contract.records import ProcessInfo
from ringzero.core.contract.remote import RemoteProcessHandle
from ringzero.core.contract.types import JSON, ProcessStatus, StopReason
from ringzero.core.support.timeouts import fail_after, shielded

if TYPE_CHECKING:
    from ringzero.core._engine.process import Host, Process

__all__ = ["DEFAULT_PRIORITY", "STORE_POLL", "ProcessHandle", "any_handle", "handle_of", "process_of"]

DEFAULT_PRIORITY = 10
"""The priority of a process or message given none (lower numbers go first)."""
STORE_POLL = 0.25
"""Seconds between reads of the store while a handle waits for a process that runs elsewhere."""


class ProcessHandle:
    """What ``spawn`` returns: a process's pid and the calls that control it."""

    def __init__(self, host: Host, process: Process) -> None:
        self._host = host
        self._process = process  # a handle keeps its process's record in memory, the kernel does not
        self.pid = process.pid

    def __repr__(self) -> str:
        return f"<ProcessHandle pid={self.pid} {self.name!r} {self.status.value}>"

    @property
    def name(self) -> str:
        return self._process.record.name

    @property
    def status(self) -> ProcessStatus:
        return self._process.status

    @property
    def stop_reason(self) -> StopReason | None:
        return self._process.record.stop_reason if self.status.terminal else None

    @property
    def error(self) -> dict[str, str] | None:
        """type, message and traceback of what the program raised, once it has failed."""
        return self._process.record.error

    @property
    def state(self) -> dict[str, JSON]:
        return self._process.record.state

    @property
    def program(self) -> str:
        """``module:qualname`` of the program the process runs."""
        return self._process.record.program

    @property
    def args(self) -> list[JSON]:
        """The JSON arguments the program was spawned with."""
        return list(self._process.record.args)

    @property
    def result(self) -> JSON:
        """The recorded return value of a process that exited (its JSON form), else None."""
        return self._process.record.result

    @property
    def replayed_syscalls(self) -> int:
        """Syscalls this run served from the journal (after ``recover()``: calls made before the
        crash, not made again)."""
        return self._process.journal.replayed

    @property
    def live_syscalls(self) -> int:
        """Syscalls this run made live (or is making now)."""
        return self._process.journal.made_live

    @property
    def syscall_now(self) -> str | None:
        """The kind of the syscall the process is in now (``llm``, ``exec``, ``sleep``...), or None."""
        current = self._process.in_syscall
        return None if current is None else current[0]

    @property
    def wake_at(self) -> datetime.datetime | None:
        """When the timer the process waits on now fires (UTC): a ``sleep``'s, ``sleep_until``'s,
        or the timeout of a ``recv`` or ``wait``; None while it waits on no timer."""
        deadline = self._process.wake_at
        return None if deadline is None else datetime.datetime.fromtimestamp(deadline, datetime.timezone.utc)

    def info(self) -> ProcessInfo:
        self._process.snapshot()
        return ProcessInfo.of(self._process.record)

    @property
    def elsewhere(self) -> bool:
        """Whether the process is unfinished and runs in no kernel of this OS process (another
        host runs it, or it waits in the store for a resume): a handle from ``Kernel.handle``."""
        return not self._process.over and self._process.task is None and not self._host.runs(self.pid)

    async def wait(self, timeout: float | None = None) -> Any:
        """The program's return value. Raises ProcessFailed (BudgetExceeded for a budget stop)
        when it raised or was killed. For a process that runs elsewhere, its end is read from the
        store (every ``STORE_POLL`` seconds)."""
        process = self._process
        async with fail_after(timeout):
            if self.elsewhere:
                await _ended_in_store(self._host, process)
            else:
                await shielded(process.finished)
        record = process.record
        if record.status is ProcessStatus.EXITED:
            return process.value if process.ran_here else record.result
        cls = BudgetExceeded if record.stop_reason and record.stop_reason.value.startswith("budget_") else ProcessFailed
        raise cls(self.pid, record.status.value, record.stop_reason, record.error)

    async def pause(self) -> None:
        """Ask the process to pause; it does so at its next syscall boundary."""
        self._here("pause")
        await self._process.pause()

    async def resume(self) -> None:
        self._here("resume")
        await self._process.resume()

    async def kill(self) -> None:
        """Stop the process (and its live children) now, even mid-syscall; waits until recorded."""
        self._here("kill")
        await self._host.kill_tree(self._process)

    async def send(self, message: JSON, *, priority: int = DEFAULT_PRIORITY) -> None:
        """Put a message in the process's mailbox (lower priority numbers are received first),
        wherever it runs (``Kernel.send``)."""
        if self.elsewhere:
            await self._host.send(self.pid, message, priority)
            return
        check_message(self.pid, message, priority)
        await self._host.deliver(self.pid, message, priority, sender=None)

    def _here(self, what: str) -> None:
        if self.elsewhere:
            raise ProcessStateError(f"cannot {what} pid {self.pid} from here: no kernel of this OS process runs it "
                                    f"(ringzero top --db ... does it in whichever kernel does; ringzero resume or "
                                    f"serve runs it if none does)")


def process_of(handle: ProcessHandle) -> Process:
    """The process behind ``handle``: for the kernel's own code (``ctx.wait``, a cluster worker),
    not part of what users hold."""
    return handle._process


async def handle_of(host: Host, pid: int) -> ProcessHandle:
    """The handle of ``pid``: live in ``host``, held by something there, or read from the store
    (``ProcessNotFound`` where the store has no such process)."""
    return ProcessHandle(host, await host.held(pid))


async def any_handle(host: Host, pid: int) -> ProcessHandle | RemoteProcessHandle:
    """The handle of ``pid``, here or (on a cluster node) on another node."""
    try:
        return await handle_of(host, pid)
    except ProcessNotFound:
        remote = await host.cluster.remote_handle(pid)
        if remote is None:
            raise
        return remote


async def _ended_in_store(host: Host, process: Process) -> None:
    """Wait until the store records the end of ``process``, which runs elsewhere."""
    while True:
        record = await host.store.load_process(process.pid)
        if record is not None:
            process.reload(record)
            if record.status.terminal:
                return
        await asyncio.sleep(STORE_POLL)
