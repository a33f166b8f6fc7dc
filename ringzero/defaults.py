"""The backends a Kernel uses for what it was not given: a SQLite store under ``state_dir``,
the Monty executor, the local asyncio scheduler; and what a name stands for (a path or DSN for
the store, ``"monty"``/``"process"`` for the executor).

Each is imported when first needed, so ``import ringzero`` loads none of them. Core imports
none of this module either: ``ringzero/__init__`` installs it (``ringzero.core.support.backends``).
"""

from __future__ import annotations

from pathlib import Path

from ringzero.core.contract.protocols import Checkpointer, Executor, Scheduler

__all__ = ["BuiltInBackends"]


class BuiltInBackends:
    """ringzero's own backends, behind ``ringzero.core.support.backends.DefaultBackends``."""

    def checkpointer(self, spec: str | Path | None, state_dir: Path) -> Checkpointer:
        if spec is None:
            from ringzero.checkpointers.sqlite import SqliteCheckpointer

            return SqliteCheckpointer(state_dir / "state.db", create_folder=True)
        from ringzero.checkpointers import open_checkpointer  # as LangGraph's from_conn_string: a path or a DSN

        return open_checkpointer(spec)

    def executor(self, spec: str | None) -> Executor:
        if spec is None:
            from ringzero.providers.executors.monty import MontyExecutor

            return MontyExecutor()
        from ringzero.providers.executors import executor_named

        executor: Executor = executor_named(spec)
        return executor

    def scheduler(self, max_running: int | None) -> Scheduler:
        from ringzero.providers.schedulers.local import LocalScheduler

        return LocalScheduler(max_running=max_running)
