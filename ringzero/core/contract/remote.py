"""Processes on other machines: what a distributed scheduler adds to the Scheduler protocol.

A local scheduler only hands out run slots on the kernel's own event loop. A distributed one
(``SchedulerCapabilities.distributed``) also *places*: it decides which machine runs a new
top-level process and gives back a handle that reaches it there. That is this module's
``Placement`` protocol. It is separate from ``Scheduler`` because the two questions are
separate: which ready process runs next is answered on each machine, by its own kernel's
scheduler; where a process lives is answered once, at spawn, and again only when its
machine dies.

A placed process is started by reference (``module:qualname`` and JSON arguments), as
recovery already requires, so any machine with the same code can run it or take it over.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from ringzero.core.contract.errors import BudgetExceeded, ProcessFailed
from ringzero.core.contract.types import JSON, Limits, ProcessStatus, StopReason

if TYPE_CHECKING:
    from ringzero.core.contract.records import ProcessInfo

__all__ = ["ChildPlacement", "Placement", "ProcessOwner", "RemoteProcessHandle", "SpawnRequest", "raise_for_end"]


@dataclass(frozen=True)
class SpawnRequest:
    """A top-level process to place: its program by reference, and what it needs from a machine."""

    program: str
    args: list[JSON]
    name: str
    priority: int
    limits: Limits
    resources: Mapping[str, float] = field(default_factory=dict)
    """What the machine must have free for it (Ray's names: ``CPU``, ``GPU``, custom ones)."""


@runtime_checkable
class ProcessOwner(Protocol):
    """The calls a remote handle makes; each answers with the process's snapshot (see
    ``snapshot_of``) once the operation has taken effect where the process runs."""

    async def wait_for(self, pid: int, timeout: float | None) -> dict[str, Any]: ...

    async def pause(self, pid: int) -> dict[str, Any]: ...

    async def resume(self, pid: int) -> dict[str, Any]: ...

    async def kill(self, pid: int) -> dict[str, Any]: ...

    async def send(self, pid: int, message: JSON, priority: int) -> dict[str, Any]: ...

    async def snapshot(self, pid: int) -> dict[str, Any]: ...


@runtime_checkable
class Placement(Protocol):
    """What a distributed scheduler implements besides ``Scheduler``: where processes live."""

    def attach(self, kernel: Any) -> None:
        """Called once by the Kernel it serves (whose store all machines share)."""
        ...

    async def place(self, request: SpawnRequest) -> RemoteProcessHandle:
        """Start the process on a machine that has ``request.resources`` free; return its handle."""
        ...

    def owner_of(self, pid: int) -> ProcessOwner:
        """Whoever answers for ``pid`` now (it follows the process when it is moved)."""
        ...

    async def aclose(self) -> None:
        """Stop the machines' kernels as a host shutdown would; their processes stay resumable."""
        ...


@runtime_checkable
class ChildPlacement(Protocol):
    """A cluster node's side of placement: where a child that a process on this node spawns
    runs (given to the node's kernel by its cluster worker: ``Kernel.place_children``)."""

    async def place_child(self, request: SpawnRequest, parent: int) -> RemoteProcessHandle | None:
        """Start the child on another machine and return its handle, or None to run it here."""
        ...

    def owner_of(self, pid: int) -> ProcessOwner:
        ...


def raise_for_end(pid: int, snapshot: Mapping[str, Any]) -> JSON:
    """The result of an ended process's snapshot, or the error a local ``wait`` would raise."""
    status = ProcessStatus(snapshot["status"])
    if status is ProcessStatus.EXITED:
        return snapshot.get("result")
    reason = None if snapshot.get("stop_reason") is None else StopReason(snapshot["stop_reason"])
    failed = BudgetExceeded if reason is not None and reason.value.startswith("budget_") else ProcessFailed
    raise failed(pid, status.value, reason, snapshot.get("error"))


class RemoteProcessHandle:
    """The handle of a process another machine runs: the same calls as ``ProcessHandle``.

    ``wait``, ``pause``, ``resume``, ``kill`` and ``send`` act where the process runs and return
    once done there (a kill within one network round trip of a local one). The properties are
    the process as of the last call that answered, or of ``refresh()``. ``wait`` returns the
    recorded (JSON) result, as a local handle does for a process that ended in another kernel.
    """

    def __init__(self, placement: Placement | ChildPlacement, snapshot: Mapping[str, Any]) -> None:
        self._placement = placement
        self.pid = int(snapshot["pid"])
        self._snapshot: dict[str, Any] = dict(snapshot)

    def __repr__(self) -> str:
        return f"<RemoteProcessHandle pid={self.pid} {self.name!r} {self.status.value} on {self.node}>"

    def _update(self, snapshot: Mapping[str, Any]) -> dict[str, Any]:
        self._snapshot = dict(snapshot)
        return self._snapshot

    @property
    def name(self) -> str:
        return str(self._snapshot["name"])

    @property
    def node(self) -> str:
        """The machine that runs the process (as of the last answer)."""
        return str(self._snapshot.get("node") or "")

    @property
    def status(self) -> ProcessStatus:
        return ProcessStatus(self._snapshot["status"])

    @property
    def stop_reason(self) -> StopReason | None:
        reason = self._snapshot.get("stop_reason")
        return StopReason(reason) if reason is not None and self.status.terminal else None

    @property
    def error(self) -> dict[str, str] | None:
        return self._snapshot.get("error")

    @property
    def state(self) -> dict[str, JSON]:
        return dict(self._snapshot.get("state") or {})

    @property
    def program(self) -> str:
        return str(self._snapshot["program"])

    @property
    def args(self) -> list[JSON]:
        return list(self._snapshot.get("args") or [])

    @property
    def result(self) -> JSON:
        return self._snapshot.get("result") if self.status is ProcessStatus.EXITED else None

    def info(self) -> ProcessInfo:
        from ringzero.core.contract.records import ProcessInfo
        from ringzero.core.contract.store import ProcessRecord

        return ProcessInfo.of(ProcessRecord.from_json(self._snapshot))

    async def refresh(self) -> RemoteProcessHandle:
        """Ask the process's machine for its current snapshot."""
        self._update(await self._placement.owner_of(self.pid).snapshot(self.pid))
        return self

    async def ended(self, timeout: float | None = None) -> dict[str, Any]:
        """The process's snapshot once it has ended (exited, failed or killed), raising nothing
        but TimeoutError: what a parent needs to settle its budget and journal the end."""
        return self._update(await self._placement.owner_of(self.pid).wait_for(self.pid, timeout))

    async def wait(self, timeout: float | None = None) -> Any:
        """The program's recorded result; raises ProcessFailed (BudgetExceeded for a budget
        stop) when it failed or was killed, TimeoutError after ``timeout`` seconds. Survives the
        process being moved to another machine while it waits."""
        snapshot = self._update(await self._placement.owner_of(self.pid).wait_for(self.pid, timeout))
        return raise_for_end(self.pid, snapshot)

    async def pause(self) -> None:
        self._update(await self._placement.owner_of(self.pid).pause(self.pid))

    async def resume(self) -> None:
        self._update(await self._placement.owner_of(self.pid).resume(self.pid))

    async def kill(self) -> None:
        self._update(await self._placement.owner_of(self.pid).kill(self.pid))

    async def send(self, message: JSON, *, priority: int = 10) -> None:
        self._update(await self._placement.owner_of(self.pid).send(self.pid, message, priority))
