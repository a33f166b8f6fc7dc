"""Checkpointers: where processes, journals and LangGraph checkpoints are kept.

``PostgresCheckpointer`` (pip install 'ringzero[postgres]') is imported lazily.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ringzero.checkpointers.memory import MemoryCheckpointer
from ringzero.checkpointers.sqlite import SqliteCheckpointer
from ringzero.core.contract.errors import InvalidArgument

if TYPE_CHECKING:
    from ringzero.checkpointers.postgres import PostgresCheckpointer
    from ringzero.core.contract.protocols import Checkpointer

__all__ = ["NAMES", "MemoryCheckpointer", "PostgresCheckpointer", "SqliteCheckpointer", "open_checkpointer"]


NAMES = ("memory (or :memory:)", "sqlite:///absolute/path.db", "a file path", "postgresql://...")
"""What a checkpointer may be named by (``open_checkpointer``, ``Kernel(checkpointer=...)``)."""


def open_checkpointer(target: str | Path) -> Checkpointer:
    """The checkpointer a connection string names: ``memory`` (or ``:memory:``) for one that
    keeps nothing after the process; ``postgresql://...`` (or ``postgres://``); a SQLite file,
    as ``sqlite:///path`` (a URL: ``sqlite:///tmp/x.db`` is ``/tmp/x.db``) or a plain path.
    Another scheme (``redis://``...) is refused with the list, rather than taken for a path."""
    if isinstance(target, Path):
        return SqliteCheckpointer(target)
    if not isinstance(target, str) or not target:
        raise InvalidArgument(f"a checkpointer is named by a non-empty string or path, not {target!r}")
    if target.startswith(("postgresql://", "postgres://")):
        from ringzero.checkpointers.postgres import PostgresCheckpointer

        return PostgresCheckpointer(target)
    if target in (":memory:", "memory"):
        return MemoryCheckpointer()
    if target.startswith("sqlite://"):
        path = target[len("sqlite://"):]
        if not path.startswith("/") or path == "/":
            raise InvalidArgument(f"{target!r}: a SQLite URL names an absolute path, as sqlite:///tmp/state.db "
                                  "(or give the path itself)")
        return SqliteCheckpointer(path)
    scheme = re.match(r"^([A-Za-z][A-Za-z0-9+.-]*)://", target)
    if scheme is not None:
        raise InvalidArgument(f"no checkpointer for {scheme.group(1)}:// ({target!r}); a checkpointer is named by "
                              + ", ".join(NAMES))
    return SqliteCheckpointer(target)


def __getattr__(name: str) -> Any:
    if name == "PostgresCheckpointer":
        from ringzero.checkpointers.postgres import PostgresCheckpointer

        return PostgresCheckpointer
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
