"""The LLM gate: concurrency, rate buckets, priority order, retries, accounting."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from ringzero import Context, Kernel, LLMGate, Pricing, RateLimit, RetryPolicy
from ringzero.core.contract.errors import BadRequest, InvalidArgument, ProviderUnavailable, RateLimited
from ringzero.core.contract.types import LLMRequest, Message, Usage
from ringzero.testing import ManualClock, MemoryCheckpointer, ScriptedProvider
from tests.conftest import RateLimitedServer


def request(text: str = "hi") -> LLMRequest:
    return LLMRequest(messages=(Message("user", text),))


async def test_concurrency_cap_is_never_exceeded() -> None:
    in_flight = peak = 0

    async def answer(req: LLMRequest) -> str:
        nonlocal in_flight, peak
        in_flight += 1
        peak = max(peak, in_flight)
        await asyncio.sleep(0.01)
        in_flight -= 1
        return "ok"

    gate = LLMGate(ScriptedProvider(answer), RateLimit(max_concurrency=3))
    await asyncio.gather(*(gate.complete(request()) for _ in range(20)))
    assert peak == 3


async def settle() -> None:
    """Let every task that can run, run (the manual clock does not move meanwhile)."""
    for _ in range(50):
        await asyncio.sleep(0)


async def test_requests_per_minute_paces_calls() -> None:
    clock = ManualClock()
    gate = LLMGate(ScriptedProvider(lambda r: "ok"), RateLimit(requests_per_minute=480), clock=clock)  # 8/s, burst 8
    calls = [asyncio.ensure_future(gate.complete(request())) for _ in range(16)]
    await settle()
    assert sum(c.done() for c in calls) == 8  # the burst goes at once, the rest wait on the clock
    for passed in range(1, 9):
        clock.advance(0.125)  # one request's worth of the rate (a binary fraction: no rounding)
        await settle()
        assert sum(c.done() for c in calls) == 8 + passed
    assert all(c.result().content == "ok" for c in calls)


async def test_tokens_per_minute_paces_calls_by_estimated_size() -> None:
    clock = ManualClock()
    gate = LLMGate(ScriptedProvider(lambda r: "ok"), RateLimit(tokens_per_minute=6000, burst_tokens=100), clock=clock)
    calls = [asyncio.ensure_future(gate.complete(LLMRequest(messages=(Message("user", "word " * 100),))))
             for _ in range(3)]  # about 100 tokens each; 100 tokens refill in 1 s at 100 tokens/s
    await settle()
    assert sum(c.done() for c in calls) == 1
    clock.advance(0.5)
    await settle()
    assert sum(c.done() for c in calls) == 1  # half the tokens back: not yet
    clock.advance(0.6)
    await settle()
    assert sum(c.done() for c in calls) == 2
    clock.advance(1.1)
    await settle()
    assert sum(c.done() for c in calls) == 3


async def test_waiting_calls_are_admitted_in_priority_order() -> None:
    order: list[str] = []

    def answer(req: LLMRequest) -> str:
        order.append(req.messages[0].content)
        return "ok"

    gate = LLMGate(ScriptedProvider(answer, latency=0.05), RateLimit(max_concurrency=1))
    first = asyncio.create_task(gate.complete(request("first"), priority=5))
    await asyncio.sleep(0.01)  # "first" now holds the only slot
    waiting = [asyncio.create_task(gate.complete(request(f"p{p}"), priority=p)) for p in (9, 1, 5, 0)]
    await asyncio.gather(first, *waiting)
    assert order == ["first", "p0", "p1", "p5", "p9"]


async def test_a_429_is_retried_after_its_retry_after() -> None:
    clock = ManualClock()
    stamps: list[float] = []
    replies: list[object] = [RateLimited("slow down", retry_after=30.0), "ok"]

    def answer(req: LLMRequest) -> object:
        stamps.append(clock.now())
        return replies.pop(0)

    gate = LLMGate(ScriptedProvider(answer), retry=RetryPolicy(base_delay=0.25), clock=clock)  # type: ignore[arg-type]
    call = asyncio.ensure_future(gate.complete(request()))
    await settle()
    clock.advance(29.9)
    await settle()
    assert not call.done() and len(stamps) == 1  # the server said 30 s: no retry before that
    clock.advance(0.4)  # past Retry-After plus the most jitter the policy adds
    await settle()
    assert (await call).content == "ok" and stamps[1] >= 30.0
    assert (gate.stats.rate_limited, gate.stats.retries, gate.stats.failures) == (1, 1, 0)


async def test_5xx_and_timeouts_are_retried_with_backoff_then_given_up() -> None:
    script = [ProviderUnavailable("503"), ProviderUnavailable("502"), "ok"]
    gate = LLMGate(ScriptedProvider(script), retry=RetryPolicy(base_delay=0.01))  # type: ignore[arg-type]
    assert (await gate.complete(request())).content == "ok"

    slow = LLMGate(ScriptedProvider(["late"] * 5, latency=1.0), retry=RetryPolicy(max_retries=1, timeout=0.05,
                                                                                 base_delay=0.01))
    with pytest.raises(ProviderUnavailable, match=r"did not answer within 0\.05 s"):
        await slow.complete(request())
    assert (slow.stats.attempts, slow.stats.failures) == (2, 1)


async def test_a_bad_request_is_not_retried() -> None:
    provider = ScriptedProvider([BadRequest("malformed"), "never"])  # type: ignore[list-item]
    gate = LLMGate(provider)
    with pytest.raises(BadRequest):
        await gate.complete(request())
    assert provider.calls == 1


async def test_usage_and_cost_are_accounted_per_process_and_in_total() -> None:
    gate = LLMGate(ScriptedProvider(lambda r: "two words"), pricing=Pricing(1_000_000, 2_000_000))
    a = await gate.complete(request("one two three"), pid=1)
    await gate.complete(request("four"), pid=2)
    assert a.usage == Usage(3, 2, cost=3 * 1.0 + 2 * 2.0)
    assert gate.usage_for(1).total_tokens == 5 and gate.usage_for(2).total_tokens == 3
    assert gate.total_usage.total_tokens == 8 and gate.total_usage.cost == pytest.approx(7.0 + 5.0)


def test_rate_limits_must_be_positive() -> None:
    with pytest.raises(InvalidArgument, match="requests_per_minute must be a positive number"):
        RateLimit(requests_per_minute=0)


async def two_calls(ctx: Context, i: int) -> list[str]:
    return [(await ctx.llm(f"agent {i} call {n}")).content for n in range(2)]


@pytest.mark.parametrize("gate_knows_the_limit", [True, False], ids=["paced", "retry-only"])
async def test_fifty_processes_behind_a_rate_limited_provider_have_zero_failures(gate_knows_the_limit: bool) -> None:
    server = RateLimitedServer(per_second=50)
    limit = RateLimit(requests_per_minute=50 * 60, burst_requests=1) if gate_knows_the_limit else None
    gate = LLMGate(server.provider, limit, RetryPolicy(max_retries=30, base_delay=0.02, max_delay=0.5))
    async with Kernel(checkpointer=MemoryCheckpointer(), llm=gate) as kernel:
        handles = [await kernel.spawn(two_calls, i) for i in range(50)]
        results = await asyncio.gather(*(h.wait() for h in handles))
    assert all(len(r) == 2 for r in results)
    assert server.accepted == 100 and gate.stats.failures == 0
    if gate_knows_the_limit:
        assert server.refused <= 5  # the gate paces; the odd 429 comes from timer jitter only


# ------------------------------------------------------------ the line's order
async def one_at_a_time(order: str, starvation_after: float = 60.0) -> tuple[LLMGate, list[str], ManualClock]:
    """A gate that lets one call through per second (the clock moves when the test says), and
    the order in which calls reached the provider."""
    served: list[str] = []
    clock = ManualClock()

    def answer(req: LLMRequest) -> str:
        served.append(req.messages[0].content)
        return "ok"

    gate = LLMGate(ScriptedProvider(answer), RateLimit(requests_per_minute=60, burst_requests=1), clock=clock,
                   order=order, starvation_after=starvation_after)
    return gate, served, clock


async def drain(clock: ManualClock, calls: list[asyncio.Future[object]], step: float = 1.0) -> None:
    while not all(call.done() for call in calls):
        clock.advance(step)
        await settle()


async def test_least_attained_service_serves_the_program_that_has_had_least_first() -> None:
    for order, expected in (("las", ["a0", "b0", "a1", "a2", "a3"]), ("fifo", ["a0", "a1", "a2", "a3", "b0"])):
        gate, served, clock = await one_at_a_time(order)
        calls = [asyncio.ensure_future(gate.complete(request(f"a{i}"), pid=7, program=1)) for i in range(4)]
        await settle()  # a0 goes at once; a1..a3 wait, program 1 having had one call
        calls.append(asyncio.ensure_future(gate.complete(request("b0"), pid=9, program=2)))
        await settle()
        await drain(clock, calls)
        assert served == expected, order


async def test_a_child_s_calls_count_toward_its_top_level_program() -> None:
    gate, served, clock = await one_at_a_time("las")
    calls = [asyncio.ensure_future(gate.complete(request("parent"), pid=1, program=1))]
    await settle()
    calls += [asyncio.ensure_future(gate.complete(request(f"child{i}"), pid=10 + i, program=1)) for i in range(2)]
    calls.append(asyncio.ensure_future(gate.complete(request("other"), pid=20, program=20)))
    await settle()
    await drain(clock, calls)
    assert served == ["parent", "other", "child0", "child1"]


async def test_explicit_priorities_come_before_attained_service() -> None:
    gate, served, clock = await one_at_a_time("las")
    calls = [asyncio.ensure_future(gate.complete(request(f"busy{i}"), program=1, priority=0)) for i in range(3)]
    await settle()
    calls.append(asyncio.ensure_future(gate.complete(request("fresh"), program=2, priority=10)))
    await settle()
    await drain(clock, calls)
    assert served == ["busy0", "busy1", "busy2", "fresh"]


async def test_a_call_that_waited_past_the_bound_goes_next() -> None:
    gate, served, clock = await one_at_a_time("las", starvation_after=2.5)
    calls = [asyncio.ensure_future(gate.complete(request("long0"), program=1))]
    await settle()
    calls.append(asyncio.ensure_future(gate.complete(request("long1"), program=1)))  # behind: program 1 has had 1
    await settle()
    for i in range(4):  # newcomers that have had nothing would keep long1 waiting for ever
        calls.append(asyncio.ensure_future(gate.complete(request(f"new{i}"), program=100 + i)))
        await settle()
        clock.advance(1.0)
        await settle()
    await drain(clock, calls)
    assert served.index("long1") < served.index("new3"), served
    assert served[:3] == ["long0", "new0", "new1"], served


async def test_the_order_is_checked_by_name() -> None:
    with pytest.raises(InvalidArgument, match="order is one of 'las', 'fifo', not 'lifo'"):
        LLMGate(ScriptedProvider(lambda r: "ok"), order="lifo")
    with pytest.raises(InvalidArgument, match="starvation_after is a positive number of seconds"):
        LLMGate(ScriptedProvider(lambda r: "ok"), starvation_after=0)


async def test_processes_of_one_program_share_its_service_in_the_kernel() -> None:
    served: list[str] = []

    async def answer(req: LLMRequest) -> str:
        served.append(req.messages[-1].content)
        await asyncio.sleep(0.02)
        return "ok"

    async def child(ctx: Context, i: int) -> None:
        await ctx.llm(f"child {i}")

    async def fans_out(ctx: Context) -> None:
        await ctx.llm("parent")
        kids = [await ctx.spawn(child, i) for i in range(3)]
        for kid in kids:
            await ctx.wait(kid)

    async def short(ctx: Context) -> None:
        await ctx.llm("short")

    for order, place in (("las", 2), ("fifo", 4)):
        served.clear()
        gate = LLMGate(ScriptedProvider(answer), RateLimit(max_concurrency=1), order=order)
        async with Kernel(checkpointer=MemoryCheckpointer(), llm=gate) as kernel:
            parent = await kernel.spawn(fans_out)
            while "child 0" not in served:  # children 1 and 2 are in line behind it
                await asyncio.sleep(0.001)
            other = await kernel.spawn(short)
            await parent.wait(timeout=10)
            await other.wait(timeout=10)
        assert served.index("short") == place, (order, served)  # las: next, having had nothing


class RecordingPermits:
    """A permit source (``PermitSource``) that grants at once and keeps each call's rank: what
    a cluster's shared source is handed to order calls across gates."""

    def __init__(self) -> None:
        self.ranks: list[tuple[int, float] | None] = []

    async def acquire(self, tokens: int,
                      rank: tuple[int, float] | Callable[[], tuple[int, float]] | None = None) -> None:
        self.ranks.append(rank() if callable(rank) else rank)

    def release(self) -> None:
        pass

    def settle(self, tokens: int) -> None:
        pass

    def hold_back(self, seconds: float) -> None:
        pass


