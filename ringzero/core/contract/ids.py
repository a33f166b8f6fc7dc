"""Time-ordered record ids: what a writer uses where the newest record must sort last.

``time_ordered_id()`` is the wall clock in nanoseconds, zero-padded, then a per-process
counter, so ids from one process never collide and ids from several processes sharing a store
sort by when they were made (as well as their clocks agree).
"""

from __future__ import annotations

import itertools
import time

__all__ = ["time_ordered_id"]

_SEQUENCE = itertools.count()


def time_ordered_id() -> str:
    return f"{time.time_ns():020d}.{next(_SEQUENCE):08d}"
