"""What an LLM gate is configured with (rate limits, retries, prices), what it counts, and the
token buckets and outside permits that pace it (``ringzero.core.support.gate``)."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from ringzero.core.contract.errors import InvalidArgument
from ringzero.core.contract.tokens import estimate_message_tokens, estimate_text_tokens
from ringzero.core.contract.types import LLMRequest, Usage

__all__ = ["PermitSource", "Pricing", "RateLimit", "RetryPolicy", "TokenBucket", "estimate_tokens"]


@dataclass(frozen=True)
class RateLimit:
    """The provider's limits as the gate should respect them. ``None`` means no limit.

    Bursts default to one second's worth of the rate (at least one request), which keeps
    the gate inside a server's per-second window as well as its per-minute one.
    """

    requests_per_minute: float | None = None
    tokens_per_minute: float | None = None
    max_concurrency: int | None = None
    burst_requests: float | None = None
    burst_tokens: float | None = None

    def __post_init__(self) -> None:
        for name in ("requests_per_minute", "tokens_per_minute", "max_concurrency", "burst_requests", "burst_tokens"):
            value = getattr(self, name)
            if value is not None and not _is_number(value, above=0):
                raise InvalidArgument(f"RateLimit.{name} must be a positive number or None, got {value!r}")
        if self.max_concurrency is not None and not isinstance(self.max_concurrency, int):
            raise InvalidArgument(f"RateLimit.max_concurrency counts calls: a whole number, "
                                  f"got {self.max_concurrency!r}")


def _is_number(value: object, *, above: float | None = None, at_least: float | None = None) -> bool:
    """A real number (not a bool, not NaN) above or at least a bound."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
        return False
    return (above is None or value > above) and (at_least is None or value >= at_least)


@dataclass(frozen=True)
class RetryPolicy:
    """How failed calls are retried: ``max_retries`` more tries after the first."""

    max_retries: int = 8
    base_delay: float = 0.25
    max_delay: float = 30.0
    timeout: float | None = 120.0
    """Seconds one attempt may take before it counts as a failure worth retrying."""

    def __post_init__(self) -> None:
        if isinstance(self.max_retries, bool) or not isinstance(self.max_retries, int) or self.max_retries < 0:
            raise InvalidArgument(f"RetryPolicy.max_retries must be a whole number, 0 or more, "
                                  f"got {self.max_retries!r}")
        for name in ("base_delay", "max_delay"):
            if not _is_number(getattr(self, name), at_least=0) or getattr(self, name) == float("inf"):
                raise InvalidArgument(f"RetryPolicy.{name} must be a finite number of seconds, 0 or more, "
                                      f"got {getattr(self, name)!r}")
        if self.timeout is not None and not _is_number(self.timeout, above=0):
            raise InvalidArgument(f"RetryPolicy.timeout must be a positive number of seconds or None, "
                                  f"got {self.timeout!r}")

    def backoff(self, attempt: int) -> float:
        """Full-jitter exponential backoff for the ``attempt``-th retry (0-based)."""
        return random.uniform(0.0, min(self.max_delay, self.base_delay * (2**attempt)))


@dataclass(frozen=True)
class Pricing:
    """Dollars per million tokens, used when the provider does not report a cost."""

    input_per_million: float
    output_per_million: float

    def __post_init__(self) -> None:
        for name in ("input_per_million", "output_per_million"):
            if not _is_number(getattr(self, name), at_least=0) or getattr(self, name) == float("inf"):
                raise InvalidArgument(f"Pricing.{name} must be a finite number of dollars, 0 or more, "
                                      f"got {getattr(self, name)!r}")

    def cost(self, usage: Usage) -> float:
        return (usage.input_tokens * self.input_per_million + usage.output_tokens * self.output_per_million) / 1e6


def estimate_tokens(request: LLMRequest) -> int:
    """A rough count (``ringzero.core.contract.tokens``) used only to pace the tokens bucket: messages,
    tool schemas and the most the answer may take."""
    schemas = "".join(t.name + t.description + str(t.parameters) for t in request.tools)
    return max(1, estimate_message_tokens(request.messages) + estimate_text_tokens(schemas)) + (request.max_tokens or 0)


class TokenBucket:
    """A token bucket; it may go negative when a call used more than was reserved."""

    def __init__(self, per_second: float, capacity: float, clock: Callable[[], float]) -> None:
        self.rate = per_second
        self.capacity = capacity
        self.level = capacity
        self._clock = clock
        self._stamp = clock()

    def _refill(self) -> None:
        now = self._clock()
        self.level = min(self.capacity, self.level + (now - self._stamp) * self.rate)
        self._stamp = now

    def wait_time(self, amount: float) -> float:
        self._refill()
        needed = min(amount, self.capacity) - self.level
        return 0.0 if needed <= 0 else needed / self.rate

    def take(self, amount: float) -> None:
        self._refill()
        self.level -= amount


@runtime_checkable
class PermitSource(Protocol):
    """Where a gate gets permits beyond its own buckets: one rate limit shared by the gates of
    many machines (``ringzero.providers.schedulers.ray_gate``). ``acquire`` waits for a permit
    for one request of about ``tokens`` tokens; ``release`` ends that request; ``settle`` corrects
    the tokens once usage is known; ``hold_back`` tells every sharer that the server said wait.

    ``rank`` is the call's place in a least-attained-service order, ``(priority, attained)``
    (lower goes first: its priority, then the service its program has had so far, in what the
    limit counts), or a function that gives it as of when it is called (``LLMGate`` hands one
    over: its program's service grows while the call waits); None from a
    first-come-first-served gate. A source shared by many gates should hand a permit to the
    best rank waiting anywhere, and bound how long any waits."""

    async def acquire(self, tokens: int,
                      rank: tuple[int, float] | Callable[[], tuple[int, float]] | None = None) -> None: ...

    def release(self) -> None: ...

    def settle(self, tokens: int) -> None: ...

    def hold_back(self, seconds: float) -> None: ...
