"""Programs first: the LLM gate's least-attained-service order against first come, first served.

Agent programs arrive over a window behind a provider rate limit the load exceeds: most make
1-3 model calls one after another, a few make 30-60 in waves of 10 parallel calls. Each is a
kernel process; the provider answers every call in 40 ms. Two workloads: a long program's
waves one after another (each waits for the one before), and its waves in the line at once (a
new wave every ``STAGGER`` seconds, whether the last has been served or not: an agent that fans
out sub-tasks as it plans them). The same trace (one seed) runs through a gate ordered
``"fifo"`` (the peer: arrival order, what a gate with equal priorities did before) and through
the default ``"las"``, in one run. Completion time is a program's end minus its arrival.

    .venv/bin/python benchmarks/gate_order.py [--programs 300 --long 15 --window 30 --rpm 1459 --seed 7]
        [--workload sequential overlapping]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import time
from dataclasses import dataclass
from typing import Any

from _progress import step
from rich.console import Console
from rich.table import Table

from ringzero import Context, Kernel, LLMGate, RateLimit
from ringzero.checkpointers import MemoryCheckpointer
from ringzero.core.contract.types import LLMRequest
from ringzero.testing import ScriptedProvider

LATENCY = 0.040
WAVE = 10
STAGGER = 0.25
"""Seconds between a long program's waves where they are in the line at once."""


@dataclass(frozen=True)
class Program:
    arrival: float
    calls: int

    @property
    def long(self) -> bool:
        return self.calls > 3


def trace(programs: int, long: int, window: float, seed: int) -> list[Program]:
    """The workload: arrivals spread over ``window`` seconds, ``long`` of them heavy."""
    draw = random.Random(seed)
    heavy = set(draw.sample(range(programs), long))
    return sorted((Program(draw.uniform(0, window), draw.randint(30, 60) if i in heavy else draw.randint(1, 3))
                   for i in range(programs)), key=lambda p: p.arrival)


async def agent(ctx: Context, calls: int) -> int:
    """A short program asks one call after another; a long one fans out in waves of 10."""
    if calls <= 3:
        for i in range(calls):
            await ctx.llm(f"step {i}")
        return calls
    done = 0
    while done < calls:
        wave = min(WAVE, calls - done)
        await asyncio.gather(*(ctx.llm(f"wave call {done + i}") for i in range(wave)))
        done += wave
    return done


async def overlapping_agent(ctx: Context, calls: int) -> int:
    """A short program as in ``agent``; a long one starts a wave of 10 every ``STAGGER`` seconds
    without waiting for the waves before it, so several are in the line at once."""
    if calls <= 3:
        return await agent(ctx, calls)

    async def wave(first: int, size: int, after: float) -> None:
        await ctx.sleep(after)
        await asyncio.gather(*(ctx.llm(f"wave call {first + i}") for i in range(size)))

    starts = range(0, calls, WAVE)
    await asyncio.gather(*(wave(first, min(WAVE, calls - first), n * STAGGER) for n, first in enumerate(starts)))
    return calls


async def answer(request: LLMRequest) -> str:
    await asyncio.sleep(LATENCY)
    return "ok"


async def run(order: str, programs: list[Program], rpm: float,
              code: Any = agent) -> tuple[list[float], list[float], float]:
    """Completion times of short and long programs, and the makespan, under ``order``."""
    gate = LLMGate(ScriptedProvider(answer), RateLimit(requests_per_minute=rpm), order=order)
    short: list[float] = []
    long: list[float] = []
    async with Kernel(checkpointer=MemoryCheckpointer(), llm=gate, monitor_interval=None) as kernel:
        start = time.monotonic()

        async def one(program: Program) -> None:
            await asyncio.sleep(max(0.0, start + program.arrival - time.monotonic()))
            arrived = time.monotonic()
            handle = await kernel.spawn(code, program.calls, name="long" if program.long else "short")
            await handle.wait()
            (long if program.long else short).append(time.monotonic() - arrived)

        await asyncio.gather(*(one(p) for p in programs))
        makespan = time.monotonic() - start
    return short, long, makespan


def p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]


WORKLOADS = {"sequential": agent, "overlapping": overlapping_agent}
"""A long program's waves one after another, or in the line at once."""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--programs", type=int, default=300)
    parser.add_argument("--long", type=int, default=15)
    parser.add_argument("--window", type=float, default=30.0)
    parser.add_argument("--rpm", type=float, default=1459.0)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--workload", nargs="+", choices=list(WORKLOADS), default=list(WORKLOADS))
    args = parser.parse_args()
    programs = trace(args.programs, args.long, args.window, args.seed)
    calls = sum(p.calls for p in programs)
    table = Table(title=f"{len(programs)} programs ({args.long} long) arriving over {args.window:.0f} s, {calls} "
                        f"model calls of {LATENCY * 1000:.0f} ms behind {args.rpm:.0f} requests/min",
                  title_justify="left")
    for column in ("waves", "order", "mean s", "median s", "short p99 s", "long mean s", "long p99 s", "makespan s"):
        table.add_column(column, justify="left" if column in ("waves", "order") else "right")
    for workload in args.workload:
        results = {}
        for order in ("fifo", "las"):
            step(f"{workload} waves, {order}: {len(programs)} programs, {calls} model calls behind "
                 f"{args.rpm:.0f} requests a minute")
            results[order] = asyncio.run(run(order, programs, args.rpm, WORKLOADS[workload]))
        for order, (short, long, makespan) in results.items():
            every = short + long
            table.add_row(workload, "fifo (peer)" if order == "fifo" else "las (default)",
                          f"{statistics.mean(every):.1f}", f"{statistics.median(every):.1f}", f"{p99(short):.1f}",
                          f"{statistics.mean(long):.1f}", f"{p99(long):.1f}", f"{makespan:.1f}")
        (fs, fl, fm), (ls, ll, lm) = results["fifo"], results["las"]
        table.add_row(workload, "las / fifo", f"{statistics.mean(ls + ll) / statistics.mean(fs + fl):.2f}x",
                      f"{statistics.median(ls + ll) / statistics.median(fs + fl):.2f}x", f"{p99(ls) / p99(fs):.2f}x",
                      f"{statistics.mean(ll) / statistics.mean(fl):.2f}x", f"{p99(ll) / p99(fl):.2f}x",
                      f"{lm / fm:.2f}x", end_section=True)
    Console(width=140).print(table)


if __name__ == "__main__":
    main()
