"""The cluster gate's buckets (the Ray actor's class, called directly: its methods are plain
coroutines): concurrency, tokens and a 429's hold-back, counted for the whole cluster, and the
least-attained-service order across nodes."""

from __future__ import annotations

import asyncio
import dataclasses
import time
import types
from typing import Any

import pytest

pytest.importorskip("ray", reason="the cluster gate ships with the 'ray' extra (pip install 'ringzero[ray]')")

from ringzero import RateLimit
from ringzero.providers.schedulers.ray_gate import CLAIM_GRACE, DEFER, ClusterGate, ClusterPermits


def _gate(**limit: float) -> ClusterGate:
    return ClusterGate(dataclasses.asdict(RateLimit(**limit)))  # type: ignore[arg-type]


async def test_concurrency_is_counted_across_every_lease_until_calls_are_reported_ended() -> None:
    gate = _gate(max_concurrency=3)
    assert (await gate.lease(2, 10))["granted"] == 2  # node A
    second = await gate.lease(5, 10)  # node B wants five: one slot is left
    assert second["granted"] == 1
    refused = await gate.lease(1, 10)
    assert refused["granted"] == 0 and refused["wait"] > 0
    assert (await gate.lease(1, 10, ended=2))["granted"] == 1  # A's two calls ended, reported with a lease
    await gate.give_back(1, 10)  # B leased one it never used
    assert (await gate.stats())["in_flight"] == 1


async def test_tokens_per_minute_hold_across_nodes_and_usage_corrects_the_estimates() -> None:
    gate = _gate(tokens_per_minute=60_000, burst_tokens=1_000)  # 1,000 tokens/s
    started = time.monotonic()
    assert (await gate.lease(8, 400))["granted"] == 2  # 800 of the 1,000 in the bucket
    empty = await gate.lease(1, 400)
    since = time.monotonic() - started  # the bucket refilled meanwhile, however slow this host
    assert empty["granted"] == 0 and 0.2 - since <= empty["wait"] <= 0.2, (empty, since)  # 200 more needed at 1,000/s
    await gate.report(0, -600)  # the two calls used 100 tokens each, not 400: 600 come back
    assert (await gate.lease(1, 400, ended=2))["granted"] == 1


async def test_a_429_closes_the_gate_for_every_node_for_its_retry_after() -> None:
    gate = _gate(requests_per_minute=6_000)
    assert (await gate.lease(1, 10))["granted"] == 1
    held = time.monotonic()
    await gate.hold_back(2.0)  # one node saw a 429 with Retry-After: 2
    closed = await gate.lease(1, 10)  # any node's next lease
    since = time.monotonic() - held
    assert closed["granted"] == 0 and 2.0 - since <= closed["closed_for"] <= 2.0, (closed, since)
    assert closed["wait"] == closed["closed_for"]


async def test_the_next_room_goes_to_the_node_whose_waiting_call_has_had_least_service() -> None:
    """Node B's call (its program has had 1 call) was refused for want of room; once room comes
    back, node A (whose program has had 50) is put behind B's claim, whoever asks first."""
    gate = _gate(requests_per_minute=600, burst_requests=1)  # one room every 0.1 s
    assert (await gate.lease(1, 10, rank=(10, 50.0), node="A"))["granted"] == 1
    refused = await gate.lease(1, 10, rank=(10, 1.0), node="B")
    assert refused["granted"] == 0 and refused["wait"] > 0
    await asyncio.sleep(refused["wait"] + 0.01)  # the room is back
    behind = await gate.lease(1, 10, rank=(10, 50.0), node="A")
    assert behind == {"granted": 0, "wait": DEFER}
    assert (await gate.lease(1, 10, rank=(10, 1.0), node="B"))["granted"] == 1
    await asyncio.sleep(0.11)
    assert (await gate.lease(1, 10, rank=(10, 50.0), node="A"))["granted"] == 1  # B's claim ended with its grant


async def test_priority_comes_before_service_and_a_claim_lapses_when_its_node_stops_asking() -> None:
    gate = _gate(requests_per_minute=600, burst_requests=1)
    assert (await gate.lease(1, 10, rank=(10, 0.0), node="A"))["granted"] == 1
    refused = await gate.lease(1, 10, rank=(5, 1_000.0), node="B")  # a higher priority, much service
    await asyncio.sleep(refused["wait"] + 0.01)
    assert (await gate.lease(1, 10, rank=(10, 0.0), node="A"))["granted"] == 0
    await asyncio.sleep(CLAIM_GRACE + 0.05)  # B never asked again (a dead node): its claim lapsed
    assert (await gate.lease(1, 10, rank=(10, 0.0), node="A"))["granted"] == 1


