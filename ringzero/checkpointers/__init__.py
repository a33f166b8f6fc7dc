"""Checkpointers: where processes, journals and LangGraph checkpoints are kept.

``PostgresCheckpointer`` (pip install 'ringzero[postgres]') is imported lazily.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from ringzero.checkpointers.memory import MemoryCheckpointer
from ringzero.checkpointers.sqlite import SqliteCheckpointer
from ringzero.core.errors import InvalidArgument

if TYPE_CHECKING:
    from ringzero.checkpointers.postgres import PostgresCheckpointer
    from ringzero.core.protocols import Checkpointer

__all__ = ["MemoryCheckpointer", "PostgresCheckpointer", "SqliteCheckpointer", "open_checkpointer"]


def open_checkpointer(target: str | Path) -> Checkpointer:
    """The checkpointer a connection string names: ``postgresql://...`` (or ``postgres://``),
    ``:memory:`` for one that keeps nothing after the process, else a SQLite file path."""
    if isinstance(target, Path):
        return SqliteCheckpointer(target)
    if not isinstance(target, str) or not target:
        raise InvalidArgument(f"a checkpointer is named by a non-empty string or path, not {target!r}")
    if target.startswith(("postgresql://", "postgres://")):
        from ringzero.checkpointers.postgres import PostgresCheckpointer

        return PostgresCheckpointer(target)
    if target == ":memory:":
        return MemoryCheckpointer()
    return SqliteCheckpointer(target)


def __getattr__(name: str) -> Any:
    if name == "PostgresCheckpointer":
        from ringzero.checkpointers.postgres import PostgresCheckpointer

        return PostgresCheckpointer
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
