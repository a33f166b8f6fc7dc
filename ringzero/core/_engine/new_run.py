"""A new run of the same process: how a long-lived program bounds its journal.

A resumed program runs again from the top and replays its whole journal, so a program that
never ends (a loop over incoming mail, a daily job) would replay ever more. Temporal calls the
way out *continue-as-new*; so does ringzero: ``await ctx.continue_as_new(*args, state=...)``
ends the current run and starts the program again from the top, in the same process (same pid,
mailbox, children and budget), with those arguments and ``ctx.state``, and an empty journal.
A later resume replays only the new run.

Where the new run begins is written in the process's first record (``run_start``), before
anything of the old run is let go: a crash before that write resumes the old run (which asks
for the new one again), one after it resumes the new run. What carries over:

- ``journal_base``: the last slot of the old run; the new run's first syscall is the next.
- ``sends``, ``spawns``: how many the process made, so that the ids that make a resumed send or
  spawn exactly-once stay unique across runs.
- ``mail_seen`` and ``mail_pending``: the last message seq delivered and those not yet
  received, so that mail the old run received is not received again.
- ``spent``: what the process has consumed, which its budget goes on from.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ringzero.core._engine.journal import Journal
from ringzero.core.contract.errors import CheckpointerError
from ringzero.core.contract.types import JSON

if TYPE_CHECKING:
    from ringzero.core._engine.process import Process
    from ringzero.core.contract.store import JournalEntry

__all__ = ["ContinueAsNew", "RunStart", "begin_new_run"]


class ContinueAsNew(BaseException):
    """Raised by ``ctx.continue_as_new`` to end the run; the process starts the next one. A
    BaseException, like a cancellation, so that a program's ``except Exception`` lets it by."""

    def __init__(self, args: Sequence[JSON], state: dict[str, JSON]) -> None:
        super().__init__("continue as new")
        self.args = tuple(args)
        self.state = state


@dataclass(frozen=True)
class RunStart:
    """Where a process's current run began (its record's ``run_start``)."""

    journal_base: int = 0
    sends: int = 0
    spawns: int = 0
    mail_seen: int = 0
    mail_pending: frozenset[int] = frozenset()
    spent: dict[str, float] | None = None

    @classmethod
    def of(cls, data: dict[str, Any] | None) -> RunStart:
        if not data:
            return cls()
        return cls(int(data.get("journal_base", 0)), int(data.get("sends", 0)), int(data.get("spawns", 0)),
                   int(data.get("mail_seen", 0)), frozenset(int(s) for s in data.get("mail_pending") or ()),
                   {str(k): float(v) for k, v in (data.get("spent") or {}).items()})

    def of_this_run(self, entries: list[JournalEntry]) -> list[JournalEntry]:
        """The journal entries of the current run."""
        return [e for e in entries if e.seq > self.journal_base] if self.journal_base else entries

    def received_before(self, seq: int) -> bool:
        """Whether mail ``seq`` was received by an earlier run."""
        return seq <= self.mail_seen and seq not in self.mail_pending


async def begin_new_run(process: Process, again: ContinueAsNew) -> None:
    """End the run of ``process`` and set it up for the next (see the module docstring)."""
    record = process.record
    base = process.journal.cursor
    await process.runtime.flush()  # the old run's transitions land before its record is let go
    record.begin_run(again.args, again.state, {
        "journal_base": base, "sends": process.sends, "spawns": process.spawns, "mail_seen": process.mail_seq,
        "mail_pending": list[JSON](process.mailbox.pending()), "spent": process.meter.spent_dict()})
    store = process.runtime.store
    try:
        await store.begin_new_run(record)
    except CheckpointerError as exc:  # not recorded: a resume goes on with the old run
        process.leave_unfinished(exc)
    earlier = process.journal
    process.next_run(Journal(store, process.pid, owner=earlier.owner, base=base))
    process.journal.carry_counts(earlier)
    with contextlib.suppress(CheckpointerError):  # a failure leaves rows that nobody reads
        await store.drop_journal_before(process.pid, base)
