"""A kernel in an OS process of its own, for ``ringzero top`` to watch and control.

Run as ``python -m tests.top_host DB``. It runs three chatty agents that spend different
numbers of tokens (agent i's prompts are longer by i) until the file ``DB.done`` appears, and
one that sleeps until it is killed, and prints one JSON line per process as each ends: pid,
name, status, stop reason, result.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys

from ringzero import Context, Kernel
from ringzero.core.contract.errors import RingzeroError
from ringzero.testing import ScriptedProvider


async def chatty(ctx: Context, size: int, done_file: str) -> int:
    rounds = 0
    while not os.path.exists(done_file):  # noqa: ASYNC240 - a stat, once a round: the test's signal to stop
        await ctx.llm(f"step {rounds} " + "word " * (40 * size))
        await ctx.sleep(0.1)
        rounds += 1
    return rounds


async def sleeper(ctx: Context) -> str:
    await ctx.sleep(3600)
    return "woke up"


async def report(handle: object) -> None:
    try:
        result = await handle.wait()  # type: ignore[attr-defined]
    except RingzeroError:
        result = None
    print(json.dumps({"pid": handle.pid, "name": handle.name, "status": handle.status.value,  # type: ignore[attr-defined]
                      "stop_reason": getattr(handle.stop_reason, "value", None), "result": result}), flush=True)  # type: ignore[attr-defined]


async def main(db: str) -> None:
    provider = ScriptedProvider(lambda request: "noted", latency=0.05)
    async with Kernel(llm=provider, checkpointer=db) as kernel:
        handles = [await kernel.spawn(chatty, size, db + ".done", name=f"chatty-{size}") for size in (1, 2, 3)]
        handles.append(await kernel.spawn(sleeper, name="victim"))
        print("started", flush=True)
        await asyncio.gather(*(report(h) for h in handles))


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
