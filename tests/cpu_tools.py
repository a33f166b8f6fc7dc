"""Host tools the tests declare CPU-bound: module-level, so a worker process can import them
by name (what ``ringzero.cpu_bound`` requires). Kept apart from the test modules so that a
worker imports only this."""

from __future__ import annotations

import os

import ringzero


@ringzero.cpu_bound
def total(n: int) -> int:
    """Holds the GIL for the whole C loop: about 8 s for n = 600,000,000 (on this project's machines)."""
    return sum(range(n))


@ringzero.cpu_bound
def where_am_i() -> int:
    return os.getpid()


@ringzero.cpu_bound
def numbers(n: int) -> list[int]:
    """A result that costs the host what it is: fifteen million items are hundreds of MB pickled."""
    return list(range(n))


@ringzero.cpu_bound
def spin(seconds: float) -> float:
    """Busy for ``seconds`` (a slow call, such as a regular expression on a hostile input)."""
    import time

    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass
    return seconds


@ringzero.cpu_bound
def crash() -> None:
    """Dies as a segfault or the OOM killer ends a worker."""
    import signal

    os.kill(os.getpid(), signal.SIGKILL)


def holds_the_gil(n: int) -> int:
    """Not declared cpu_bound: one C call that holds the GIL (about 0.4 s for n = 4 * 10**7)."""
    return sum(range(n))
