"""The refusals of ``sandboxed`` in a framework's own suite, counted by documented cause: what
both tool plugins beside this module report at the end of their run."""

from __future__ import annotations

import collections
import os
from typing import Any

import pytest


class Refusals:
    """Refusals by cause; one whose words match no cause in ``causes`` fails the run."""

    def __init__(self, causes: dict[str, str]) -> None:
        self.causes = causes
        """What a refusal says, and the cause the README documents."""
        self.counts: collections.Counter[str] = collections.Counter()
        self.unknown: list[str] = []

    def add(self, error: Exception) -> None:
        words = str(error)
        cause = next((c for marker, c in self.causes.items() if marker in words), None)
        if cause is None:
            self.unknown.append(words)
        self.counts[cause or "unknown"] += 1
        shown = os.environ.get("RINGZERO_SHOW_REFUSALS")  # a file to write each refusal's words to
        if shown:
            with open(shown, "a") as out:
                out.write(f"{words}\n")

    def report(self, terminalreporter: Any, head: str) -> None:
        """``head``, then the refusals by cause, as one line; a line per refusal of no cause."""
        causes = "; ".join(f"{cause}: {n}" for cause, n in sorted(self.counts.items()))
        terminalreporter.write_line(f"{head}; refused {sum(self.counts.values())} ({causes})")
        for words in self.unknown:
            terminalreporter.write_line(f"ringzero: a refusal of no documented cause: {words}")

    def fail_if_unknown(self, session: pytest.Session) -> None:
        if self.unknown and session.exitstatus == 0:
            session.exitstatus = 1
