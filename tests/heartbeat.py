"""A heartbeat on the event loop: how a test shows the loop kept running while something
waited (a blocking tool, a held database lock)."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from ringzero.core.support.timeouts import fail_after


class Beats:
    """How many times the heartbeat ran."""

    def __init__(self) -> None:
        self.count = 0


@asynccontextmanager
async def heartbeat(interval: float) -> AsyncIterator[Beats]:
    """Count a beat every ``interval`` seconds on this loop while the block runs."""
    beats = Beats()

    async def beat() -> None:
        while True:
            await asyncio.sleep(interval)
            beats.count += 1

    task = asyncio.ensure_future(beat())
    try:
        yield beats
    finally:
        task.cancel()


class Pace:
    """What a bystander saw while something else ran on the same host."""

    def __init__(self) -> None:
        self.longest_stall = 0.0
        """The longest the event loop was blocked, in seconds (how late a 5 ms sleep woke)."""
        self.runs = 0
        self.wrong: list[object] = []


@asynccontextmanager
async def bystander(executor: object, interval: float = 0.005) -> AsyncIterator[Pace]:
    """Another agent on the same host while the block runs: it runs quick code on ``executor``
    over and over, and a loop-lag probe measures the longest stall of the event loop. On exit
    it waits (up to 10 s) for one more of its runs to complete, so that a run in the block that
    ended quickly still shows the bystander's pace."""
    pace = Pace()
    loop = asyncio.get_running_loop()
    # What a long test session has piled up is collected now, not in the window measured, and
    # what lives on is set aside from later collections (gc.freeze): a full collection in a
    # process that ran a thousand tests pauses it for hundreds of milliseconds, the test
    # process's own pause, not the host's. Each later call collects only what came after.
    gc.collect()
    gc.freeze()

    async def probe() -> None:
        while True:
            before = loop.time()
            await asyncio.sleep(interval)
            pace.longest_stall = max(pace.longest_stall, loop.time() - before - interval)

    async def agent() -> None:
        while True:
            result = await executor.run("sum(range(10))")  # type: ignore[attr-defined]
            if result.value != 45:
                pace.wrong.append(result)
            pace.runs += 1

    tasks = [asyncio.ensure_future(probe()), asyncio.ensure_future(agent())]
    try:
        yield pace
        seen = pace.runs
        async with fail_after(10):
            while pace.runs <= seen:
                await asyncio.sleep(0.01)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

