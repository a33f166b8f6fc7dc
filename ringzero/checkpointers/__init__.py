"""Checkpointers: where processes, journals and LangGraph checkpoints are kept.

``PostgresCheckpointer`` (pip install 'ringzero[postgres]') is imported lazily.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ringzero.checkpointers.memory import MemoryCheckpointer
from ringzero.checkpointers.sqlite import SqliteCheckpointer

if TYPE_CHECKING:
    from ringzero.checkpointers.postgres import PostgresCheckpointer

__all__ = ["MemoryCheckpointer", "PostgresCheckpointer", "SqliteCheckpointer"]


def __getattr__(name: str) -> Any:
    if name == "PostgresCheckpointer":
        from ringzero.checkpointers.postgres import PostgresCheckpointer

        return PostgresCheckpointer
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
