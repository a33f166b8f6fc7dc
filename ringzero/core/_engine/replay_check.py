"""Replaying stored journals against the current code without one live call
(``ringzero replay --check``, ``ringzero.testing.assert_replays_clean``).

The store's rows are copied into memory, so the check writes nothing where they came from. Every
process (ended ones too) is made resumable in the copy and recovered by a kernel whose
``replay_only`` stops each at its first syscall past its journal (``ReplayEnded``): no model,
tool or executor is asked anything. A process replays clean when it reaches the end of its
journal, or its end, making the calls it recorded; otherwise the report names the first
diverging slot, with what was recorded and what the code asks now.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass

from ringzero.core._engine.recovery import recover
from ringzero.core._engine.runtime import Runtime
from ringzero.core.contract.errors import NotResumed, ProcessFailed, RingzeroError
from ringzero.core.contract.protocols import Checkpointer
from ringzero.core.contract.records import Ending
from ringzero.core.contract.types import ProcessStatus, Program

__all__ = ["ReplayReport", "check_replays", "copy_rows"]

PER_PROCESS = 60.0
"""Seconds a replay may take before it is reported as stuck (a replay makes no call: it is quick)."""


@dataclass(frozen=True)
class ReplayReport:
    """How one process's journal replayed against the current code."""

    pid: int
    name: str
    clean: bool
    detail: str
    """What it replayed (clean), or the first divergence, or why it could not be replayed."""
    slot: str | None = None
    """The first diverging slot, where it diverges."""


async def copy_rows(source: Checkpointer, target: Checkpointer) -> None:
    """Every row of ``source`` into ``target``."""
    async for row in source.list(None, None):
        await target.put(row)


async def check_replays(runtime: Runtime, programs: Mapping[str, Program] | None,
                        pids: Collection[int] | None = None) -> list[ReplayReport]:
    """Replay the processes of ``runtime``'s store (a copy made for this: see the module), those
    in ``pids`` only where given, and report how each went."""
    runtime.only_replay()
    store = runtime.store
    records = {r.pid: r for r in await store.load_processes()}
    unknown = sorted(set(pids or ()) - set(records))
    if unknown:
        raise RingzeroError(f"no process {', '.join(map(str, unknown))} in the store")
    failed_with = {pid: (record.error or {}).get("type") for pid, record in records.items()
                   if record.status is ProcessStatus.FAILED}
    for record in records.values():  # ended ones replay too: in the copy, they are made resumable
        if record.status.terminal:
            record.undo_end(Ending(None, None, None, record.state))
            record.move_to(ProcessStatus.READY)
            await store.put_rows([store.status_row(record)])
    handles = await recover(runtime, programs)
    wanted = set(records) if pids is None else set(pids)
    reports = []
    for handle in handles:
        if handle.pid not in wanted:
            continue
        journal = len(await store.journal(handle.pid))
        try:
            await handle.wait(timeout=PER_PROCESS)
            reports.append(ReplayReport(handle.pid, handle.name, True,
                                        f"replays clean: {journal} syscall(s), to its end"))
        except NotResumed as exc:
            reports.append(ReplayReport(handle.pid, handle.name, False, f"cannot be replayed: {exc.cause}"))
        except ProcessFailed as exc:
            reports.append(_failed(handle.pid, handle.name, exc, journal, failed_with.get(handle.pid)))
        except TimeoutError:
            reports.append(ReplayReport(handle.pid, handle.name, False,
                                        f"did not finish replaying in {PER_PROCESS:.0f} s"))
    return sorted(reports, key=lambda r: r.pid)


def _failed(pid: int, name: str, exc: ProcessFailed, journal: int, recorded: str | None) -> ReplayReport:
    error = exc.error or {}
    kind, message = error.get("type", ""), error.get("message", "")
    if kind == "ReplayEnded":
        reached = message.split(": ", 1)[-1]
        return ReplayReport(pid, name, True, f"replays clean: {journal} syscall(s) recorded, {reached}")
    if kind == "NonDeterminismError":
        at = re.search(r"syscall #(\S+) was recorded", message)
        return ReplayReport(pid, name, False, f"diverges: {message}", at[1] if at else None)
    if recorded == kind:  # it failed so when it ran: the replay agrees
        return ReplayReport(pid, name, True, f"replays clean: {journal} syscall(s), failing with {kind} as it did")
    return ReplayReport(pid, name, False, f"raised {kind} during the replay: {message}")
