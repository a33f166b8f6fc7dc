"""What a benchmark is measuring now, for ``make bench`` (``benchmarks/run.py``) to show.

A line ``progress: <text>`` on stderr; run on its own, a script shows it as it is.
"""

from __future__ import annotations

import sys

PREFIX = "progress: "


def step(text: str) -> None:
    """Say what is being measured now (one line; the runner shows the latest beside its timer)."""
    print(f"{PREFIX}{text}", file=sys.stderr, flush=True)
