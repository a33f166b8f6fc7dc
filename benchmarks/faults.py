"""Many processes against a model server that fails on a seeded schedule (tests/faults.py).

1,000 processes x 5 model calls through one gate (16 at a time, 4 retries, a 0.3 s attempt
timeout), against an OpenAI-format and an Anthropic-format server on 127.0.0.1 that answer
each attempt with a fault drawn from ``FAULT_WEIGHTS`` (the same seed for both, so both meet
the same schedule: the columns differ only if the two wire formats are handled differently); a
SQLite journal. Prints what was injected, how the processes ended, the wall time and the peak
memory, and whether the server's log and the journals agreed on every call.

    .venv/bin/python benchmarks/faults.py [--processes 1000] [--calls 5] [--seed 17]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
from pathlib import Path

from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests.faults, the harness the tests use

from ringzero.checkpointers import SqliteCheckpointer
from tests.faults import ERROR_OF_FAULT, FAULT_WEIGHTS, FaultRun, run_provider_faults


async def measure(processes: int, calls: int, seed: int) -> list[FaultRun]:
    runs = []
    for vendor in ("openai", "anthropic"):
        with tempfile.TemporaryDirectory() as tmp:
            runs.append(await run_provider_faults(vendor, processes=processes, calls=calls, seed=seed, deadline=600,
                                                  store=SqliteCheckpointer(Path(tmp) / "state.db")))
    return runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=int, default=1000)
    parser.add_argument("--calls", type=int, default=5)
    parser.add_argument("--seed", type=int, default=17)
    args = parser.parse_args()
    runs = asyncio.run(measure(args.processes, args.calls, args.seed))
    console = Console(width=120)

    injected = Table(title=f"{args.processes} processes x {args.calls} calls: attempts answered, by what the "
                           "server answered")
    injected.add_column("answer")
    injected.add_column("error it must become")
    for run in runs:
        injected.add_column(run.vendor, justify="right")
    for fault in FAULT_WEIGHTS:
        injected.add_row(fault, ERROR_OF_FAULT.get(fault, "-"), *(f"{run.faults[fault]:,}" for run in runs))
    injected.add_row("all attempts", "", *(f"{sum(run.faults.values()):,}" for run in runs))
    console.print(injected)

    ends = Table(title="how the processes ended, and the run")
    ends.add_column("")
    for run in runs:
        ends.add_column(run.vendor, justify="right")
    for outcome in ("exited", "BadRequest", "ProviderUnavailable", "RateLimited"):
        ends.add_row(outcome if outcome == "exited" else f"failed: {outcome}",
                     *(f"{run.outcomes[outcome]:,}" for run in runs))
    ends.add_row("wall time", *(f"{run.wall_seconds:.1f} s" for run in runs))
    ends.add_row("peak memory (this process)", *(f"{run.max_rss_mib:.0f} MiB" for run in runs))
    ends.add_row("disagreements (server log vs journals, retry rules)", *(str(len(run.problems)) for run in runs))
    console.print(ends)
    for run in runs:
        for problem in run.problems[:10]:
            console.print(f"[red]{run.vendor}: {problem}")


if __name__ == "__main__":
    main()
