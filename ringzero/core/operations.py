"""What an operator does with processes in a store: read a journal, settle an in-doubt call, and
check that stored journals replay against the current code.

The public face of ``ringzero.core._engine.operating`` and ``replay_check`` (the engine's
modules are private); ``Kernel.retry`` and ``Kernel.fork`` resume from a journal."""

from ringzero.core._engine.operating import SETTLED_ERROR, JournalLine, journal_lines, outcome_words, settle
from ringzero.core._engine.replay_check import ReplayReport, copy_rows

__all__ = ["SETTLED_ERROR", "JournalLine", "ReplayReport", "copy_rows", "journal_lines", "outcome_words", "settle"]
