"""One of several kernels sharing a SQLite file: spawns processes and prints their pids.

``python -m tests.pid_spawner DB COUNT TAG`` (processes are named TAG-0, TAG-1, ...).
"""

from __future__ import annotations

import asyncio
import json
import sys

from ringzero import Context, Kernel
from ringzero.checkpointers import SqliteCheckpointer


async def echo(ctx: Context, value: str) -> str:
    return value


async def main(db: str, count: int, tag: str) -> None:
    async with Kernel(checkpointer=SqliteCheckpointer(db)) as kernel:
        handles = [await kernel.spawn(echo, f"{tag}-{i}", name=f"{tag}-{i}") for i in range(count)]
        results = [await h.wait() for h in handles]
        assert results == [f"{tag}-{i}" for i in range(count)]
        print(json.dumps([h.pid for h in handles]), flush=True)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], int(sys.argv[2]), sys.argv[3]))
