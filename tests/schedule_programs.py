"""The kernel and program of the schedule kill trials (``tests/test_schedule_kills.py``).

``ringzero serve --kernel tests.schedule_programs:make_kernel`` fires the schedule; each firing
runs ``stamp``, which calls the ``stamp`` tool once: the tool appends the idempotency key the
kernel gives that call (one per process, the same on every attempt) to ``$RINGZERO_TEST_LOG``,
synced, so the trial counts at the program which firings ran.
"""

from __future__ import annotations

import os
from typing import Any

from ringzero import Context, Kernel
from ringzero.checkpointers import open_checkpointer
from tests.hosts import append_synced


def stamp_tool(idempotency_key: str = "") -> str:
    append_synced(os.environ["RINGZERO_TEST_LOG"], idempotency_key)
    return "stamped"


async def stamp(ctx: Context) -> Any:
    return await ctx.tool("stamp")


def make_kernel(db: Any) -> Kernel:
    return Kernel(checkpointer=open_checkpointer(str(db)), tools={"stamp": stamp_tool})
