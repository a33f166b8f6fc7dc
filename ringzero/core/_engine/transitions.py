"""The one writer of lifecycle transitions a process makes on its way (ready, running, waiting).

A process's end is written by the process itself, before its ``wait`` returns; the transitions
before it are written together with those every other process makes in the same turn of the
loop, by one task, a turn later. The turn between lets a process that ends meanwhile write them
with its end (a woken process that records its ``recv`` and returns writes 5 rows, not 7).
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Sequence
from typing import TYPE_CHECKING

from ringzero.core.contract.protocols import Checkpointer
from ringzero.core.contract.types import JSON, Checkpoint, ProcessStatus
from ringzero.core.support.timeouts import shielded

if TYPE_CHECKING:
    from ringzero.core._engine.process import Process

__all__ = ["TransitionWriter", "save_together", "save_transitions", "set_status", "write_status"]

WRITERS = 64
"""Writers at once, so that a store that groups concurrent writes (SQLite, PostgreSQL's pool)
gets them together, without a task per process."""
SAVED_TOGETHER = 128
"""Processes whose transitions one write takes, where the store writes many rows in one step."""


class TransitionWriter:
    """Collects the processes with unwritten transitions and writes them a turn later."""

    def __init__(self, checkpointer: Checkpointer) -> None:
        capabilities = checkpointer.capabilities
        self._together = SAVED_TOGETHER if capabilities.put_many or capabilities.append else 1
        self._unsaved: dict[int, Process] = {}
        self._saving: asyncio.Task[None] | None = None

    def save_soon(self, process: Process) -> None:
        """Write ``process``'s new transitions with those the other processes make in this turn."""
        self._unsaved[process.pid] = process
        if self._saving is None:
            self._saving = asyncio.get_running_loop().create_task(self._save_unsaved())

    async def flush(self) -> None:
        """Wait until every transition handed over so far is in the store."""
        while self._saving is not None:
            await shielded(self._saving)

    async def _save_unsaved(self) -> None:
        together = self._together

        async def writer() -> None:
            while batch:
                try:
                    if together == 1:
                        await save_transitions(batch.popleft())
                    else:
                        await save_together([batch.popleft() for _ in range(min(together, len(batch)))])
                except Exception:  # a store that fails here fails again, with its error, at the end
                    continue

        try:
            await asyncio.sleep(0)  # the turn between (see the module's docstring)
            while self._unsaved:
                batch = deque(self._unsaved.values())
                self._unsaved.clear()
                writers = min(WRITERS, -(-len(batch) // together))
                if writers == 1:
                    await writer()
                else:
                    await asyncio.gather(*(writer() for _ in range(writers)))
        finally:
            self._saving = None


async def save_together(processes: Sequence[Process]) -> None:
    """``Process.save_transitions`` of each of ``processes``, their rows (transitions, then status,
    of each) written in one ``put_rows``: one record of an appending store's log, one
    commit of a store that puts many at once, where each process's own write cost a
    record, a coroutine and a future of its own. A process with a status write in flight
    (its rows must come after that one's) or fenced goes its own way, after them. A failed
    write leaves each process's transitions unsaved, as ``save_transitions`` does, and
    raises."""
    taken: list[tuple[Process, list[tuple[int, dict[str, JSON]]]]] = []
    rows: list[Checkpoint] = []
    alone: list[Process] = []
    for process in processes:
        steps = process.unsaved_steps
        if not steps:
            continue
        if process.status_write is not None or process.fenced is not None:
            alone.append(process)
            continue
        process.unsaved_steps = None
        process.snapshot()
        store = process.runtime.store
        rows += (store.transitions_row(process.pid, steps), store.status_row(process.record))
        taken.append((process, steps))
    if taken:
        done = asyncio.get_running_loop().create_future()
        for process, _ in taken:
            process.status_write = done
        try:
            await taken[0][0].runtime.store.put_rows(rows)
        except BaseException:
            for process, steps in taken:
                process.unsaved_steps = steps + (process.unsaved_steps or [])
            raise
        finally:
            for process, _ in taken:
                if process.status_write is done:
                    process.status_write = None
            done.set_result(None)
    for process in alone:
        await save_transitions(process)


async def set_status(process: Process, status: ProcessStatus, detail: str = "") -> None:
    """Move to ``status``. The end of a process is written before this returns; a
    transition on the way (ready, running, waiting, paused) is written with the others the
    kernel's processes make in the same turn of the loop (``TransitionWriter.save_soon``): a process
    that goes from ready to running to waiting in one turn writes one transitions row and
    one status row, not three of each. Losing one of those in a crash loses nothing that
    recovery needs (it resumes every process that has not ended, from its journal)."""
    old = process.record.status
    process.record.status = status
    process.transition_seq += 1
    if process.unsaved_steps is None:
        process.unsaved_steps = []
    old_value, new_value = old.value, status.value
    process.unsaved_steps.append((process.transition_seq,
                          {"from": old_value, "to": new_value, "at": time.time(), "detail": detail}))
    if status.terminal:  # its event comes once it is written, as whoever reads the store expects
        seq = process.transition_seq
        try:
            await save_transitions(process, with_state=True)
        except BaseException:
            # Not ended where it was not recorded as ended: neither in memory nor in the
            # transitions a later write carries.
            process.record.status = old
            unsaved = [step for step in process.unsaved_steps or () if step[0] != seq]
            process.unsaved_steps = unsaved or None
            raise
    else:
        process.runtime.save_soon(process)
    runtime = process.runtime
    if runtime.listeners:  # the event's data is built only for someone who listens
        runtime.emit("transition", process.pid, {"from": old_value, "to": new_value, "detail": detail})

async def save_transitions(process: Process, *, with_state: bool = False) -> None:
    """Write the transitions not yet written (one row) and the status they end in, together
    (``KernelStore.put_rows``: one commit where the store can); ``with_state``: the state
    row (``ctx.state``, result, error) too, ahead of them, as at the end of the process."""
    steps, process.unsaved_steps = process.unsaved_steps, None
    if not steps or process.fenced is not None:  # a fenced process writes nothing more
        return
    store = process.runtime.store
    try:
        first = store.transitions_row(process.pid, steps)
        await write_status(process, (store.state_row(process.record), first) if with_state else (first,))
    except BaseException:
        # written with the next ones, or their error raised then
        process.unsaved_steps = steps + (process.unsaved_steps or [])
        raise

async def write_status(process: Process, before: Sequence[Checkpoint] = ()) -> None:
    """Write the status row (status, pause flag, counters), one write at a time for this
    process, after the rows ``before`` and atomically with them where the store can. Over
    a pool of connections (PostgreSQL) two writes in flight may commit in either order, and
    an older row committed last would undo what the newer one says (a batched ``running``
    landing after the process's end left it ``running`` for good)."""
    while process.status_write is not None:
        await shielded(process.status_write)
    done = process.status_write = asyncio.get_running_loop().create_future()
    try:
        process.snapshot()  # taken now, so the row written last is also the newest
        store = process.runtime.store
        await store.put_rows((*before, store.status_row(process.record)))
    finally:
        process.status_write = None
        done.set_result(None)
