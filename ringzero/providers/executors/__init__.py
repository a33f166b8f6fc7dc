"""Executors: where agent-written code runs.

``MontyExecutor`` (the kernel's default) is imported lazily, so importing this package does
not load pydantic-monty until an executor is asked for.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ringzero.providers.executors.monty import MontyExecutor

__all__ = ["MontyExecutor"]


def __getattr__(name: str) -> Any:
    if name == "MontyExecutor":
        from ringzero.providers.executors.monty import MontyExecutor

        return MontyExecutor
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
