"""Checkpointers: where processes, journals and LangGraph checkpoints are kept."""

from __future__ import annotations

from ringzero.checkpointers.memory import MemoryCheckpointer
from ringzero.checkpointers.sqlite import SqliteCheckpointer

__all__ = ["MemoryCheckpointer", "SqliteCheckpointer"]
