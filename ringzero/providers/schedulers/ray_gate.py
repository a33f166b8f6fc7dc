"""One LLM rate limit for a whole Ray cluster: a gate actor that owns the buckets, and the
permit source each node's ``LLMGate`` asks.

``RateLimit`` is configured once (``RayScheduler(rate_limits={"default": RateLimit(...)})``). The
``ClusterGate`` actor holds its request and token buckets, the cluster's count of calls in
flight (``max_concurrency``) and the time until which a server's 429 closed the gate. A node's
gate first admits a call by its own rules (priorities, its own limits), then takes a permit
from its ``ClusterPermits``: a spare one leased earlier if it has one, else a lease from the
actor for as many permits as it has calls waiting (up to ``batch``), so calls that come
together pay one round trip between them. Spare permits are kept for ``keep`` seconds and
then given back, so a lease never lets a node run ahead of the cluster's rate for long.

A 429 on any node closes the actor's gate for its ``Retry-After``: every node's next lease
waits it out, and the node that saw it drops its spares at once.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from typing import Any

from ringzero.core.gate import RateLimit, TokenBucket

__all__ = ["ClusterGate", "ClusterPermits"]


class ClusterGate:
    """The actor: a cluster's buckets for one provider. Runs on one event loop, so no locks."""

    def __init__(self, limit: Mapping[str, Any]) -> None:
        self.limit = RateLimit(**limit)
        clock = time.monotonic
        rpm, tpm = self.limit.requests_per_minute, self.limit.tokens_per_minute
        self._requests = None if rpm is None else TokenBucket(
            rpm / 60, self.limit.burst_requests or max(1.0, rpm / 60), clock)
        self._tokens = None if tpm is None else TokenBucket(tpm / 60, self.limit.burst_tokens or max(1.0, tpm / 60),
                                                            clock)
        self._closed_until = 0.0
        self.in_flight = 0
        self.granted = 0

    async def lease(self, wanted: int, tokens: float) -> dict[str, float]:
        """Up to ``wanted`` permits of ``tokens`` each: ``granted`` (maybe 0), and when none were,
        ``wait`` seconds before asking again; ``closed_for`` while a 429 holds the gate."""
        now = time.monotonic()
        closed = self._closed_until - now
        if closed > 0:
            return {"granted": 0, "wait": closed, "closed_for": closed}
        granted = 0
        wait = 0.0
        cap = self.limit.max_concurrency
        while granted < wanted:
            if cap is not None and self.in_flight >= cap:
                wait = 0.02
                break
            wait = max(self._requests.wait_time(1) if self._requests else 0.0,
                       self._tokens.wait_time(tokens) if self._tokens else 0.0)
            if wait > 0:
                break
            if self._requests is not None:
                self._requests.take(1)
            if self._tokens is not None:
                self._tokens.take(tokens)
            self.in_flight += 1
            granted += 1
        self.granted += granted
        return {"granted": granted, "wait": wait}

    async def give_back(self, permits: int, tokens: float) -> None:
        """Permits leased and not used: back into the buckets."""
        self.in_flight -= permits
        self.granted -= permits
        if self._requests is not None:
            self._requests.take(-permits)
        if self._tokens is not None:
            self._tokens.take(-permits * tokens)

    async def release(self) -> None:
        """A call made with a permit has ended."""
        self.in_flight -= 1

    async def settle(self, tokens: float) -> None:
        """A call used ``tokens`` more (or, negative, fewer) than its permit reserved."""
        if self._tokens is not None:
            self._tokens.take(tokens)

    async def hold_back(self, seconds: float) -> None:
        """A server answered 429: nobody in the cluster sends for ``seconds``."""
        self._closed_until = max(self._closed_until, time.monotonic() + seconds)

    async def stats(self) -> dict[str, float]:
        return {"granted": self.granted, "in_flight": self.in_flight}


class ClusterPermits:
    """A node's side of the cluster gate (``ringzero.core.gate.PermitSource``)."""

    def __init__(self, actor: Any, *, batch: int = 8, keep: float = 0.25) -> None:
        self._actor = actor
        self.batch = batch
        self.keep = keep
        self._spare = 0
        self._spare_tokens = 0.0
        self._spare_at = 0.0
        self._waiting = 0
        self._closed_until = 0.0
        self.round_trips = 0

    async def acquire(self, tokens: int) -> None:
        while True:
            now = time.monotonic()
            if now < self._closed_until:
                await asyncio.sleep(self._closed_until - now)
                continue
            if self._spare and now - self._spare_at <= self.keep:
                self._spare -= 1
                return
            self._drop_spares()
            self._waiting += 1
            try:
                self.round_trips += 1
                # A batch even for one waiting call: the calls that follow within ``keep`` take
                # spares, so a process calling in a loop pays one round trip per batch.
                reply = await self._actor.lease.remote(max(self.batch, self._waiting), float(tokens))
            finally:
                self._waiting -= 1
            if reply.get("closed_for"):
                self._closed_until = max(self._closed_until, time.monotonic() + float(reply["closed_for"]))
            granted = int(reply["granted"])
            if granted:
                self._spare += granted - 1
                self._spare_tokens = float(tokens)
                self._spare_at = time.monotonic()
                return
            await asyncio.sleep(float(reply["wait"]))

    def _drop_spares(self) -> None:
        if self._spare:
            self._actor.give_back.remote(self._spare, self._spare_tokens)
            self._spare = 0

    def release(self) -> None:
        self._actor.release.remote()

    def settle(self, tokens: int) -> None:
        self._actor.settle.remote(float(tokens))

    def hold_back(self, seconds: float) -> None:
        self._closed_until = max(self._closed_until, time.monotonic() + seconds)
        self._drop_spares()
        self._actor.hold_back.remote(float(seconds))