async def test_a_shared_permit_source_is_handed_each_call_s_place_in_the_order() -> None:
    """``(priority, the service its program has had)``, this call's share counted; a
    first-come-first-served gate asks for no order."""
    for order, expected in (("las", [(10, 1.0), (10, 2.0), (3, 1.0), (10, 3.0)]), ("fifo", [None] * 4)):
        permits = RecordingPermits()
        gate = LLMGate(ScriptedProvider(lambda r: "ok"), order=order)
        gate.share_permits(permits)
        await gate.complete(request("a0"), pid=1, program=1)
        await gate.complete(request("a1"), pid=2, program=1)
        await gate.complete(request("b0"), pid=3, program=2, priority=3)
        await gate.complete(request("a2"), pid=1, program=1)
        assert permits.ranks == expected, order
        await gate.aclose()


async def test_a_programs_queued_wave_yields_to_a_newer_programs_first_call() -> None:
    """Program 1's wave of ten joins the line while another program's call is served, when
    program 1 has had nothing. Once its first call has gone, a newer program's first call goes
    before the other nine: the line ranks by the service each program has had when the next
    call is chosen, not when its calls joined."""
    for order, new_at in (("las", 2), ("fifo", 11)):
        gate, served, clock = await one_at_a_time(order)
        calls = [asyncio.ensure_future(gate.complete(request("first"), program=9))]
        await settle()
        calls += [asyncio.ensure_future(gate.complete(request(f"wave{i}"), program=1)) for i in range(10)]
        await settle()
        clock.advance(1.0)
        await settle()
        assert served == ["first", "wave0"], served
        calls.append(asyncio.ensure_future(gate.complete(request("new"), program=2)))
        await settle()
        await drain(clock, calls)
        assert served.index("new") == new_at, (order, served)
        assert [s for s in served if s.startswith("wave")] == [f"wave{i}" for i in range(10)]
