"""Budgets: crossing one stops the process with a typed reason; a warning comes at 90%."""

from __future__ import annotations

import contextlib

import pytest

from ringzero import Context, Event, Kernel, Limits, ProcessStatus, StopReason
from ringzero.core.contract.errors import BudgetExceeded
from ringzero.testing import InProcessExecutor, MemoryCheckpointer, ScriptedProvider


async def chatter(ctx: Context) -> None:
    while True:
        await ctx.llm("one two three four")  # 4 input tokens + 2 output tokens ("ok ok")


async def stepper(ctx: Context) -> None:
    while True:
        await ctx.sleep(0)


async def busy_exec(ctx: Context) -> None:
    while True:
        await ctx.exec("sum(range(200000))")


async def run_until_stopped(kernel: Kernel, program: object, limits: Limits) -> tuple[StopReason | None, int]:
    p = await kernel.spawn(program, limits=limits)  # type: ignore[arg-type]
    with pytest.raises(BudgetExceeded) as caught:
        await p.wait()
    assert p.status is ProcessStatus.KILLED and caught.value.reason is p.stop_reason
    return p.stop_reason, p.info().steps


@pytest.fixture
async def budget_kernel() -> Kernel:
    kernel = Kernel(checkpointer=MemoryCheckpointer(), llm=ScriptedProvider(lambda r: "ok ok"),
                    executor=InProcessExecutor())
    await kernel.start()
    return kernel


@pytest.mark.parametrize(
    ("program", "limits", "reason"),
    [
        (chatter, Limits(tokens=60), StopReason.TOKENS),
        (chatter, Limits(llm_calls=3), StopReason.LLM_CALLS),
        (stepper, Limits(steps=25), StopReason.STEPS),
        (stepper, Limits(wall_seconds=0.2), StopReason.WALL_SECONDS),
        (busy_exec, Limits(exec_seconds=0.02), StopReason.EXEC_SECONDS),
    ],
    ids=["tokens", "llm_calls", "steps", "wall_seconds", "exec_seconds"],
)
async def test_crossing_a_budget_stops_the_process_with_its_reason(
    budget_kernel: Kernel, program: object, limits: Limits, reason: StopReason
) -> None:
    got, _ = await run_until_stopped(budget_kernel, program, limits)
    assert got is reason
    await budget_kernel.aclose()


async def test_steps_budget_allows_exactly_that_many_syscalls(budget_kernel: Kernel) -> None:
    _, steps = await run_until_stopped(budget_kernel, stepper, Limits(steps=25))
    assert steps == 25
    await budget_kernel.aclose()


async def test_llm_calls_budget_makes_exactly_that_many_calls() -> None:
    provider = ScriptedProvider(lambda r: "ok")
    async with Kernel(checkpointer=MemoryCheckpointer(), llm=provider) as kernel:
        await run_until_stopped(kernel, chatter, Limits(llm_calls=3))
    assert provider.calls == 3


async def test_cost_budget_uses_the_gates_pricing() -> None:
    from ringzero import LLMGate, Pricing

    gate = LLMGate(ScriptedProvider(lambda r: "ok ok"), pricing=Pricing(1_000_000, 1_000_000))  # $1 a token
    async with Kernel(checkpointer=MemoryCheckpointer(), llm=gate) as kernel:
        reason, _ = await run_until_stopped(kernel, chatter, Limits(cost=20.0))
    assert reason is StopReason.COST


async def test_a_warning_event_comes_at_90_percent_before_the_stop(budget_kernel: Kernel) -> None:
    events: list[Event] = []
    budget_kernel.subscribe(events.append)
    await run_until_stopped(budget_kernel, stepper, Limits(steps=20))
    warnings = [e for e in events if e.kind == "budget_warning"]
    assert len(warnings) == 1
    assert warnings[0].data["resource"] == "steps" and warnings[0].data["used"] == 18
    killed_at = next(i for i, e in enumerate(events) if e.kind == "transition" and e.data["to"] == "killed")
    assert events.index(warnings[0]) < killed_at
    await budget_kernel.aclose()


async def test_a_program_that_swallows_the_stop_is_still_stopped(budget_kernel: Kernel) -> None:
    async def stubborn(ctx: Context) -> str:
        for _ in range(100):
            with contextlib.suppress(BaseException):  # swallowing the stop is the point
                await ctx.sleep(0)
        return "escaped"

    p = await budget_kernel.spawn(stubborn, limits=Limits(steps=5))
    with pytest.raises(BudgetExceeded):
        await p.wait()
    assert p.stop_reason is StopReason.STEPS
    await budget_kernel.aclose()



async def test_a_child_spawned_without_limits_gets_half_of_what_its_parent_has_left() -> None:
    async def parent(ctx: Context) -> int:
        await ctx.llm("one two three four")  # one of its ten calls spent: nine left
        child = await ctx.spawn(chatter)  # no limits: half of the nine, in whole calls
        with pytest.raises(BudgetExceeded):
            await ctx.wait(child)
        return child.info().llm_calls

    provider = ScriptedProvider(lambda r: "ok ok")
    async with Kernel(checkpointer=MemoryCheckpointer(), llm=provider) as kernel:
        p = await kernel.spawn(parent, limits=Limits(llm_calls=10))
        assert await p.wait() == 4
    assert provider.calls == 1 + 4
