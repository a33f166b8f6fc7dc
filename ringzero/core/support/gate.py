"""The LLM gate: one per provider, shared by every process that calls it.

A call passes the gate when it is at the head of the waiting line, a concurrency slot is free,
and the requests-per-minute and tokens-per-minute buckets hold enough. The line is ordered by
explicit priority (lower numbers first), then by the gate's ``order``:

- ``"las"`` (the default): least attained service first. The call whose program has had the
  least service from this gate goes first: a program is a top-level process with every process
  it spawned, and its service is counted in what the limit counts (tokens under a token limit,
  else requests), as of the moment the next call is chosen (``ServiceLine``): a program's wave
  of calls, queued before any was served, yields to a newer program's first call once its
  first calls have gone. Short programs finish without waiting behind the waves of a long one
  (Autellix's program-level scheduling). Among a program's calls, the first to come goes
  first. A call that has waited ``starvation_after`` seconds goes next among its priority, so
  no program starves.
- ``"fifo"``: arrival order.

 A 429 closes the gate for everyone until its
``Retry-After`` has passed, so fifty agents back off together instead of hammering the
server; the failed call is retried with exponential backoff and full jitter. Usage is
accounted per process and in total.
"""

from __future__ import annotations

import asyncio
import collections
import random
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import cast

from ringzero.core.contract.errors import InvalidArgument, ProviderError, ProviderUnavailable, RateLimited
from ringzero.core.contract.gate_settings import (
    PermitSource,
    Pricing,
    RateLimit,
    RetryPolicy,
    TokenBucket,
    estimate_tokens,
)
from ringzero.core.contract.protocols import LLMProvider, Streaming, TextSink
from ringzero.core.contract.types import LLMRequest, LLMResponse, Usage
from ringzero.core.support.loops import LoopHome, forward, on_this_loop
from ringzero.core.support.telemetry import gate_failed, gate_waited
from ringzero.core.support.timeouts import Clock, MonotonicClock, SharedTimeout
from ringzero.core.support.waitline import Entry, PriorityLine, ServiceLine

__all__ = [
    "ORDERS", "STARVATION_AFTER", "GateStats", "LLMGate", "PermitSource", "Pricing", "RateLimit", "RetryPolicy",
    "TokenBucket", "estimate_tokens",
]

ORDERS = ("las", "fifo")
"""The orders a gate's line may keep among calls of one priority (see the module)."""
STARVATION_AFTER = 20.0
"""Seconds a call waits in a least-attained-service line before it goes next among its priority."""


class _Waiter:
    __slots__ = ("wake",)

    def __init__(self) -> None:
        self.wake = asyncio.Event()


@dataclass
class GateStats:
    """Counters for one gate."""

    calls: int = 0
    attempts: int = 0
    retries: int = 0
    rate_limited: int = 0
    failures: int = 0