class _Handle:
    """The actor class behind the shape of its Ray handle (``handle.lease.remote(...)``, each
    call a task on this loop, as Ray's are awaitable refs)."""

    def __init__(self, gate: ClusterGate) -> None:
        self._gate = gate

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._gate, name)
        return types.SimpleNamespace(remote=lambda *args: asyncio.ensure_future(method(*args)))


async def test_a_node_s_leases_carry_the_rank_of_its_best_waiting_call() -> None:
    """Three calls wait at one node's permits; each lease it sends carries the best rank among
    those waiting when it is sent (priority before service); a served call's rank leaves with it."""
    gate = _gate(requests_per_minute=1_200, burst_requests=1)  # one room every 50 ms
    assert (await gate.lease(1, 10, node="another"))["granted"] == 1  # the room is taken: all three wait
    ranks = [(10, 100.0), (10, 5.0), (3, 500.0)]
    served: list[tuple[int, float]] = []
    sent: list[tuple[Any, list[tuple[int, float]]]] = []  # each lease's rank, and who was served by then
    lease = gate.lease

    async def recorded(*args: Any) -> dict[str, float]:
        sent.append((args[4], list(served)))
        return await lease(*args)

    gate.lease = recorded  # type: ignore[method-assign]
    permits = ClusterPermits(_Handle(gate), batch=1, keep=0.0)

    async def call(rank: tuple[int, float]) -> None:
        await permits.acquire(10, rank)
        served.append(rank)
        permits.release()

    await asyncio.gather(*(call(rank) for rank in ranks))
    assert [rank for rank, _ in sent[:3]] == [(10, 100.0), (10, 5.0), (3, 500.0)]  # as each joined
    assert len(sent) > 3, sent
    for rank, served_by_then in sent[3:]:  # once all three had joined
        assert rank == min(r for r in ranks if r not in served_by_then), sent
    assert sorted(served) == sorted(ranks)


async def test_a_waiting_call_s_rank_is_its_program_s_service_when_each_lease_is_sent() -> None:
    """A gate hands its permits a function for a call's rank: while the call waits at the node,
    its program's other calls are served, and the leases it sends rank it by that service."""
    gate = _gate(requests_per_minute=600, burst_requests=1)  # one room every 100 ms
    assert (await gate.lease(1, 10, node="another"))["granted"] == 1
    sent: list[Any] = []
    lease = gate.lease

    async def recorded(*args: Any) -> dict[str, float]:
        sent.append(args[4])
        return await lease(*args)

    gate.lease = recorded  # type: ignore[method-assign]
    permits = ClusterPermits(_Handle(gate), batch=1, keep=0.0)
    service = {1: 0.0}
    waiting = asyncio.ensure_future(permits.acquire(10, lambda: (10, service[1])))
    while not sent:
        await asyncio.sleep(0.001)
    service[1] = 40.0  # its program's other calls, served meanwhile
    await asyncio.wait_for(waiting, timeout=5)
    assert sent[0] == (10, 0.0) and sent[-1] == (10, 40.0), sent


async def test_a_call_waiting_past_starvation_after_goes_first_among_its_priority() -> None:
    """Node B's light programs keep asking without end; node A's heavy call still gets a permit,
    once it has waited ``starvation_after``."""
    gate = _gate(requests_per_minute=1_200, burst_requests=1)
    busy = ClusterPermits(_Handle(gate), batch=1, keep=0.0)
    starving = ClusterPermits(_Handle(gate), batch=1, keep=0.0, starvation_after=0.3)
    stop = asyncio.Event()

    async def light_forever() -> None:
        while not stop.is_set():
            await busy.acquire(10, (10, 0.0))
            busy.release()

    flood = [asyncio.create_task(light_forever()) for _ in range(3)]
    try:
        await asyncio.sleep(0.1)
        await asyncio.wait_for(starving.acquire(10, (10, 1_000.0)), timeout=5)
    finally:
        stop.set()
        await asyncio.gather(*flood)
