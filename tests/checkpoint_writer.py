"""Writes checkpoints to a SQLite file in a loop, printing each id once its put returned.

``python -m tests.checkpoint_writer DB THREAD COUNT`` (COUNT 0: until killed).
"""

from __future__ import annotations

import asyncio
import sys

from ringzero.checkpointers import SqliteCheckpointer
from ringzero.core.contract.types import Checkpoint, PendingWrite


async def main(db: str, thread: str, count: int) -> None:
    store = SqliteCheckpointer(db)
    i = 0
    while count == 0 or i < count:
        cid = f"{i:08d}"
        await store.put(Checkpoint(thread, "", cid, payload=b"x" * 512 + cid.encode(), metadata={"i": i}))
        await store.put_writes(thread, "", cid, [PendingWrite("task", "out", cid.encode())])
        print(cid, flush=True)
        i += 1
    await store.aclose()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3])))
