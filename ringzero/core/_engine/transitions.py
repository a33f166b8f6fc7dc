"""The one writer of lifecycle transitions a process makes on its way (ready, running, waiting):
``Process.move_to`` hands them over, ``save_soon``.

A process's end is written by the process itself, before its ``wait`` returns; the transitions
before it are written together with those every other process makes in the same turn of the
loop, by one task, a turn later. The turn between lets a process that ends meanwhile write them
with its end (a woken process that records its ``recv`` and returns writes 5 rows, not 7).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Sequence
from typing import TYPE_CHECKING

from ringzero.core.contract.protocols import Checkpointer
from ringzero.core.contract.types import JSON, Checkpoint
from ringzero.core.support.timeouts import shielded

if TYPE_CHECKING:
    from ringzero.core._engine.process import Process

__all__ = ["TransitionWriter", "save_together"]

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
                        await batch.popleft().save_transitions()
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
    done: asyncio.Future[None] | None = None
    for process in processes:
        if not process.unsaved_steps:
            continue
        if done is None:
            done = asyncio.get_running_loop().create_future()
        steps = process.take_unsaved(done)
        if steps is None:
            alone.append(process)
            continue
        store = process.runtime.store
        rows += (store.transitions_row(process.pid, steps), store.status_row(process.record))
        taken.append((process, steps))
    if done is None:
        return
    try:
        if taken:
            await taken[0][0].runtime.store.put_rows(rows)
    except BaseException:
        for process, steps in taken:
            process.requeue(steps)
        raise
    finally:
        for process, _ in taken:
            process.written_together(done)
        done.set_result(None)
    for process in alone:
        await process.save_transitions()
