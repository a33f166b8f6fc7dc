"""Where the kernel gets the backends it was not given, without importing any of them.

Core names only the protocols. The package's ``ringzero.defaults`` (installed by
``ringzero/__init__``, which runs before any of its modules) says which backend stands behind
each: SQLite, Monty, the local scheduler. A program may install its own with ``install``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from ringzero.core.contract.errors import RingzeroError
from ringzero.core.contract.protocols import Checkpointer, Executor, Scheduler

__all__ = ["DefaultBackends", "defaults", "install"]


class DefaultBackends(Protocol):
    """What stands behind each protocol when a Kernel was given none (or a name)."""

    def checkpointer(self, spec: str | Path | None, state_dir: Path) -> Checkpointer:
        """The store for ``spec``: a path or DSN, or None for the default under ``state_dir``."""

    def executor(self, spec: str | None) -> Executor:
        """The executor named ``spec`` (``"monty"``, ``"process"``), or None for the default."""

    def scheduler(self, max_running: int | None) -> Scheduler:
        """The scheduler of a single host."""


_installed: DefaultBackends | None = None


def install(backends: DefaultBackends) -> None:
    """Make ``backends`` what every Kernel built from now on resolves its defaults with."""
    global _installed
    _installed = backends


def defaults() -> DefaultBackends:
    if _installed is None:  # ringzero/__init__ installs them: only a broken import lands here
        raise RingzeroError("no default backends are installed: import ringzero before ringzero.core")
    return _installed
