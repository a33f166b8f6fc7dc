"""LocalScheduler: priority order, the max_running cap, fairness between equal priorities."""

from __future__ import annotations

import asyncio

import pytest

from ringzero import Context, Kernel
from ringzero.compat.scheduler import SchedulerConformance
from ringzero.core.contract.errors import InvalidArgument
from ringzero.providers.schedulers import LocalScheduler
from ringzero.testing import MemoryCheckpointer


async def test_with_one_slot_ready_processes_start_in_priority_order() -> None:
    started: list[str] = []
    everyone_queued = asyncio.Event()

    async def hold_the_slot() -> None:
        await everyone_queued.wait()

    async def worker(ctx: Context) -> None:
        started.append(ctx.name)
        if ctx.name == "first":
            await ctx.tool(hold_the_slot)  # a service call keeps the run slot

    async with Kernel(checkpointer=MemoryCheckpointer(), max_running=1) as kernel:
        first = await kernel.spawn(worker, name="first", priority=0)
        while not started:
            await asyncio.sleep(0.001)
        handles = [await kernel.spawn(worker, name=f"p{p}", priority=p) for p in (7, 2, 9, 2, 0)]
        await asyncio.sleep(0.01)
        assert kernel.scheduler.ready_count == 5  # type: ignore[attr-defined]
        everyone_queued.set()
        await asyncio.gather(first.wait(), *(h.wait() for h in handles))
    assert started == ["first", "p0", "p2", "p2", "p7", "p9"]


async def test_the_cap_bounds_how_many_run_at_once() -> None:
    scheduler = LocalScheduler(max_running=2)
    peak = 0

    async def nap() -> None:
        await asyncio.sleep(0.005)  # a service call: the process keeps its slot meanwhile

    async def worker(ctx: Context) -> None:
        nonlocal peak
        for _ in range(3):
            peak = max(peak, len(scheduler.running))
            await ctx.tool(nap)

    async with Kernel(checkpointer=MemoryCheckpointer(), scheduler=scheduler) as kernel:
        handles = [await kernel.spawn(worker) for _ in range(6)]
        await asyncio.gather(*(h.wait() for h in handles))
    assert peak == 2


async def interleaving(first: tuple[str, int, int], second: tuple[str, int, int]) -> list[str]:
    """Run two (name, priority, rounds) workers on one slot and return who ran each round.

    The first worker blocks in a host tool, holding the only slot, until the second one is
    queued; from then on only the scheduler decides who runs at each syscall boundary.
    """
    trace: list[str] = []
    release = asyncio.Event()

    async def hold() -> None:
        await release.wait()

    async def worker(ctx: Context, rounds: int) -> None:
        for i in range(rounds):
            trace.append(ctx.name)
            if i == 0 and ctx.name == first[0]:
                await ctx.tool(hold)
            await ctx.checkpoint()

    async with Kernel(checkpointer=MemoryCheckpointer(), max_running=1) as kernel:
        a = await kernel.spawn(worker, first[2], name=first[0], priority=first[1])
        while not trace:
            await asyncio.sleep(0.001)
        b = await kernel.spawn(worker, second[2], name=second[0], priority=second[1])
        while kernel.scheduler.ready_count < 1:  # type: ignore[attr-defined]
            await asyncio.sleep(0.001)
        release.set()
        await asyncio.gather(a.wait(), b.wait())
    return trace


async def test_equal_priorities_take_turns_at_syscall_boundaries() -> None:
    assert await interleaving(("a", 10, 3), ("b", 10, 3)) == ["a", "b", "a", "b", "a", "b"]


async def test_a_higher_priority_process_preempts_at_the_next_boundary() -> None:
    assert await interleaving(("low", 10, 3), ("high", 1, 2)) == ["low", "high", "high", "low", "low"]


async def test_a_cancelled_wait_for_a_slot_leaves_no_trace() -> None:
    scheduler = LocalScheduler(max_running=1)
    await scheduler.acquire(1, 5)
    waiter = asyncio.create_task(scheduler.acquire(2, 5))
    await asyncio.sleep(0)
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    scheduler.release(1)
    assert scheduler.running == frozenset()
    await scheduler.acquire(3, 5)
    assert scheduler.running == frozenset({3})


def test_max_running_must_be_positive() -> None:
    with pytest.raises(InvalidArgument, match="max_running"):
        LocalScheduler(max_running=0)


class TestLocalSchedulerConformance(SchedulerConformance):
    """The built-in scheduler passes the Scheduler kit (one run slot, as the kit asks)."""

    @pytest.fixture
    def scheduler(self) -> LocalScheduler:
        return LocalScheduler(max_running=1)
