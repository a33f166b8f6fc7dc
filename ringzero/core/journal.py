"""The syscall journal of one process: durable execution's source of truth.

Each syscall's outcome is appended (and durable) before the program sees it. After a
crash the program is run again from the top: while its syscalls match the journal, their
recorded outcomes are served without calling the LLM, executor or tool again; past the
last record it runs live. A syscall whose kind or arguments differ from the record at the
same position raises NonDeterminismError instead of corrupting the run.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from ringzero.core.errors import NonDeterminismError
from ringzero.core.store import JournalEntry, KernelStore
from ringzero.core.types import JSON

__all__ = ["Journal", "fingerprint"]


def fingerprint(args: Any) -> str:
    """A short stable hash of a syscall's arguments (canonical JSON, repr for the rest)."""
    canonical = json.dumps(args, sort_keys=True, separators=(",", ":"), default=repr)
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


class Journal:
    """Replays recorded syscalls in order, then records new ones."""

    def __init__(self, store: KernelStore, pid: int, entries: list[JournalEntry] | None = None) -> None:
        self._store = store
        self._pid = pid
        self._entries = entries or []
        self._cursor = 0

    @property
    def replaying(self) -> bool:
        return self._cursor < len(self._entries)

    @property
    def length(self) -> int:
        return len(self._entries)

    @property
    def entries(self) -> tuple[JournalEntry, ...]:
        return tuple(self._entries)

    def replay(self, kind: str, fp: str, summary: str) -> dict[str, JSON] | None:
        """The recorded outcome of the next syscall, or None once past the journal."""
        if self._cursor >= len(self._entries):
            return None
        entry = self._entries[self._cursor]
        if entry.kind != kind or entry.fingerprint != fp:
            raise NonDeterminismError(
                f"pid {self._pid}: syscall #{entry.seq} was recorded as {entry.kind}({entry.summary}) "
                f"but the resumed program now asks for {kind}({summary}); a program must make the "
                "same syscalls in the same order when it is resumed"
            )
        self._cursor += 1
        return entry.outcome

    async def record(self, kind: str, fp: str, summary: str, outcome: dict[str, JSON]) -> None:
        """Append an outcome; durable when this returns."""
        entry = JournalEntry(len(self._entries) + 1, kind, fp, summary, outcome)
        await self._store.append_journal(self._pid, entry)
        self._entries.append(entry)
        self._cursor = len(self._entries)
