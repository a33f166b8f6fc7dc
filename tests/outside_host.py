"""A host for the outside package's kill test: a kernel on ``outside://`` with the outside
executor, running ``pay_five`` until it is killed.

Run as ``python -m tests.outside_host outside://PATH [unkeyed]``; prints the pid it spawned."""

from __future__ import annotations

import asyncio
import sys

from tests.outside_programs import make_kernel, pay_five, pay_five_unkeyed


async def main(db: str, unkeyed: bool) -> None:
    async with make_kernel(db) as kernel:
        process = await kernel.spawn(pay_five_unkeyed if unkeyed else pay_five, name="payments")
        print(process.pid, flush=True)
        await process.wait()
        await asyncio.sleep(3600)  # stay alive: the test kills us


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2:] == ["unkeyed"]))
