"""Executors: where agent-written code runs.

``MontyExecutor`` (the kernel's default) and ``ProcessExecutor`` (full CPython, Linux) are
imported lazily, so importing this package loads neither until one is asked for.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ringzero.providers.executors.microsandbox import MicrosandboxExecutor
    from ringzero.providers.executors.monty import MontyExecutor
    from ringzero.providers.executors.process import ProcessExecutor

__all__ = ["MicrosandboxExecutor", "MontyExecutor", "ProcessExecutor"]


def __getattr__(name: str) -> Any:
    if name == "MontyExecutor":
        from ringzero.providers.executors.monty import MontyExecutor

        return MontyExecutor
    if name == "MicrosandboxExecutor":  # pip install 'ringzero[microsandbox]'
        from ringzero.providers.executors.microsandbox import MicrosandboxExecutor

        return MicrosandboxExecutor
    if name == "ProcessExecutor":
        from ringzero.providers.executors.process import ProcessExecutor

        return ProcessExecutor
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
