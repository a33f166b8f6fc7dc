"""The tools ``ctx.exec`` hands an executor (``bound_tools``): the tool's own signature, every
call through the boundary however and wherever the executor makes it."""

from __future__ import annotations

import asyncio
import inspect
from typing import Any

import pytest

from ringzero import ExecLimits, Kernel, ProcessFailed, code_may_set
from ringzero.core.support.tool_boundary import bound_tools, unbound


@code_may_set("units")
def lookup(city: str, units: str = "metric", api_key: str = "sk-host") -> str:
    return f"{city} in {units} with {api_key[:2]}"


async def fetch(url: str) -> str:
    await asyncio.sleep(0)
    return f"<{url}>"


async def test_a_bound_tool_has_the_tool_s_signature_and_name_and_nothing_more_to_call() -> None:
    bound = bound_tools({"lookup": lookup, "fetch": fetch}, None)
    assert inspect.signature(bound["lookup"]) == inspect.signature(lookup)
    assert bound["lookup"].__name__ == "lookup" and inspect.iscoroutinefunction(bound["fetch"])
    assert not inspect.iscoroutinefunction(bound["lookup"])
    assert unbound(bound["lookup"]) == (lookup, None) and unbound(lookup) == (lookup, None)


async def test_a_sync_tool_is_called_from_a_thread_or_awaited_and_refused_on_the_loop_s_own_thread() -> None:
    bound = bound_tools({"lookup": lookup}, None)["lookup"]
    assert await asyncio.to_thread(bound, "Oslo") == "Oslo in metric with sk"
    assert await bound.acall("Oslo", units="imperial") == "Oslo in imperial with sk"  # type: ignore[attr-defined]
    with pytest.raises(RuntimeError, match=r"called on the event loop's own thread.*await lookup.acall"):
        bound("Oslo")
    with pytest.raises(TypeError, match="api_key"):  # the host's parameter, however the call is made
        await asyncio.to_thread(bound, "Oslo", api_key="sk-mine")


async def test_an_async_tool_awaited_on_an_executor_s_own_loop_is_called_on_the_kernel_s() -> None:
    """An executor that runs code on an event loop of its own, in a thread, awaits the tools
    there: each call is still made (and journaled) on the kernel's loop."""
    seen_loops: list[Any] = []

    async def where(tag: str) -> str:
        seen_loops.append(asyncio.get_running_loop())
        return tag

    kernel_loop = asyncio.get_running_loop()
    bound = bound_tools({"where": where}, None)["where"]
    result = await asyncio.to_thread(asyncio.run, bound("from another loop"))
    assert result == "from another loop" and seen_loops == [kernel_loop]


async def test_limits_hold_for_an_executor_that_calls_the_tools_itself() -> None:
    def page() -> str:
        return "z" * 5000

    bound = bound_tools({"page": page}, ExecLimits(tool_bytes=100))["page"]
    with pytest.raises(ValueError, match=r"the result of page\(\) is more than 100 bytes of JSON"):
        await asyncio.to_thread(bound)


async def test_a_run_with_egress_and_a_tool_of_the_built_in_s_name_is_still_refused() -> None:
    """The kernel's boundary leaves egress to the executor (``HostTools``), which refuses a
    user tool named like its built-in one as before."""
    from ringzero import Egress
    from ringzero.providers.executors.monty import MontyExecutor

    async def program(ctx: Any) -> Any:
        return await ctx.exec("1", tools={"http_request": lookup},
                              limits=ExecLimits(egress=Egress(allow=["api.example.com"])))

    async with Kernel(checkpointer=":memory:", executor=MontyExecutor(), monitor_interval=None) as kernel:
        handle = await kernel.spawn(program)
        with pytest.raises(ProcessFailed, match="a run with egress has the built-in tool 'http_request'"):
            await handle.wait()
