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

**The same order as one gate: least attained service.** A lease carries the rank of the best
call its node has waiting, ``(priority, attained)`` (``LLMGate._rank``: its priority, then the
service its program has had, as of when the lease is sent: a gate hands over a function that
says it now, so a call whose program was served while it waited ranks by that service). A
node refused for want of room leaves its rank with the actor as a claim, until it asks again
(its ``wait``, plus ``CLAIM_GRACE``). While another node's claim ranks better, a lease gets
nothing and asks again in ``DEFER`` seconds: the next room goes to the better call, whichever
node holds it. A call waiting at its node's permits longer than
``starvation_after`` ranks first among its priority, so no node starves. Attained service is
counted by each node's gate, so a program whose processes run on two nodes is two programs here.
Within a node, calls reach the permits in the order its gate admitted them; those waiting there
at once take the permits their leases win, not in rank order among themselves.
"""

from __future__ import annotations

import asyncio
import itertools
import time
import uuid
from collections.abc import Callable, Mapping
from typing import Any

from ringzero.core.support.gate import STARVATION_AFTER, RateLimit, TokenBucket

__all__ = ["ClusterGate", "ClusterPermits", "start_cluster_gate"]

REPORT_AFTER = 0.05
"""Seconds a node holds the ends of its calls before it tells the gate actor (if no lease goes first)."""
CLAIM_GRACE = 0.25
"""Seconds a refused node's claim outlives the ``wait`` it was told (a node that never asks
again, a dead one, blocks nobody for longer)."""
DEFER = 0.01
"""Seconds a node put behind a better claim waits before it asks again."""
STARVED = float("-inf")
"""The attained service of a call past ``starvation_after``: first among its priority."""
_LAST = (float("inf"), float("inf"))
"""The rank of a lease that asks for no order: behind any claim."""


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
        self.held_at: float | None = None
        """When (``time.monotonic``) the latest 429 to close an open gate reached this actor."""
        self.granted_when_held = 0
        """Permits granted before that moment: the only ones a call may use while the gate is closed."""
        self.claims: dict[str, tuple[tuple[float, ...], float]] = {}
        """Refused nodes' best waiting ranks, each with when it lapses."""

    async def lease(self, wanted: int, tokens: float, ended: int = 0, extra_tokens: float = 0.0,
                    rank: tuple[float, float] | None = None, node: str = "") -> dict[str, float]:
        """Up to ``wanted`` permits of ``tokens`` each: ``granted`` (maybe 0), and when none were,
        ``wait`` seconds before asking again; ``closed_for`` while a 429 holds the gate. What the
        node has to report since its last call comes along (see ``report``). ``rank``: the best
        call ``node`` has waiting (None: no order asked); nothing is granted while another node's
        claim ranks better (see the module docstring)."""
        await self.report(ended, extra_tokens)
        now = time.monotonic()
        closed = self._closed_until - now
        if closed > 0:
            self._claim(node, rank, now + closed)
            return {"granted": 0, "wait": closed, "closed_for": closed}
        if self._behind(node, rank, now):
            self._claim(node, rank, now + DEFER)
            return {"granted": 0, "wait": DEFER}
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
        if granted:
            self.claims.pop(node, None)
        else:
            self._claim(node, rank, now + wait)
        return {"granted": granted, "wait": wait}

    def _claim(self, node: str, rank: tuple[float, float] | None, asks_again: float) -> None:
        """``node`` was refused and will ask again at ``asks_again``: its best call's rank holds
        the next room for it (or a better one) until a little after that."""
        if rank is not None:
            self.claims[node] = (tuple(rank), asks_again + CLAIM_GRACE)

    def _behind(self, node: str, rank: tuple[float, float] | None, now: float) -> bool:
        """Whether another node's live claim ranks better than ``rank`` (no rank: any claim)."""
        mine = _LAST if rank is None else tuple(rank)
        for other, (claimed, lapses) in list(self.claims.items()):
            if lapses <= now:
                del self.claims[other]
            elif other != node and claimed < mine:
                return True
        return False

    async def give_back(self, permits: int, tokens: float) -> None:
        """Permits leased and not used: back into the buckets."""
        self.in_flight -= permits
        self.granted -= permits
        if self._requests is not None:
            self._requests.take(-permits)
        if self._tokens is not None:
            self._tokens.take(-permits * tokens)

    async def report(self, ended: int, extra_tokens: float) -> None:
        """``ended`` calls made with permits have ended, and used ``extra_tokens`` more (or,
        negative, fewer) than their permits reserved."""
        self.in_flight -= ended
        if self._tokens is not None and extra_tokens:
            self._tokens.take(extra_tokens)

    async def hold_back(self, seconds: float) -> None:
        """A server answered 429: nobody in the cluster sends for ``seconds``."""
        now = time.monotonic()
        if now >= self._closed_until:
            self.held_at, self.granted_when_held = now, self.granted
        self._closed_until = max(self._closed_until, now + seconds)

    async def stats(self) -> dict[str, float | None]:
        """Permits granted and in flight, and when the latest 429 closed the gate (``held_at``,
        ``granted_when_held``), so a caller can tell which calls could have been sent after it."""
        return {"granted": self.granted, "in_flight": self.in_flight,
                "held_at": self.held_at, "granted_when_held": self.granted_when_held}


