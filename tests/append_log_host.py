"""A host process for the append log's kill -9 tests.

``python -m tests.append_log_host appends DB N``: a SqliteCheckpointer on DB appends N records
(thread ``t``), prints the log's path and its fold count, and kills itself with SIGKILL at once.
``python -m tests.append_log_host kernel DB N``: a kernel on DB runs ``asks_then_dies`` with N
LLM calls, which kills this host the moment its last call returns; it prints the pid first.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys

from ringzero import Kernel
from ringzero.checkpointers import SqliteCheckpointer
from ringzero.core.types import Checkpoint
from ringzero.testing import ScriptedProvider
from tests.programs import asks_then_dies


async def appends(db: str, n: int) -> None:
    store = SqliteCheckpointer(db)
    await store.get("nothing")  # opened
    for i in range(n):
        await store.append(Checkpoint("t", "", f"{i:04d}", f"record {i}".encode(), metadata={"i": i}))
    assert store._log is not None
    print(store._log.path, store.folds, flush=True)
    os.kill(os.getpid(), signal.SIGKILL)


async def kernel(db: str, n: int) -> None:
    os.environ["RINGZERO_TEST_DIE_AFTER_CALLS"] = "1"
    async with Kernel(checkpointer=SqliteCheckpointer(db), llm=ScriptedProvider(lambda r: "answer")) as k:
        process = await k.spawn(asks_then_dies, n, name="asker")
        print(process.pid, flush=True)
        await process.wait()


if __name__ == "__main__":
    asyncio.run({"appends": appends, "kernel": kernel}[sys.argv[1]](sys.argv[2], int(sys.argv[3])))
