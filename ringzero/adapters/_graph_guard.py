"""A graph run inside a kernel process has one source of durability: the kernel's journal.

Compiled with a persistent LangGraph checkpointer as well, the two disagree after a crash: the
resumed program sends its input again, the checkpointer's thread already holds the steps the
journal replays, and the thread ends with those steps twice. So the kernel's model and tool
node refuse such a graph at its first model or tool call, fresh run or resumed. A
``KernelSaver`` over a store that outlives the process refuses it earlier, at the graph's
first read of its thread, before any node runs (and refuses any write to it from inside a
process: ``aupdate_state`` too). On Python 3.10 that is the only refusal that comes before
the first model call: LangGraph runs an async node there without its config in the context
(3.10's ``asyncio.create_task`` takes no ``context=``), so the model cannot see the graph.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ringzero.core.context import Context
from ringzero.core.contract.errors import InvalidArgument

__all__ = ["lives_in_memory", "refuse_in_process", "refuse_persistent_checkpointer"]

_CHECKPOINTER_KEY = "__pregel_checkpointer"
"""Where LangGraph puts a running graph's checkpointer in its config (``CONFIG_KEY_CHECKPOINTER``)."""
_RUNTIME_KEY = "__pregel_runtime"
"""What LangGraph's loop puts in the config of a running graph's reads (``CONFIG_KEY_RUNTIME``):
its first ``aget_tuple`` carries it, ``aget_state``'s does not."""


def refuse_persistent_checkpointer(pid: int, config: Mapping[str, Any] | None = None) -> None:
    """Raise InvalidArgument when the graph making this call (its config, or the current
    runnable's) has a checkpointer that outlives the process: anything but LangGraph's
    ``InMemorySaver`` or a ``KernelSaver`` over a ``MemoryCheckpointer``."""
    if config is None:
        from langchain_core.runnables.config import var_child_runnable_config

        config = var_child_runnable_config.get()
    configurable = (config or {}).get("configurable") or {}
    saver = configurable.get(_CHECKPOINTER_KEY)
    if saver is None or isinstance(saver, bool) or lives_in_memory(saver):
        return
    raise _refusal(pid, saver)


def refuse_in_process(saver: Any, config: Mapping[str, Any] | None = None) -> None:
    """Raise InvalidArgument when code running in a kernel process asks ``saver`` (a
    ``KernelSaver`` whose store outlives the process) to write (no ``config``), or to read
    for a running graph (``config``: the read's, which then names a running graph)."""
    ctx = Context.current()
    if ctx is None:
        return
    if config is not None and not (config.get("configurable") or {}).get(_RUNTIME_KEY):
        return  # a read outside a graph's run: aget_state, a history
    raise _refusal(ctx.pid, saver)


def _refusal(pid: int, saver: Any) -> InvalidArgument:
    return InvalidArgument(
        f"a LangGraph graph compiled with a persistent checkpointer ({type(saver).__name__}) is running inside "
        f"kernel process pid {pid}: the kernel's journal already makes the run durable, and after a crash the two "
        "would disagree (the resumed program sends its input again, and the thread would repeat its steps). "
        "Compile the graph without checkpointer= (or with InMemorySaver, for interrupts within one run)")


def lives_in_memory(saver: Any) -> bool:
    """Whether a LangGraph checkpointer dies with the process: ``InMemorySaver``, or a
    ``KernelSaver`` over a ``MemoryCheckpointer``."""
    from ringzero.checkpointers.memory import MemoryCheckpointer

    if isinstance(getattr(saver, "checkpointer", None), MemoryCheckpointer):
        return True  # a KernelSaver whose store dies with the process
    try:
        from langgraph.checkpoint.memory import InMemorySaver
    except ImportError:  # pragma: no cover - a graph config without langgraph installed
        return False
    return isinstance(saver, InMemorySaver)
