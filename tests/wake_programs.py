"""The kernel and program of the one-host-per-wake trials (``tests/test_one_host_per_wake.py``).

``stamp_after`` sleeps, then calls the ``stamp`` tool once; the tool appends a line to
``$RINGZERO_TEST_LOG``, synced, so that a trial counts at the tool how many times the code after
the sleep ran. The tool is neither idempotent nor keyed: a second run of it is a repeated effect.
"""

from __future__ import annotations

import os
from typing import Any

from ringzero import Context, Kernel
from ringzero.checkpointers import open_checkpointer
from tests.hosts import append_synced


def stamp_tool(label: str) -> str:
    append_synced(os.environ["RINGZERO_TEST_LOG"], f"{label} {os.getpid()}")
    return "stamped"


async def stamp_after(ctx: Context, label: str, seconds: float) -> Any:
    await ctx.sleep(seconds)
    return await ctx.tool("stamp", label)


def make_kernel(db: Any) -> Kernel:
    return Kernel(checkpointer=open_checkpointer(str(db)), tools={"stamp": stamp_tool})
