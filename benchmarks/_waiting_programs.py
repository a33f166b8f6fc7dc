"""What ``benchmarks/waiting_processes.py`` and the hosts it starts import (by reference): the
kernel of its store and its programs."""

from __future__ import annotations

import asyncio
import datetime
import sys
import time
from typing import Any

from ringzero import Context, Kernel
from ringzero.checkpointers import SqliteCheckpointer


def make_kernel(db: Any) -> Kernel:
    """What ``ringzero serve --kernel _waiting_programs:make_kernel`` builds."""
    return Kernel(checkpointer=SqliteCheckpointer(db))


async def waits_for_mail(ctx: Context) -> float:
    """Waits for one message; returns when (wall clock) it got it."""
    await ctx.recv()
    return time.time()


async def sleeps_until(ctx: Context, when: str) -> float:
    """Sleeps until ``when``; returns when it woke."""
    await ctx.sleep_until(datetime.datetime.fromisoformat(when))
    return time.time()


async def hold(db: str) -> None:
    """The peer: one kernel that resumes every waiting process and holds it in memory (no
    letting go), as a host does without ``let_go_waiting``."""
    async with make_kernel(db) as kernel:
        await kernel.recover()
        print("holding", flush=True)
        await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(hold(sys.argv[1]))
