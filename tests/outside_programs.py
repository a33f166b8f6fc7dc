"""Programs and a kernel factory for the outside package's tests: five keyed payments made
from code that the outside executor runs, the third of which the test kills the host inside."""

from __future__ import annotations

import os
import time
from pathlib import Path

from ringzero import Context, Kernel
from ringzero.core.contract.types import JSON


def charge(n: int, idempotency_key: str = "") -> str:
    """A payment: logged when it starts and ends, with the key the kernel gave it. The third
    (``n == 2``) waits the first time, long enough to be killed inside."""
    log = Path(os.environ["OUTSIDE_LOG"])
    with log.open("a") as out:
        out.write(f"start {n} {idempotency_key}\n")
    first_time = not (log.parent / "waited").exists()
    if n == 2 and first_time:
        (log.parent / "waited").touch()
        time.sleep(60)
    with log.open("a") as out:
        out.write(f"end {n} {idempotency_key}\n")
    return f"paid {n}"


def charge_unkeyed(n: int) -> str:
    """``charge`` without a key: a call of it in doubt may not run again."""
    return charge(n)


async def pay_five(ctx: Context) -> JSON:
    result = await ctx.exec("[charge(i) for i in range(5)]", tools={"charge": charge})
    return result.value


async def pay_five_unkeyed(ctx: Context) -> JSON:
    result = await ctx.exec("[charge(i) for i in range(5)]", tools={"charge": charge_unkeyed})
    return result.value


def make_kernel(db: str) -> Kernel:
    """``ringzero resume --kernel tests.outside_programs:make_kernel``: the outside store and executor."""
    from ringzero_outside.executor import PipeExecutor

    return Kernel(checkpointer=db, executor=PipeExecutor(), monitor_interval=None)
