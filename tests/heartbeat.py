"""A heartbeat on the event loop: how a test shows the loop kept running while something
waited (a blocking tool, a held database lock)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager


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