class ClusterPermits:
    """A node's side of the cluster gate (``ringzero.core.support.gate.PermitSource``)."""

    def __init__(self, actor: Any, *, batch: int = 8, keep: float = 0.25,
                 starvation_after: float = STARVATION_AFTER) -> None:
        self._actor = actor
        self.batch = batch
        self.keep = keep
        self.starvation_after = starvation_after
        """Seconds a call waits here before it ranks first among its priority, cluster-wide."""
        self.node = uuid.uuid4().hex
        """This node's name at the actor (its claims)."""
        self._ranks: dict[int, tuple[tuple[int, float] | Callable[[], tuple[int, float]], float]] = {}
        """The calls waiting here: each one's rank (or what says it now), and since when."""
        self._calls = itertools.count()
        self._spare = 0
        self._spare_tokens = 0.0
        self._spare_at = 0.0
        self._waiting = 0
        self._closed_until = 0.0
        self._ended = 0
        self._extra_tokens = 0.0
        self._report: asyncio.TimerHandle | None = None
        self.round_trips = 0

    async def acquire(self, tokens: int,
                      rank: tuple[int, float] | Callable[[], tuple[int, float]] | None = None) -> None:
        me = next(self._calls)
        if rank is not None:
            self._ranks[me] = (rank, time.monotonic())
        try:
            await self._acquire(tokens)
        finally:
            self._ranks.pop(me, None)

    def best_rank(self) -> tuple[float, float] | None:
        """The rank of the best call waiting here, one past ``starvation_after`` first among
        its priority; None where none waits with a rank."""
        now = time.monotonic()
        ranks = []
        for rank, since in self._ranks.values():
            priority, attained = rank() if callable(rank) else rank
            ranks.append((priority, STARVED if now - since >= self.starvation_after else attained))
        return min(ranks, default=None)

    async def _acquire(self, tokens: int) -> None:
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
                ended, extra, self._ended, self._extra_tokens = self._ended, self._extra_tokens, 0, 0.0
                reply = await self._actor.lease.remote(max(self.batch, self._waiting), float(tokens), ended, extra,
                                                       self.best_rank(), self.node)
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
        self._ended += 1
        self._report_soon()

    def settle(self, tokens: int) -> None:
        self._extra_tokens += tokens
        self._report_soon()

    def _report_soon(self) -> None:
        """Ends and token corrections go with the next lease, or within ``REPORT_AFTER`` seconds:
        not one message per call."""
        if self._report is None:
            self._report = asyncio.get_running_loop().call_later(REPORT_AFTER, self._send_report)

    def _send_report(self) -> None:
        self._report = None
        if self._ended or self._extra_tokens:
            self._actor.report.remote(self._ended, self._extra_tokens)
            self._ended, self._extra_tokens = 0, 0.0

    def hold_back(self, seconds: float) -> None:
        self._closed_until = max(self._closed_until, time.monotonic() + seconds)
        self._drop_spares()
        self._actor.hold_back.remote(float(seconds))


def start_cluster_gate(provider: str, limit: RateLimit, namespace: str) -> Any:
    """The ``ClusterGate`` actor of ``provider`` (started now, or the one already running)."""
    import dataclasses

    import ray

    gate_class: Any = ray.remote(ClusterGate)
    return gate_class.options(name=f"ringzero-gate-{provider}", namespace=namespace, num_cpus=0,
                              get_if_exists=True).remote(dataclasses.asdict(limit))
