"""Handles: what ``spawn`` returns, and the calls that control a process from outside it.

The public face of ``ringzero.core._engine.handles`` (the engine's modules are private);
``ProcessInfo`` (one row of ``ps``) and ``Event`` (what ``Kernel.subscribe`` gets) are records
of the contract, and a process placed on another machine has a ``RemoteProcessHandle``
(``ringzero.core.contract.remote``)."""

from ringzero.core._engine.handles import DEFAULT_PRIORITY, ProcessHandle, process_of
from ringzero.core.contract.records import Event, ProcessInfo
from ringzero.core.contract.remote import RemoteProcessHandle

__all__ = ["DEFAULT_PRIORITY", "Event", "ProcessHandle", "ProcessInfo", "RemoteProcessHandle", "process_of"]
