"""Host tools the tests declare CPU-bound: module-level, so a worker process can import them
by name (what ``ringzero.cpu_bound`` requires). Kept apart from the test modules so that a
worker imports only this."""

from __future__ import annotations

import os

import ringzero


@ringzero.cpu_bound
def total(n: int) -> int:
    """Holds the GIL for the whole C loop: seconds for n = 150,000,000."""
    return sum(range(n))


@ringzero.cpu_bound
def where_am_i() -> int:
    return os.getpid()
