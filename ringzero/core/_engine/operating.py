"""What an operator does with one process's journal: read it (``ringzero show``) and decide an
in-doubt call for it (``ringzero settle``).

A slot is in doubt where its effect's intent is recorded and its outcome is not (its host died
while it ran), or where its record says ``in doubt`` and the process failed of it (the program
did not handle ``ToolInDoubt``). An operator who has checked with the system the call acts on
settles it: with the result it had (``result``), with an error (``error``), or by letting it
run again (``run_again``). The decision is journaled like any outcome (marked
``settled: "operator"``), so the next resume, or ``retry`` of a failed process, goes on from it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from ringzero.core.contract.errors import InvalidArgument
from ringzero.core.contract.fingerprints import canonical_json
from ringzero.core.contract.json_data import JSON
from ringzero.core.contract.outcomes import Failure, InDoubt, Outcome, Stopped, Value, decode, with_beside
from ringzero.core.contract.records import JournalEntry
from ringzero.core.contract.store import KernelStore, ProcessRecord
from ringzero.core.contract.types import ProcessStatus, ensure_json

__all__ = ["SETTLED_ERROR", "JournalLine", "JournalView", "journal_lines", "outcome_words", "settle"]

SETTLED_ERROR = "ToolError"
"""The error type of a call an operator settled with ``error``: the program sees it raised (a
``ctx.tool`` call as ``ToolFailed`` naming it, sandboxed code as itself), its message saying an
operator settled it."""

_SLOT = re.compile(r"^[1-9][0-9]*(\.[1-9][0-9]*)?$")


@dataclass(frozen=True)
class JournalLine:
    """One slot of a process's journal as ``ringzero show`` prints it."""

    slot: str
    """``"7"`` (syscall #7), ``"7.3"`` (the third tool call the code of exec #7 made)."""
    kind: str
    summary: str
    outcome: dict[str, JSON] | None
    """The recorded outcome as stored (None: none recorded)."""
    at: float | None
    in_doubt: bool

    @property
    def said(self) -> str:
        """The outcome in a few words."""
        if self.outcome is None:
            return "in doubt: started, no outcome recorded" if self.in_doubt else "no outcome"
        return outcome_words(self.outcome)

    def to_json(self) -> dict[str, JSON]:
        return {"slot": self.slot, "kind": self.kind, "summary": self.summary, "outcome": self.outcome,
                "at": self.at, "in_doubt": self.in_doubt}


def outcome_words(stored: dict[str, JSON]) -> str:
    """A stored outcome in a few words: its value or error, and how it came to be."""
    outcome = decode(stored)
    if isinstance(outcome, Value):
        said = "-> " + _short(canonical_json(outcome.value))
    elif isinstance(outcome, Failure):
        said = f"raised {outcome.type}: {_short(outcome.message)}"
    elif isinstance(outcome, Stopped):
        said = f"child {outcome.status} ({outcome.reason})"
    else:
        said = "in doubt (raised ToolInDoubt)"
    notes = [note for key, note in (("rerun", "run again after doubt"), ("settled", "settled by an operator"))
             if key in outcome.beside]
    return said + "".join(f" [{note}]" for note in notes)


@dataclass(frozen=True)
class JournalView:
    """What the store holds of one process's journal, read once: its record, one line per slot
    in program order (each syscall, each tool call its code made, each effect started with no
    outcome: in doubt), and its intents by key (what ``settle`` writes from)."""

    record: ProcessRecord
    lines: list[JournalLine]
    intents: dict[str, dict[str, Any]]

    def line(self, slot: str) -> JournalLine | None:
        return next((line for line in self.lines if line.slot == slot), None)


