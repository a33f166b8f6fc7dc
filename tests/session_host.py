"""A host for ``tests/test_sessions.py``: one kernel process on a SQLite store whose session
defines a function and a class in step 1, makes ``CALLS`` tool calls in step 2 and uses what
step 1 defined in step 3. ``SESSION_KILL`` says where the host kills itself with SIGKILL, once
(a marker file beside the log): ``between`` (after step 1, before step 2) or ``during`` (inside
step 2's tenth call, its effect begun). Started again, it resumes what the store holds.
``SESSION_EXECUTOR``: ``monty`` (the default) or ``process``, where the session runs.

    python -m tests.session_host <db> <log> <calls>
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path
from typing import Any

from ringzero import Context, Kernel
from ringzero.checkpointers import SqliteCheckpointer
from ringzero.core.contract.protocols import Executor
from ringzero.providers.executors import MontyExecutor, ProcessExecutor
from tests.hosts import first_time, logged_effect

STEP_1 = """
def double(x):
    return 2 * x

class Box:
    def __init__(self, value):
        self.value = value

    def doubled(self):
        return Box(double(self.value))

note('step 1')
"""
STEP_3 = "note('step 3')\nBox(total).doubled().value"


def note(what: Any, idempotency_key: str = "") -> str:
    """An effect: a line as it starts and one as it ends, with the key the kernel gave it."""
    logged_effect(Path(os.environ["SESSION_LOG"]), what, idempotency_key,
                  die_inside=os.environ.get("SESSION_KILL") == "during" and what == 10)
    return f"noted {what}"


async def program(ctx: Context, calls: int) -> Any:
    tools = {"note": note}
    async with ctx.session() as session:
        await session.exec(STEP_1, tools=tools)
        if os.environ.get("SESSION_KILL") == "between" and first_time(Path(os.environ["SESSION_LOG"])):
            os.kill(os.getpid(), signal.SIGKILL)
        await session.exec(f"total = 0\nfor n in range(1, {calls + 1}):\n    note(n)\n    total += n\ntotal",
                           tools=tools)
        return (await session.exec(STEP_3, tools=tools)).value


def executor() -> Executor:
    return ProcessExecutor() if os.environ.get("SESSION_EXECUTOR") == "process" else MontyExecutor()


async def main(db: str, calls: int) -> None:
    async with Kernel(checkpointer=SqliteCheckpointer(db), executor=executor(), monitor_interval=None) as kernel:
        handles = await kernel.recover({"program": program})
        if not handles:
            known = await kernel.ps(all=True)
            handles = [await kernel.handle(known[0].pid) if known else await kernel.spawn(program, calls,
                                                                                          name="program")]
        for handle in handles:
            print("result", await handle.wait(timeout=120), flush=True)


if __name__ == "__main__":
    os.environ["SESSION_LOG"] = sys.argv[2]
    asyncio.run(main(sys.argv[1], int(sys.argv[3])))
