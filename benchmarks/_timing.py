"""How a benchmark times an awaitable call: the seconds of each of ``n`` calls, after ``warm``
calls not counted (one way of timing, for the scripts that time a call in a loop)."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable


async def samples(call: Callable[[], Awaitable[object]], n: int, warm: int) -> list[float]:
    """The seconds each of ``n`` calls of ``call`` took, after ``warm`` calls not counted."""
    for _ in range(warm):
        await call()
    times = []
    for _ in range(n):
        started = time.perf_counter()
        await call()
        times.append(time.perf_counter() - started)
    return times
