"""A host for the kill -9 trials (tests/test_kill_trials.py): 50 parents, each with a child,
doing what agents do (model calls to a vendor-format server, code run in Monty that calls a
host tool, memory, messages between the two, a host tool call, waiting for the child), on a
SQLite file or a PostgreSQL database. Run as ``python -m tests.chaos STORE URL TOOL_LOG``: it
prints ``spawned`` once every parent is started and ``done`` at the end; the trial kills it
with SIGKILL somewhere in between and resumes the work with ``make_kernel``.

Nothing in a result depends on a pid, so a resumed run and an uninterrupted one can be compared.
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path
from typing import Any

from ringzero import Context, Kernel, LLMGate, RetryPolicy, idempotent

PARENTS = 50


@idempotent
def chaos_tool(n: int) -> int:
    """A host tool: every real run is appended (and synced) to $CHAOS_TOOL_LOG. Safe to run again
    (a line in a log), so a call in flight at the kill runs again when resumed."""
    with Path(os.environ["CHAOS_TOOL_LOG"]).open("a") as log:
        log.write(f"tool {n}\n")
        log.flush()
        os.fsync(log.fileno())
    return n * n + 1


async def pair_child(ctx: Context, i: int, parent: int) -> dict[str, Any]:
    message = await ctx.recv(timeout=60)
    reply = await ctx.llm(f"child {i} got {message}")
    value = await ctx.tool("chaos_tool", 1000 + i)
    await ctx.send(parent, {"from": f"child {i}", "reply": reply.content, "value": value})
    return {"message": message, "value": value}


async def pair_parent(ctx: Context, i: int) -> dict[str, Any]:
    plan = await ctx.llm(f"parent {i} plan")
    ran = await ctx.exec("square(n) + 1", inputs={"n": i}, tools={"square": chaos_tool})
    await ctx.memory.remember(f"k{i}", {"plan": plan.content, "value": ran.value})
    child = await ctx.spawn(pair_child, i, ctx.pid, name=f"child-{i}")
    await ctx.send(child.pid, f"hello {i}")
    answer = await ctx.recv(timeout=60)
    child_result = await ctx.wait(child)
    recalled = await ctx.memory.recall(f"k{i}")
    final = await ctx.llm(f"parent {i} sums up {answer}")
    return {"plan": plan.content, "exec": ran.value, "answer": answer, "child": child_result,
            "recalled": recalled, "final": final.content}


def make_kernel(store: str | Path) -> Kernel:
    """The kernel of a trial's host, and of the one that resumes its work: $CHAOS_LLM_URL is the
    model server, ``store`` a SQLite path or a PostgreSQL DSN."""
    from ringzero.checkpointers import open_checkpointer
    from ringzero.providers.executors import MontyExecutor
    from ringzero.providers.llm import OpenAIProvider

    provider = OpenAIProvider("gpt-test", base_url=os.environ["CHAOS_LLM_URL"], api_key="test-key")
    return Kernel(llm=LLMGate(provider, retry=RetryPolicy(max_retries=2, timeout=20)), executor=MontyExecutor(),
                  checkpointer=open_checkpointer(store), tools={"chaos_tool": chaos_tool})


async def run_all(kernel: Kernel, announce: bool = False) -> dict[str, Any]:
    """Spawn the parents and wait for them all; every process's result by name."""
    handles = [await kernel.spawn(pair_parent, i, name=f"parent-{i}") for i in range(PARENTS)]
    if announce:
        print("spawned", flush=True)
    for handle in handles:
        await handle.wait()
    return await results(kernel)


async def results(kernel: Kernel) -> dict[str, Any]:
    """Every process in the store that exited, by name: its result."""
    return {r.name: r.result for r in await kernel.store.load_processes() if r.status.value == "exited"}


async def main(store: str, url: str, tool_log: str) -> None:
    os.environ["CHAOS_LLM_URL"], os.environ["CHAOS_TOOL_LOG"] = url, tool_log
    async with make_kernel(store) as kernel:
        await run_all(kernel, announce=True)
    print("done", flush=True)


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:4]))
