"""A host process for the kill -9 test: a kernel on a SQLite file running durable_worker.

Run as ``python -m tests.durable_host DB ROUNDS``; it prints the pid it spawned, then works
until it is killed.
"""

from __future__ import annotations

import asyncio
import sys

from ringzero import Kernel
from ringzero.checkpointers import SqliteCheckpointer
from ringzero.testing import ScriptedProvider
from tests.programs import durable_worker, logging_llm, record_tool


async def main(db: str, rounds: int) -> None:
    provider = ScriptedProvider(logging_llm, latency=0.02)
    async with Kernel(checkpointer=SqliteCheckpointer(db), llm=provider, tools={"record": record_tool}) as kernel:
        process = await kernel.spawn(durable_worker, rounds, name="worker")
        print(process.pid, flush=True)
        await process.wait()
        await asyncio.sleep(3600)  # stay alive: the test kills us


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], int(sys.argv[2])))
