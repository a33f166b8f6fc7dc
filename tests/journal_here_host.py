"""A host for ``tests/test_exec_journal_here.py``: one kernel process on a SQLite store whose
second ``ctx.exec`` makes ``CALLS`` quick tool calls, each answered and journaled in Monty's
own thread (the first exec shows the tool is quick). Started, killed with SIGKILL at a random
moment, and started again until the process finishes; each start resumes what the store holds.

    python -m tests.journal_here_host <db> <log> <calls>
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from typing import Any

from ringzero import Context, Kernel
from ringzero.checkpointers import SqliteCheckpointer
from ringzero.providers.executors import MontyExecutor


def note(n: int, idempotency_key: str = "") -> int:
    """Call ``n``'s effect: a line as it starts and one as it ends, with the key the kernel gave it."""
    fd = os.open(os.environ["NOTE_LOG"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, f"start {n} {idempotency_key}\n".encode())
        time.sleep(0.001)  # a kill lands inside a call as often as between two
        os.write(fd, f"end {n} {idempotency_key}\n".encode())
    finally:
        os.close(fd)
    return n


def code(calls: int) -> str:
    return f"total = 0\nfor n in range(1, {calls + 1}):\n    total += note(n)\ntotal"


async def program(ctx: Context, calls: int) -> Any:
    await ctx.exec("note(0)", tools={"note": note})  # answered by snapshot: from now on the tool is quick
    return (await ctx.exec(code(calls), tools={"note": note})).value


async def main(db: str, calls: int) -> None:
    async with Kernel(checkpointer=SqliteCheckpointer(db), executor=MontyExecutor(), monitor_interval=None) as kernel:
        handles = await kernel.recover({"program": program})
        if not handles:  # a new store, or one whose process finished before the kill
            known = await kernel.ps(all=True)
            handles = [await kernel.handle(known[0].pid) if known else await kernel.spawn(program, calls,
                                                                                          name="program")]
        print("running", flush=True)
        for handle in handles:
            print("result", await handle.wait(timeout=120), flush=True)


if __name__ == "__main__":
    os.environ["NOTE_LOG"] = sys.argv[2]
    asyncio.run(main(sys.argv[1], int(sys.argv[3])))
