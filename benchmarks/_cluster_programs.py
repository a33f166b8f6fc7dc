"""What every node of the cluster benchmark imports (by reference): its kernel and programs."""

from __future__ import annotations

import time

from ringzero import Context, Kernel
from ringzero.checkpointers.postgres import PostgresCheckpointer
from ringzero.testing import ScriptedProvider


def node_kernel(dsn: str, latency: float = 0.0) -> Kernel:
    model = ScriptedProvider(lambda request: "ok", latency=latency)
    return Kernel(llm=model, checkpointer=PostgresCheckpointer(dsn, max_connections=8))


async def nothing(ctx: Context) -> None:
    return None


async def timed_calls(ctx: Context, calls: int) -> list[float]:
    """Seconds each ``ctx.llm`` call took, inside the process (the provider answers at once)."""
    took = []
    for i in range(calls):
        started = time.perf_counter()
        await ctx.llm(f"call {i}")
        took.append(time.perf_counter() - started)
    return took


async def short_agent(ctx: Context, calls: int) -> int:
    for i in range(calls):
        await ctx.llm(f"step {i}")
    return calls


async def idle(ctx: Context) -> object:
    return await ctx.recv()