class LLMGate:
    """Admission, pacing, retries and accounting in front of one LLMProvider."""

    def __init__(
        self,
        provider: LLMProvider,
        rate_limit: RateLimit | None = None,
        retry: RetryPolicy | None = None,
        pricing: Pricing | None = None,
        *,
        clock: Clock | None = None,
        order: str = "las",
        starvation_after: float = STARVATION_AFTER,
    ) -> None:
        if order not in ORDERS:
            raise InvalidArgument(f"an LLMGate's order is one of {', '.join(map(repr, ORDERS))}, not {order!r}")
        if isinstance(starvation_after, bool) or not isinstance(starvation_after, (int, float)) \
                or not starvation_after > 0:
            raise InvalidArgument(f"starvation_after is a positive number of seconds, not {starvation_after!r}")
        if not callable(getattr(provider, "complete", None)):
            raise InvalidArgument(f"LLMGate needs an LLMProvider (an object with async complete(request)), not "
                                  f"{type(provider).__name__} {provider!r:.60}")
        for value, kind in ((rate_limit, RateLimit), (retry, RetryPolicy), (pricing, Pricing)):
            if value is not None and not isinstance(value, kind):
                raise InvalidArgument(f"LLMGate takes a {kind.__name__} there, not "
                                      f"{type(value).__name__} {value!r:.60}")
        self.provider = provider
        self.rate_limit = rate_limit or RateLimit()
        self.retry = retry or RetryPolicy()
        self.pricing = pricing
        self.stats = GateStats()
        self._total = [0, 0, 0.0, False]
        """Input tokens, output tokens, cost, and whether any call had a cost (``total_usage``):
        counters, not a Usage added up at every call."""
        self._usage_by_pid: dict[int, Usage] = {}
        self.clock = clock or MonotonicClock()
        """What the gate paces and backs off by (``ringzero.testing.ManualClock`` in tests)."""
        self._clock = self.clock.now
        self._requests = self._bucket(self.rate_limit.requests_per_minute, self.rate_limit.burst_requests)
        self._tokens = self._bucket(self.rate_limit.tokens_per_minute, self.rate_limit.burst_tokens)
        self._in_flight = 0
        self._closed_until = 0.0
        self.order = order
        self.starvation_after = float(starvation_after)
        self._attained: dict[int, float] = {}
        """Service each program has had (``order="las"``): tokens under a token limit, else calls."""
        self._line: PriorityLine[_Waiter] | ServiceLine[_Waiter] = \
            ServiceLine(self._service) if order == "las" else PriorityLine()
        self._by_tokens = self.rate_limit.tokens_per_minute is not None
        self._arrived: dict[int, collections.deque[tuple[float, Entry[_Waiter]]]] = {}
        """Per priority, the calls in line in arrival order, with when each came (``"las"``): the
        oldest is served next once it has waited ``starvation_after`` seconds."""
        self._timeouts: SharedTimeout | None = None
        """The attempts' timeout (``retry.timeout``), one loop timer for all of them."""
        self.permits: PermitSource | None = None
        """A rate limit shared with other machines' gates, checked after this gate's own (set by
        a cluster worker: ``share_permits``)."""
        self.streams = bool(getattr(provider.capabilities, "streaming", False)) and isinstance(provider, Streaming)
        """Whether the provider hands over text as it arrives (``complete(on_text=...)``)."""
        self.home = LoopHome(f"the LLM gate of {type(provider).__name__}", self._idle)
        """The one event loop the gate's waiting line lives on: calls from other loops and
        from threads (``home.run_sync(gate.complete(...))``) are run there."""

    def _idle(self) -> bool:
        return not self._line and self._in_flight == 0

    def _bucket(self, per_minute: float | None, burst: float | None) -> TokenBucket | None:
        if per_minute is None:
            return None
        per_second = per_minute / 60.0
        return TokenBucket(per_second, burst if burst is not None else max(1.0, per_second), self._clock)

    @property
    def total_usage(self) -> Usage:
        """Everything every call through this gate has spent."""
        input_tokens, output_tokens, cost, costed = self._total
        return Usage(int(input_tokens), int(output_tokens), cost if costed else None)

    def usage_for(self, pid: int) -> Usage:
        """Everything process ``pid`` has spent through this gate."""
        return self._usage_by_pid.get(pid, Usage())

    def share_permits(self, permits: PermitSource) -> None:
        """Check a rate limit shared with other machines' gates too, after this gate's own (a
        cluster worker: ``RayScheduler(rate_limits=...)``)."""
        self.permits = permits

    def snapshot(self) -> dict[str, float]:
        """The gate now, for ``ringzero top``: calls waiting in line and in flight, counters since
        it was made, and how long a 429 keeps it closed yet."""
        stats, total = self.stats, self._total
        return {"waiting": len(self._line), "in_flight": self._in_flight, "calls": stats.calls,
                "retries": stats.retries, "rate_limited": stats.rate_limited, "failures": stats.failures,
                "tokens": int(total[0] + total[1]),
                "closed_for_s": round(max(0.0, self._closed_until - self._clock()), 2)}

    def forget(self, pid: int) -> None:
        """Let go of what the gate keeps about ``pid`` (its usage): the kernel calls this when the
        process ends, so a long-lived gate does not grow with every process it served. The
        process's spend stays on its own record."""
        self._usage_by_pid.pop(pid, None)
        self._attained.pop(pid, None)

    async def complete(self, request: LLMRequest, *, pid: int = 0, priority: int = 10,
                       on_text: TextSink | None = None, program: int | None = None) -> LLMResponse:
        """Send ``request`` when the gate allows, retrying what is worth retrying.

        ``program``: the top-level process ``pid`` descends from (``pid`` itself where not
        given), whose service the line's order counts (``order="las"``).

        With ``on_text``, a provider that streams (``capabilities.streaming``) hands the answer's
        text to it as it arrives, on the caller's loop; one that does not answers whole, and
        ``on_text`` is not called. A failed attempt's text was handed over all the same: a
        retried call's text starts again from its beginning.

        Raises the provider's last ProviderError when retries run out or the error is final.
        Called from a loop other than the gate's home, the call runs on the home loop.
        """
        home = self.home.loop
        if home is None or home is not asyncio.get_running_loop() or self.home.closed:  # else: at home, as usual
            home = self.home.target()
            if home is not None:
                return await forward(home, self.complete(request, pid=pid, priority=priority,
                                                         on_text=on_text and on_this_loop(on_text), program=program))
        self.stats.calls += 1
        # The estimate paces only a tokens bucket (this gate's or the cluster's): skipped without one.
        estimate = estimate_tokens(request) if self._tokens is not None or self.permits is not None else 0
        policy = self.retry
        if program is None:
            program = pid
        for attempt in range(policy.max_retries + 1):
            if self._line or self._delay(estimate) != 0.0:
                waiting_since = self._clock()
                await self._admit(priority, estimate, program)
                gate_waited(self._clock() - waiting_since, priority)
            else:  # nobody waiting and room now: the common case, without a coroutine
                self._grant(estimate, program)
            permits = self.permits
            try:
                if permits is not None:
                    await permits.acquire(estimate, self._rank(priority, program))
            except BaseException:
                self._in_flight -= 1
                self._wake_head()
                raise
            self.stats.attempts += 1
            try:
                response = await self._attempt(request, on_text)
            except ProviderError as exc:
                delay = self._on_failure(exc, attempt)
                final = not exc.retryable or attempt == policy.max_retries
                gate_failed(exc, attempt, None if final else delay)
                if final:
                    self.stats.failures += 1
                    raise
                self.stats.retries += 1
            else:
                return self._account(response, pid, estimate, program)
            finally:
                self._in_flight -= 1
                if self._line:  # someone waits for this slot
                    self._wake_head()
                if permits is not None:
                    permits.release()
            await self.clock.sleep(delay)
        raise AssertionError("unreachable")  # pragma: no cover

    async def _attempt(self, request: LLMRequest, on_text: TextSink | None) -> LLMResponse:
        timeout = self.retry.timeout
        provider = self.provider
        call = (cast(Streaming, provider).stream(request, on_text) if on_text is not None and self.streams
                else provider.complete(request))
        try:
            if timeout is None:
                return await call
            shared = self._timeouts
            if shared is None or shared.seconds != timeout:  # the first call, or a new policy
                shared = self._timeouts = SharedTimeout(timeout)
            return await shared.run(call)
        except TimeoutError as exc:
            raise ProviderUnavailable(f"the provider did not answer within {timeout} s") from exc

    def _on_failure(self, exc: ProviderError, attempt: int) -> float:
        """Seconds this call waits before its retry; a 429 also closes the gate for everyone."""
        if not isinstance(exc, RateLimited):
            return self.retry.backoff(attempt)
        self.stats.rate_limited += 1
        if exc.retry_after is None:
            delay = self.retry.backoff(attempt)
            closed_for = delay
        else:
            # The server said when: everyone waits exactly that long; this call adds a little
            # jitter so that the retries do not all arrive in the same instant.
            closed_for = exc.retry_after
            delay = exc.retry_after + random.uniform(0.0, self.retry.base_delay)
        self._closed_until = max(self._closed_until, self._clock() + closed_for)
        if self.permits is not None:
            self.permits.hold_back(closed_for)
        return delay

    def _account(self, response: LLMResponse, pid: int, estimate: int, program: int) -> LLMResponse:
        usage = response.usage
        if usage.cost is None and self.pricing is not None:
            usage = replace(usage, cost=self.pricing.cost(usage))
            response = replace(response, usage=usage)
        if self._tokens is not None and usage.total_tokens:
            self._tokens.take(usage.total_tokens - estimate)
            if self.order == "las":  # the estimate counted at admission, corrected
                self._attained[program] = self._attained.get(program, 0.0) + usage.total_tokens - estimate
        if self.permits is not None and usage.total_tokens:
            self.permits.settle(usage.total_tokens - estimate)
        total = self._total
        total[0] += usage.input_tokens
        total[1] += usage.output_tokens
        if usage.cost is not None:
            total[2] += usage.cost
            total[3] = True
        before = self._usage_by_pid.get(pid)
        self._usage_by_pid[pid] = usage if before is None else before + usage
        return response

    async def _admit(self, priority: int, estimate: int, program: int) -> None:
        """Wait in line until this call may go (``complete`` lets one through at once when
        nobody waits and there is room)."""
        me = _Waiter()
        line = self._line
        if isinstance(line, ServiceLine):
            entry = line.push(priority, me, program)
            self._arrived.setdefault(priority, collections.deque()).append((self._clock(), entry))
        else:
            entry = line.push(priority, me)
        self._wake_head()
        try:
            while True:
                delay: float | None = None
                head = self._head()
                if head is entry:
                    delay = self._delay(estimate)
                    if delay == 0.0:
                        self._line.leave(entry)
                        self._grant(estimate, program)
                        return
                elif head is not None:  # the head may have changed meanwhile (a call waited past the bound)
                    head.item.wake.set()
                me.wake.clear()
                await self.clock.wait(me.wake, delay)
        except BaseException:
            self._line.leave(entry)
            raise
        finally:
            self._wake_head()

    def _delay(self, estimate: int) -> float | None:
        """Seconds until the head may go, 0.0 for now, None to wait for a concurrency slot."""
        cap = self.rate_limit.max_concurrency
        if cap is not None and self._in_flight >= cap:
            return None
        delay = max(0.0, self._closed_until - self._clock())
        if self._requests is not None:
            delay = max(delay, self._requests.wait_time(1))
        if self._tokens is not None:
            delay = max(delay, self._tokens.wait_time(estimate))
        return delay

    def _grant(self, estimate: int, program: int) -> None:
        self._in_flight += 1
        if self._requests is not None:
            self._requests.take(1)
        if self._tokens is not None:
            self._tokens.take(estimate)
        if self.order == "las":
            self._attained[program] = self._attained.get(program, 0.0) + (estimate if self._by_tokens else 1.0)

    def _service(self, program: int) -> float:
        return self._attained.get(program, 0.0)

    def _rank(self, priority: int, program: int) -> Callable[[], tuple[int, float]] | None:
        """A call's place in the cluster's least-attained-service order (``PermitSource``): a
        function that says it as of when it is called, its program's service growing as its
        other calls are served."""
        if self.order != "las":
            return None
        attained = self._attained
        return lambda: (priority, attained.get(program, 0.0))

    def _head(self) -> Entry[_Waiter] | None:
        """The call that goes next: the line's head, or, in a least-attained-service line, the
        oldest call of the head's priority once it has waited ``starvation_after`` seconds."""
        head = self._line.head()
        if head is None or self.order != "las":
            return head
        arrived = self._arrived.get(head.priority)
        while arrived and not arrived[0][1].live:
            arrived.popleft()
        if not arrived:
            return head
        since, oldest = arrived[0]
        return oldest if self._clock() - since >= self.starvation_after else head

    def close(self) -> None:
        """``aclose()`` for sync callers: closes the provider's connections on the gate's private
        loop (if it started one; connections on other loops close with those loops) and stops it."""
        if self.home.closed:
            return
        close = getattr(self.provider, "aclose", None)
        if close is not None and self.home.owns_loop:
            self.home.run_sync(close(), "LLMGate.close")
        self.home.close()

    async def aclose(self) -> None:
        """Close the provider's connections (it reopens them if used again) and stop the private
        loop the gate started for sync callers, if it did."""
        if self.home.closed:
            return
        close = getattr(self.provider, "aclose", None)
        if close is not None:
            await self.home.run(close())
        await self.home.aclose()

    def _wake_head(self) -> None:
        head = self._head()
        if head is not None:
            head.item.wake.set()