async def journal_lines(store: KernelStore, pid: int) -> JournalView:
    """Process ``pid``'s journal as ``ringzero show`` prints it (four reads)."""
    record = await store.load_process(pid)
    if record is None:
        raise InvalidArgument(f"no process {pid} in the store")
    lines: dict[str, JournalLine] = {}
    for entry in await store.journal(pid):
        lines[str(entry.seq)] = JournalLine(str(entry.seq), entry.kind, entry.summary, entry.outcome.to_json(),
                                            entry.at, isinstance(entry.outcome, InDoubt))
    calls, _ = await store.calls(pid)
    for key, call in calls.items():
        lines[key] = JournalLine(key, call.kind, call.summary, call.outcome.to_json(), call.at,
                                 isinstance(call.outcome, InDoubt))
    intents = await store.intents(pid)
    for key, intent in intents.items():
        if key not in lines and not intent.get("run_again"):
            lines[key] = JournalLine(key, str(intent.get("kind", "")), str(intent.get("summary", "")), None,
                                     _time(intent.get("at")), True)
    ordered = sorted(lines.values(), key=lambda line: tuple(int(part) for part in line.slot.split(".")))
    return JournalView(record, ordered, intents)


async def settle(store: KernelStore, pid: int, slot: str, *, result: Any = None, error: str | None = None,
                 run_again: bool = False, has_result: bool = False) -> tuple[ProcessRecord, JournalLine]:
    """Decide in-doubt call ``slot`` of process ``pid`` (see the module): exactly one of
    ``result`` (with ``has_result``: None is a result), ``error`` or ``run_again``. Everything is
    checked before anything is written; InvalidArgument names what was wrong. Returns the
    process's record and the slot as it now stands."""
    if sum((has_result, error is not None, run_again)) != 1:
        raise InvalidArgument("settle takes exactly one decision: a result, an error, or run again")
    if not isinstance(slot, str) or not _SLOT.match(slot):
        raise InvalidArgument(f"a slot is a syscall's number (7) or a tool call's under its exec (7.3), not {slot!r}")
    if has_result:
        ensure_json(result, "the settled result")
    if error is not None and (not isinstance(error, str) or not error.strip()):
        raise InvalidArgument("the settled error needs a message")
    journal = await journal_lines(store, pid)
    record, line = journal.record, journal.line(slot)
    if line is None or not line.in_doubt:
        shown = "it holds no such slot" if line is None else f"it is {line.said}"
        raise InvalidArgument(f"slot {slot} of pid {pid} is not in doubt ({shown}): only a call started without "
                              "an outcome, or one whose in-doubt record failed its process, can be settled")
    intent = journal.intents.get(slot)
    if intent is None:  # an exec whose tool call was in doubt: that call is what is decided
        under = [other.slot for other in journal.lines if other.slot.startswith(f"{slot}.") and other.in_doubt]
        raise InvalidArgument(f"slot {slot} of pid {pid} is an exec that stopped at a tool call in doubt: settle "
                              f"that call ({', '.join(under) or 'none is recorded'})")
    top = slot.partition(".")[0]
    holder = journal.line(top)
    told = holder is not None and holder.outcome is not None  # the program got this slot's record
    if told and record.status is not ProcessStatus.FAILED:
        raise InvalidArgument(f"slot {slot} of pid {pid} was already reported in doubt to its program, which went on "
                              f"({record.status.value}): settling it now would change what the program saw")
    if told and not store.checkpointer.capabilities.delete_checkpoints:
        raise InvalidArgument("this store cannot delete a record, which settling a failed process's in-doubt call "
                              "needs (its record goes, for the retry to read the decision)")
    if told:  # a failed process's in-doubt record: it goes, and a retry runs that slot again
        await store.drop_journal_entry(pid, int(top))
    if run_again:
        await store.release_intent(pid, slot, intent)
        return record, JournalLine(slot, line.kind, line.summary, None, None, False)
    kind, fp = line.kind, str(intent.get("fp", ""))
    outcome: Outcome = Value(result) if has_result else Failure(SETTLED_ERROR, f"{error} (settled by an operator)")
    outcome = with_beside(outcome, settled="operator")
    if "." in slot:
        await store.record_call(pid, slot, kind, fp, line.summary, outcome)
    else:
        await store.append_journal(pid, JournalEntry(int(slot), kind, fp, line.summary, outcome))
    return record, JournalLine(slot, kind, line.summary, outcome.to_json(), None, False)


def _short(text: str, limit: int = 60) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit - 1] + "…"


def _time(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None
