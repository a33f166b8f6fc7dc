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

__all__ = ["EXECUTOR_NAMES", "MicrosandboxExecutor", "MontyExecutor", "ProcessExecutor", "executor_named"]

EXECUTOR_NAMES = ("monty", "process", "microsandbox")
"""The names ``Kernel(executor=...)``, ``create_agent`` and the adapters' ``executor=`` accept."""


def executor_named(name: str, **options: Any) -> Any:
    """A new executor of the kind ``name`` names (``EXECUTOR_NAMES``), with ``options``;
    InvalidArgument naming the known ones otherwise."""
    from ringzero.core.contract.errors import InvalidArgument

    if name == "monty":
        from ringzero.providers.executors.monty import MontyExecutor

        return MontyExecutor(**options)
    if name == "process":
        from ringzero.providers.executors.process import ProcessExecutor

        return ProcessExecutor(**options)
    if name == "microsandbox":
        from ringzero.providers.executors.microsandbox import MicrosandboxExecutor

        return MicrosandboxExecutor(**options)
    raise InvalidArgument(f"no executor named {name!r}; the names are {', '.join(map(repr, EXECUTOR_NAMES))}, or "
                          "pass an Executor object")


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
