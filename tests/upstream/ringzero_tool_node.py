"""A pytest plugin for LangGraph's own ToolNode tests (langgraph-prebuilt's sdist, fetched at
test time by tests/test_upstream_langgraph.py): ``KernelToolNode`` is put in place of
``ToolNode`` wherever LangGraph looks it up, before the test modules import it.

With ``RINGZERO_UPSTREAM_MODE=kernel`` every test also runs inside a kernel process (see
``_in_kernel``), so each tool call it makes goes through the journal; the summary counts them.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import os
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from ringzero import Context, Kernel
from ringzero.adapters.langgraph import KernelToolNode
from ringzero.checkpointers import MemoryCheckpointer

KERNEL_MODE = os.environ.get("RINGZERO_UPSTREAM_MODE") == "kernel"
_journaled_tool_calls = 0
_tests_in_kernel = 0


def _substitute() -> None:
    import langgraph.prebuilt
    import langgraph.prebuilt.chat_agent_executor
    import langgraph.prebuilt.tool_node

    for module in (langgraph.prebuilt, langgraph.prebuilt.tool_node, langgraph.prebuilt.chat_agent_executor):
        module.ToolNode = KernelToolNode  # type: ignore[attr-defined,misc]


_substitute()  # at plugin import: before any test module runs `from langgraph.prebuilt import ToolNode`


async def _in_process(make: Callable[[], Awaitable[Any]]) -> Any:
    """Run ``make()`` as the body of a kernel process; its result or its exception comes back."""
    global _journaled_tool_calls, _tests_in_kernel
    outcome: dict[str, Any] = {}

    async def program(ctx: Context) -> None:
        try:
            outcome["value"] = await make()
        except BaseException as exc:  # the test's own failure, re-raised below as itself
            outcome["error"] = exc

    async with Kernel(checkpointer=MemoryCheckpointer()) as kernel:
        handle = await kernel.spawn(program, name="upstream-test")
        await handle.wait()
        _journaled_tool_calls += sum(e.kind == "tool" for e in await kernel.store.journal(handle.pid))
    _tests_in_kernel += 1
    if "error" in outcome:
        raise outcome["error"]
    return outcome.get("value")


def _in_kernel(test: Callable[..., Any]) -> Callable[..., Any]:
    """The test, run as the body of a kernel process, in a worker thread of that process: a sync
    test as a framework's sync call runs there, an async one on an event loop of its own in that
    thread, as a framework with its own loop runs (CrewAI, a sync graph's async nodes). Either
    way the test may block, as ToolNode's own tests do (``invoke`` inside ``async def``), without
    blocking the loop that the journal is written on."""
    if inspect.iscoroutinefunction(test):
        @functools.wraps(test)
        async def run_async(*args: Any, **kwargs: Any) -> Any:
            return await _in_process(lambda: asyncio.to_thread(asyncio.run, test(*args, **kwargs)))

        return run_async

    @functools.wraps(test)
    def run_sync(*args: Any, **kwargs: Any) -> Any:
        return asyncio.run(_in_process(lambda: asyncio.to_thread(test, *args, **kwargs)))

    return run_sync


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    if not KERNEL_MODE:
        return
    for item in items:
        if isinstance(item, pytest.Function):
            item.obj = _in_kernel(item.obj)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if KERNEL_MODE:
        terminalreporter.write_line(f"ringzero: {_tests_in_kernel} tests ran inside a kernel process; "
                                    f"{_journaled_tool_calls} tool calls went through the journal")
