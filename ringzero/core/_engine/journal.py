"""The syscall journal of one process: durable execution's source of truth.

Each syscall's outcome is appended (and durable) before the program sees it. After a
crash the program is run again from the top: while its syscalls match the journal, their
recorded outcomes are served without calling the LLM, executor or tool again; past the
last record it runs live. A syscall whose kind or arguments differ from the record at the
same position raises NonDeterminismError instead of corrupting the run.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable

from ringzero.core.contract.errors import Fenced, NonDeterminismError
from ringzero.core.contract.outcomes import Outcome, Value
from ringzero.core.contract.store import Effects, JournalEntry, KernelStore

__all__ = ["OWNER_RECHECK", "Journal", "diverged"]

OWNER_RECHECK = 1.0
"""Seconds a cluster kernel trusts that it still owns a process before it reads the store again."""


def diverged(pid: int, slot: str, recorded: tuple[str, str, str], asked: tuple[str, str, str]) -> NonDeterminismError:
    """The error of a resumed program whose syscall ``slot`` differs from its record: what
    was recorded and what is asked now, each as kind(summary), and the fingerprints where the
    two summaries read the same (the difference is in what a summary leaves out)."""
    (kind, fp, summary), (now_kind, now_fp, now_summary) = recorded, asked
    detail = ""
    if kind == now_kind and summary == now_summary:
        detail = (f" (the summaries are the same; the arguments differ in what a summary leaves out: fingerprint "
                  f"{fp} was recorded, {now_fp} is asked)")
    return NonDeterminismError(
        f"pid {pid}: syscall #{slot} was recorded as {kind}({summary}) but the resumed program now asks for "
        f"{now_kind}({now_summary}){detail}. A resumed program runs again from the top and must make the same "
        "syscalls in the same order: keep what it decides on in ctx.state or in syscall results (ctx.now(), "
        "ctx.random(), ctx.uuid() for time and chance), not in anything outside the journal. To change a program "
        "while processes of it are in flight, put the new code under `if await ctx.patched(\"change-id\"):` and "
        f"keep the old in the else branch; the journal is kept: after a fix, `ringzero retry {pid}` (or "
        f"kernel.retry({pid})) resumes it")


class Journal:
    """Serves recorded syscalls by their position in program order, then records new ones.

    A syscall takes its position (its slot) synchronously when it starts, before it awaits
    anything, so concurrent syscalls (a graph's parallel tool calls) get the same slots on
    every run, in the order the program started them, whatever order they finish in. A slot
    whose outcome was never recorded (in flight at a crash) simply runs live again.

    Outcomes do not stay in memory: a new one is in the store once recorded, and a replayed
    one is let go once served, so a long-lived process costs its journal's size on disk only.
    """

    def __init__(self, store: KernelStore, pid: int, entries: list[JournalEntry] | None = None, *,
                 owner: tuple[int, str] | None = None, base: int = 0, resumed: bool = False) -> None:
        self._store = store
        self._pid = pid
        self.owner = owner
        """(epoch, node) under which a cluster kernel runs the process; its journal is fenced:
        see ``check_owner`` and ``fill``. None on one machine."""
        self._owner_checked = time.monotonic()  # the claim that made it the owner was just now
        self._by_seq = {e.seq: e for e in entries or []}
        self._last_recorded = max(self._by_seq, default=base)
        self._loaded = len(self._by_seq)
        self._cursor = base
        """The last slot taken; ``base``: the last slot of the runs before this one
        (``ringzero.core._engine.new_run``), whose entries are not among ``entries``."""
        self._earlier = (0, 0)
        """(replayed, made live) by the earlier runs this process made here (``carry_counts``)."""
        self._recorded_live = 0
        """Syscalls of this run recorded live here (what the store gained: ``made_live``)."""
        self.resumed = resumed
        """A recovered process's journal: an effect without a result may have been in flight."""
        self._effects: Effects | None = None

    @property
    def replaying(self) -> bool:
        """True while syscalls before the last recorded one are being served."""
        return self._cursor < self._last_recorded

    @property
    def length(self) -> int:
        """How many outcomes the journal held when the process was loaded (0 for a new one)."""
        return self._loaded

    @property
    def replayed(self) -> int:
        """How many syscalls were served from the journal so far (by every run made here)."""
        return self._loaded - len(self._by_seq) + self._earlier[0]

    @property
    def made_live(self) -> int:
        """How many syscalls were run live and recorded (by every run made here): what the store
        gained, so a call that was never made (a divergence, a provider this kernel lacks) or
        one still running is not counted."""
        return self._recorded_live + self._earlier[1]

    def carry_counts(self, earlier: Journal) -> None:
        """Count what the journal of the run before this one replayed and made live."""
        self._earlier = (earlier.replayed, earlier.made_live)

    @property
    def cursor(self) -> int:
        """The last slot taken."""
        return self._cursor

    @property
    def entries(self) -> tuple[JournalEntry, ...]:
        """The recorded outcomes not yet served, in program order."""
        return tuple(self._by_seq[seq] for seq in sorted(self._by_seq))

    def next_holds(self, kind: str, fp: str) -> bool:
        """Whether the next slot's record is a ``kind`` syscall with fingerprint ``fp`` (what
        ``ctx.patched`` asks before it takes a slot)."""
        entry = self._by_seq.get(self._cursor + 1)
        return entry is not None and entry.kind == kind and entry.fingerprint == fp

    def take_slot(self, kind: str, fp: str, summary: str) -> tuple[int, Outcome | None]:
        """The next slot in program order, and its recorded outcome (None: run it live)."""
        seq = self._cursor + 1
        entry = self._by_seq.get(seq)
        if entry is not None and (entry.kind != kind or entry.fingerprint != fp):
            raise diverged(self._pid, str(seq), (entry.kind, entry.fingerprint, entry.summary), (kind, fp, summary))
        self._cursor = seq
        if entry is None:
            return seq, None
        del self._by_seq[seq]
        return seq, entry.outcome

    async def effects(self) -> Effects:
        """The intents and nested tool-call results the store holds for this process, read once
        (a resumed process's first live effect asks; a new one has none)."""
        if self._effects is None:
            self._effects = await self._store.effects(self._pid) if self.resumed else Effects(frozenset(), {})
        return self._effects

    async def recorded_call(self, key: str, kind: str, fp: str, summary: str) -> Outcome | None:
        """The recorded outcome of the tool call that sandboxed code made in slot ``key``
        (``<slot>.<n>``), or None where it has none; NonDeterminismError where the code now asks
        for another call there."""
        if not self.resumed:
            return None
        entry = (await self.effects()).calls.get(key)
        if entry is None:
            return None
        if entry.kind != kind or entry.fingerprint != fp:
            raise diverged(self._pid, key, (entry.kind, entry.fingerprint, entry.summary), (kind, fp, summary))
        return entry.outcome

    # ------------------------------------------------------------------ from any thread
    @property
    def answers_here(self) -> bool:
        """Whether the tool calls sandboxed code makes can be journaled from the thread that
        runs the code (``recorded_call_here`` and the rest): the store appends from any thread,
        and a resumed process's intents and results are read already (``effects``)."""
        return self._store.appends_anywhere and (not self.resumed or self._effects is not None)

    def recorded_call_here(self, key: str, kind: str, fp: str, summary: str) -> Outcome | None:
        """``recorded_call`` from any thread, once ``answers_here``."""
        if not self.resumed or self._effects is None:
            return None
        entry = self._effects.calls.get(key)
        if entry is None:
            return None
        if entry.kind != kind or entry.fingerprint != fp:
            raise diverged(self._pid, key, (entry.kind, entry.fingerprint, entry.summary), (kind, fp, summary))
        return entry.outcome

    def in_doubt_here(self, key: str) -> bool:
        """``in_doubt`` from any thread, once ``answers_here``."""
        return self.resumed and self._effects is not None and key in self._effects.intents

    def record_intent_here(self, key: str, kind: str, fp: str, summary: str) -> bool:
        """``record_intent`` from any thread: False where the store cannot take it there."""
        return self._store.record_intent_here(self._pid, key, kind, fp, summary)

    def record_call_here(self, key: str, kind: str, fp: str, summary: str, outcome: Outcome) -> bool:
        """The outcome of tool call ``key`` recorded from any thread (``fill`` of a call): False
        where the store cannot take it there."""
        return self._store.record_call_here(self._pid, key, kind, fp, summary, outcome)

    async def timer(self, seq: int, kind: str, fp: str, summary: str, seconds: float) -> float:
        """The wall-clock deadline of the timer that waiting syscall ``seq`` (a ``sleep``, a
        ``recv`` or ``wait`` with a timeout) sets ``seconds`` ahead when it first runs live.
        Recorded before the wait begins (``KernelStore.record_timer``): a resumed program whose
        wait was cut short by a crash gets the deadline it set then, not a new one, and waits
        only what is left."""
        entry = (await self.effects()).timers.get(seq) if self.resumed else None
        if entry is not None:
            if entry.fingerprint != fp:
                raise diverged(self._pid, f"{seq}", (kind, entry.fingerprint, entry.summary), (kind, fp, summary))
            value = entry.outcome.value if isinstance(entry.outcome, Value) else None
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                return float(value)
        deadline = time.time() + seconds
        await self._store.record_timer(self._pid, seq, fp, summary, deadline)
        return deadline

    async def in_doubt(self, key: int | str) -> bool:
        """Whether effect ``key`` (a slot, or ``<slot>.<n>`` under an exec) was started before the
        crash without its outcome being recorded (asked only of a slot without a record): it may
        or may not have had its effect."""
        return self.resumed and str(key) in (await self.effects()).intents

    async def record_intent(self, key: int | str, kind: str, fp: str, summary: str) -> None:
        """Durable before the effect starts: a resume that finds it without a result knows the
        effect was in flight (``in_doubt``)."""
        await self._store.record_intent(self._pid, str(key), kind, fp, summary)

    def fill(self, slot: int | str, kind: str, fp: str, summary: str, outcome: Outcome) -> Awaitable[Outcome]:
        """Record the outcome of ``slot``: a syscall's (its seq: ``_record``), or a tool call's
        that sandboxed code made (``"<seq>.<n>"``). Durable once awaited; gives the slot's
        outcome (see ``_record``). A plain function: a coroutine less at every syscall."""
        if isinstance(slot, int):
            return self._record(slot, kind, fp, summary, outcome)
        return self._record_call(slot, kind, fp, summary, outcome)

    async def _record_call(self, key: str, kind: str, fp: str, summary: str, outcome: Outcome) -> Outcome:
        await self._store.record_call(self._pid, key, kind, fp, summary, outcome)
        return outcome

    async def check_owner(self, *, force: bool = False) -> None:
        """Raise Fenced if another node has taken the process over (a fenced journal only).

        Asked before each live syscall, and answered from the store at most once per
        ``OWNER_RECHECK`` seconds (a lease): within that window a kernel that lost its process
        may still make a call, but it cannot record it over the new owner's (``fill``), and its
        next check stops it. ``force`` reads the store now."""
        if self.owner is None:
            return
        now = time.monotonic()
        if not force and now - self._owner_checked < OWNER_RECHECK:
            return
        if await self._store.owner(self._pid) != self.owner:
            raise Fenced(f"pid {self._pid}: another node has taken this process over; this kernel stops running it")
        self._owner_checked = now

    async def _record(self, seq: int, kind: str, fp: str, summary: str, outcome: Outcome) -> Outcome:
        """Fill slot ``seq``; durable when this returns. Returns the slot's outcome: ``outcome``,
        or in a fenced journal whose slot a stale owner filled first (it had not yet seen the
        takeover), that owner's record, which the process goes on with; a kernel that is not the
        owner any more gets Fenced instead."""
        if self.owner is None:  # one machine: the common case, without the entry on the way
            await self._store.record_outcome(self._pid, seq, kind, fp, summary, outcome)
            self._last_recorded = max(self._last_recorded, seq)
            self._recorded_live += 1
            return outcome
        entry = JournalEntry(seq, kind, fp, summary, outcome)
        if await self._store.append_journal(self._pid, entry, exclusive=True):
            self._last_recorded = max(self._last_recorded, seq)
            self._recorded_live += 1
            return outcome
        await self.check_owner(force=True)
        recorded = await self._store.journal_entry(self._pid, seq)
        if recorded is None or recorded.kind != kind or recorded.fingerprint != fp:
            raise NonDeterminismError(f"pid {self._pid}: syscall #{seq} was recorded by another node as something "
                                      f"other than {kind}({summary})")
        self._last_recorded = max(self._last_recorded, seq)
        return recorded.outcome
