"""The cluster gate's buckets (the Ray actor's class, called directly: its methods are plain
coroutines): concurrency, tokens and a 429's hold-back, counted for the whole cluster."""

from __future__ import annotations

import dataclasses
import time

import pytest

pytest.importorskip("ray", reason="the cluster gate ships with the 'ray' extra (pip install 'ringzero[ray]')")

from ringzero import RateLimit
from ringzero.providers.schedulers.ray_gate import ClusterGate


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
