"""Programs that wait on timers, for the kill -9 trials of ``test_timer_kills``.

A host (``python -m tests.timer_programs DB PROGRAM SECONDS``) spawns one, prints ``waiting
<deadline>`` once its timer is set, and is killed with SIGKILL at a random moment of the wait;
``ringzero resume`` or ``ringzero serve --kernel tests.timer_programs:make_kernel`` finishes it.
Each program returns the wall-clock time it woke at, for the trial to hold against the deadline
journaled before the kill.
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any

from ringzero import Context, Kernel
from ringzero.checkpointers import open_checkpointer


async def sleeper(ctx: Context, seconds: float) -> float:
    await ctx.sleep(seconds)
    return (await ctx.now()).timestamp()


async def receiver(ctx: Context, seconds: float) -> list[Any]:
    """A wait for a message that never comes: the timeout ends it."""
    got = await ctx.recv(timeout=seconds)
    return [got, (await ctx.now()).timestamp()]


PROGRAMS = {p.__name__: p for p in (sleeper, receiver)}


def make_kernel(db: Any) -> Kernel:
    """What ``ringzero resume --kernel tests.timer_programs:make_kernel`` builds."""
    return Kernel(checkpointer=open_checkpointer(str(db)))


async def host(db: str, program: str, seconds: float) -> None:
    async with make_kernel(db) as kernel:
        handle = await kernel.spawn(PROGRAMS[program], seconds, name=program)
        while handle.wake_at is None:
            await asyncio.sleep(0.005)
        print("waiting", handle.wake_at.timestamp(), flush=True)
        await asyncio.sleep(3600)  # stay alive: the trial kills us


if __name__ == "__main__":
    asyncio.run(host(sys.argv[1], sys.argv[2], float(sys.argv[3])))
