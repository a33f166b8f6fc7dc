"""The one timeout helper: ``async with fail_after(seconds):`` raises ``TimeoutError`` when
the block runs longer (``None``: no limit), and ``wait_until_set`` waits for an event up to a
deadline. ``Clock`` is what the LLM gate waits on, so a test can drive it by hand.

On Python 3.11+ it is ``asyncio.timeout``; on 3.10, which has none, ``anyio.fail_after``
(anyio comes with httpx). Both raise the built-in ``TimeoutError`` (on 3.10 ``asyncio.wait_for``
raised another class, which is why nothing in ringzero uses it). Why not anyio everywhere:
measured on this machine, ``anyio.fail_after`` costs 18.4 µs a use and ``asyncio.timeout``
5.1 µs, and the LLM gate enters one on every call.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Protocol, runtime_checkable

__all__ = ["Clock", "MonotonicClock", "fail_after", "wait_until_set"]

if sys.version_info >= (3, 11):
    def fail_after(seconds: float | None) -> AbstractAsyncContextManager[object]:
        """Cancel the block and raise ``TimeoutError`` after ``seconds``."""
        return asyncio.timeout(seconds)
else:  # pragma: no cover - exercised on Python 3.10
    import anyio

    @asynccontextmanager
    async def fail_after(seconds: float | None) -> AsyncIterator[None]:
        """Cancel the block and raise ``TimeoutError`` after ``seconds``."""
        with anyio.fail_after(seconds):
            yield


async def wait_until_set(event: asyncio.Event, seconds: float | None) -> bool:
    """Wait for ``event`` up to ``seconds`` (None: forever); whether it was set."""
    if event.is_set():
        return True
    try:
        async with fail_after(seconds):
            await event.wait()
    except TimeoutError:
        return False
    return True


@runtime_checkable
class Clock(Protocol):
    """What the LLM gate paces by: the time, and waits measured on it. The default is the
    monotonic clock; ``ringzero.testing.ManualClock`` is one a test moves by hand, so pacing
    and back-off are checked by what happened, never by how long a test took."""

    def now(self) -> float:
        """Seconds, from any fixed origin."""
        ...

    async def sleep(self, seconds: float) -> None: ...

    async def wait(self, event: asyncio.Event, seconds: float | None) -> bool:
        """Wait for ``event`` up to ``seconds`` on this clock (None: forever); whether it was set."""
        ...


class MonotonicClock:
    """The real clock: ``time.monotonic`` and the event loop's own timers."""

    def now(self) -> float:
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)

    async def wait(self, event: asyncio.Event, seconds: float | None) -> bool:
        return await wait_until_set(event, seconds)
