"""A graph run inside a kernel process has one source of durability: the kernel's journal.

Compiled with a persistent LangGraph checkpointer as well, the two disagree after a crash: the
resumed program sends its input again, the checkpointer's thread already holds the steps the
journal replays, and the thread ends with those steps twice. So the kernel's model and tool
node refuse such a graph at its first model or tool call, fresh run or resumed.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ringzero.core.errors import InvalidArgument

__all__ = ["refuse_persistent_checkpointer"]

_CHECKPOINTER_KEY = "__pregel_checkpointer"
"""Where LangGraph puts a running graph's checkpointer in its config (``CONFIG_KEY_CHECKPOINTER``)."""


def refuse_persistent_checkpointer(pid: int, config: Mapping[str, Any] | None = None) -> None:
    """Raise InvalidArgument when the graph making this call (its config, or the current
    runnable's) has a checkpointer that outlives the process: anything but LangGraph's
    ``InMemorySaver`` or a ``KernelSaver`` over a ``MemoryCheckpointer``."""
    if config is None:
        from langchain_core.runnables.config import var_child_runnable_config

        config = var_child_runnable_config.get()
    configurable = (config or {}).get("configurable") or {}
    saver = configurable.get(_CHECKPOINTER_KEY)
    if saver is None or isinstance(saver, bool) or _lives_in_memory(saver):
        return
    raise InvalidArgument(
        f"a LangGraph graph compiled with a persistent checkpointer ({type(saver).__name__}) is running inside "
        f"kernel process pid {pid}: the kernel's journal already makes the run durable, and after a crash the two "
        "would disagree (the resumed program sends its input again, and the thread would repeat its steps). "
        "Compile the graph without checkpointer= (or with InMemorySaver, for interrupts within one run)")


def _lives_in_memory(saver: Any) -> bool:
    from ringzero.checkpointers.memory import MemoryCheckpointer

    if isinstance(getattr(saver, "checkpointer", None), MemoryCheckpointer):
        return True  # a KernelSaver whose store dies with the process
    try:
        from langgraph.checkpoint.memory import InMemorySaver
    except ImportError:  # pragma: no cover - a graph config without langgraph installed
        return False
    return isinstance(saver, InMemorySaver)
