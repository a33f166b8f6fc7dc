"""Injected provider faults: a vendor-format server on 127.0.0.1 that fails on a seeded random
schedule, many processes calling it through one gate, and the checks that what the server saw
and what the journals hold agree. Shared by ``tests/test_faults.py`` and ``benchmarks/faults.py``.

Each attempt's fault is drawn from ``Random(f"{seed}|{prompt}|{attempt}")``, so a run's
schedule does not depend on the order in which concurrent calls reach the server.
"""

from __future__ import annotations

import asyncio
import itertools
import random
import resource
import time
from collections import Counter, defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ringzero import Context, Kernel, LLMGate, ProcessFailed, ProviderError, RateLimit, RetryPolicy
from ringzero.compat.vendor_servers import (
    Reply,
    Vendor,
    VendorServer,
    anthropic_answer,
    anthropic_error,
    openai_answer,
    openai_error,
)
from ringzero.core.contract.protocols import Checkpointer
from ringzero.core.support.timeouts import fail_after
from ringzero.testing import InProcessExecutor

FAULT_WEIGHTS: dict[str, float] = {
    "ok": 0.60,
    "429 retry-after": 0.03, "429": 0.03,
    "500": 0.03, "502": 0.03, "503": 0.03, "529": 0.03,
    "reset mid-body": 0.04, "slower than the timeout": 0.03, "truncated JSON": 0.04, "malformed 200": 0.03,
    "400": 0.02,
}
"""How often each answer is drawn, per attempt."""

ERROR_OF_FAULT = {
    "429 retry-after": "RateLimited", "429": "RateLimited",
    "500": "ProviderUnavailable", "502": "ProviderUnavailable", "503": "ProviderUnavailable",
    "529": "ProviderUnavailable", "reset mid-body": "ProviderUnavailable",
    "slower than the timeout": "ProviderUnavailable", "truncated JSON": "ProviderUnavailable",
    "malformed 200": "ProviderUnavailable", "400": "BadRequest",
}
"""The typed error each fault must come back as when it is a call's last attempt."""

RETRY_AFTER = 0.02
"""Seconds the ``429 retry-after`` answers ask for (``retry-after-ms`` for OpenAI; Anthropic's
``retry-after`` given as a fraction, which its clients parse the same way)."""


@dataclass(frozen=True)
class Attempt:
    prompt: str
    number: int
    fault: str
    arrived: float


class FaultyServer(VendorServer):
    """A vendor server whose every answer is drawn from ``weights`` (see the module docstring)."""

    def __init__(self, vendor: Vendor, *, seed: int, weights: Mapping[str, float] = FAULT_WEIGHTS,
                 slow_seconds: float = 1.0) -> None:
        super().__init__(vendor, [])
        self.seed = seed
        self.kinds = list(weights)
        self.weights = [weights[k] for k in self.kinds]
        self.slow_seconds = slow_seconds
        self.attempts: list[Attempt] = []
        self._seen: Counter[str] = Counter()

    def answer(self, path: str, headers: dict[str, str], body: dict[str, Any]) -> Reply:
        problem = self.refusal(path, headers, body)
        if problem is not None:
            return problem
        prompt = _prompt(body["messages"][-1])
        with self._lock:
            number = self._seen[prompt]
            self._seen[prompt] += 1
            fault = random.Random(f"{self.seed}|{prompt}|{number}").choices(self.kinds, self.weights)[0]
            self.attempts.append(Attempt(prompt, number, fault, time.monotonic()))
        return self._reply(fault, prompt)

    def _reply(self, fault: str, prompt: str) -> Reply:
        openai = self.vendor == "openai"
        good = openai_answer(f"answer to {prompt}") if openai else anthropic_answer(f"answer to {prompt}")
        if fault == "ok":
            return good
        if fault == "reset mid-body":
            return Reply(good.status, good.body, cut="reset")
        if fault == "truncated JSON":
            return Reply(good.status, good.body, cut="truncate")
        if fault == "slower than the timeout":
            return Reply(good.status, good.body, delay=self.slow_seconds)
        if fault == "malformed 200":
            return Reply(200, {"object": "chat.completion" if openai else "message", "unexpected": True})
        if fault.startswith("429"):
            headers = {} if fault == "429" else (
                {"retry-after-ms": str(int(RETRY_AFTER * 1000))} if openai else {"retry-after": str(RETRY_AFTER)})
            return (openai_error(429, "Rate limit reached for requests", "requests", "rate_limit_exceeded", headers)
                    if openai else anthropic_error(429, "rate_limit_error", "Number of requests has exceeded your "
                                                   "rate limit", headers))
        status = int(fault)
        if status == 400:
            return (openai_error(400, "Invalid 'messages': this request was refused", "invalid_request_error")
                    if openai else anthropic_error(400, "invalid_request_error", "this request was refused"))
        kind = {529: "overloaded_error"}.get(status, "api_error")
        return (openai_error(status, f"The server had an error ({status})", "server_error")
                if openai else anthropic_error(status, kind, f"Internal server error ({status})"))


def _prompt(message: dict[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, str):
        return content
    return "".join(block.get("text", "") for block in content or () if isinstance(block, dict))


class ClientView:
    """The provider as the gate calls it, recording what each attempt came to as the client saw
    it: ``ok``, the typed error's name, or ``timeout`` (the gate's attempt timeout cancelled it;
    on a loaded machine an answer the server sent in time can still arrive too late)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.seen: dict[str, list[str]] = defaultdict(list)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def complete(self, request: Any) -> Any:
        prompt = request.messages[-1].content
        try:
            response = await self.inner.complete(request)
        except ProviderError as exc:
            self.seen[prompt].append(type(exc).__name__)
            raise
        except asyncio.CancelledError:
            self.seen[prompt].append("timeout")
            raise
        self.seen[prompt].append("ok")
        return response


async def llm_caller(ctx: Context, calls: int) -> list[str]:
    """``calls`` model calls, each with a prompt that names the process and the call."""
    return [(await ctx.llm(f"pid {ctx.pid} call {i}")).content for i in range(calls)]


@dataclass
class FaultRun:
    vendor: str
    processes: int
    calls: int
    max_retries: int
    wall_seconds: float = 0.0
    max_rss_mib: float = 0.0
    outcomes: Counter[str] = field(default_factory=Counter)
    """``exited``, or the type of the error a failed process ended with."""
    faults: Counter[str] = field(default_factory=Counter)
    """Attempts the server answered, by what it answered."""
    problems: list[str] = field(default_factory=list)
    """Every disagreement found between the server, the journals and the rules."""


async def run_provider_faults(vendor: Vendor, *, processes: int, calls: int, seed: int, store: Checkpointer,
                              deadline: float, max_retries: int = 4, attempt_timeout: float = 0.3,
                              concurrency: int = 16) -> FaultRun:
    """``processes`` x ``calls`` model calls through one gate to a FaultyServer; the report."""
    from ringzero.providers.llm import AnthropicProvider, OpenAIProvider

    run = FaultRun(vendor, processes, calls, max_retries)
    server = FaultyServer(vendor, seed=seed, slow_seconds=attempt_timeout * 3)
    started = time.monotonic()
    with server.running():
        provider = (OpenAIProvider("gpt-test", base_url=server.url, api_key="test-key") if vendor == "openai"
                    else AnthropicProvider("claude-test", base_url=server.url, api_key="test-key"))
        client = ClientView(provider)
        gate = LLMGate(client, RateLimit(max_concurrency=concurrency),
                       RetryPolicy(max_retries=max_retries, base_delay=0.002, max_delay=0.02, timeout=attempt_timeout))
        async with Kernel(llm=gate, checkpointer=store, executor=InProcessExecutor()) as kernel:
            handles = [await kernel.spawn(llm_caller, calls, name=f"caller-{i}") for i in range(processes)]
            async with fail_after(deadline):  # none hangs: the whole run has a hard deadline
                ends = await asyncio.gather(*(h.wait() for h in handles), return_exceptions=True)
            journals = {h.pid: await kernel.store.journal(h.pid) for h in handles}
    run.wall_seconds = time.monotonic() - started
    run.max_rss_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    run.faults = Counter(a.fault for a in server.attempts)
    for handle, end in zip(handles, ends, strict=True):
        if isinstance(end, ProcessFailed):
            run.outcomes[(end.error or {}).get("type", end.status)] += 1
        elif isinstance(end, BaseException):
            run.outcomes[type(end).__name__] += 1
            run.problems.append(f"pid {handle.pid}: wait() raised {end!r}")
        else:
            run.outcomes["exited"] += 1
            expected = [f"answer to pid {handle.pid} call {i}" for i in range(calls)]
            if end != expected:
                run.problems.append(f"pid {handle.pid} returned {end!r:.200}")
    run.problems += _disagreements(server.attempts, client.seen, journals,
                                   {h.pid: e for h, e in zip(handles, ends, strict=True)}, max_retries)
    return run


def _disagreements(attempts: list[Attempt], client: Mapping[str, list[str]], journals: Mapping[int, list[Any]],
                   ends: Mapping[int, Any], max_retries: int) -> list[str]:
    """What the server's log, the client's view, the journals and the retry rules disagree on
    (empty: nothing). Retries are judged by what the client saw; the server's log says which
    fault each attempt met, and must map to the client's typed error wherever the two line up."""
    problems: list[str] = []
    by_prompt: dict[str, list[Attempt]] = defaultdict(list)
    for attempt in attempts:
        by_prompt[attempt.prompt].append(attempt)
    journaled: set[str] = set()
    for pid, entries in journals.items():
        calls = [e for e in entries if e.kind == "llm"]
        for i, entry in enumerate(calls):
            prompt = f"pid {pid} call {i}"
            journaled.add(prompt)
            tries = sorted(by_prompt.get(prompt, []), key=lambda a: a.number)
            seen = list(client.get(prompt, []))
            if not tries or not seen:
                problems.append(f"{prompt}: journaled, but the server or the client never saw it")
                continue
            if len(seen) > max_retries + 1:
                problems.append(f"{prompt}: {len(seen)} attempts, over the policy's {max_retries + 1}")
            if len(tries) > len(seen):
                problems.append(f"{prompt}: the server saw {len(tries)} attempts, the client made {len(seen)}")
            for earlier in seen[:-1]:
                if earlier not in ("RateLimited", "ProviderUnavailable", "timeout"):
                    problems.append(f"{prompt}: retried after {earlier!r}, which must not be retried")
            if len(tries) == len(seen):
                for attempt, saw in zip(tries, seen, strict=True):
                    wanted = "ok" if attempt.fault == "ok" else ERROR_OF_FAULT[attempt.fault]
                    if saw not in (wanted, "timeout"):
                        problems.append(f"{prompt}: the server answered {attempt.fault!r}, the client saw {saw!r}")
                for earlier, later in itertools.pairwise(tries):
                    if earlier.fault == "429 retry-after" and later.arrived - earlier.arrived < RETRY_AFTER - 0.002:
                        problems.append(f"{prompt}: retried {later.arrived - earlier.arrived:.3f} s after a 429 "
                                        f"that asked for {RETRY_AFTER} s")
            outcome, last = entry.outcome.to_json(), seen[-1]
            if last == "ok":
                content = (outcome.get("value") or {}).get("message", {}).get("content")
                if content != f"answer to {prompt}":
                    problems.append(f"{prompt}: the client got its answer, the journal holds {outcome!r:.200}")
            else:
                error = (outcome.get("error") or {}).get("type")
                if error != ("ProviderUnavailable" if last == "timeout" else last):
                    problems.append(f"{prompt}: its last attempt ended {last!r}, the journal holds {outcome!r:.200}")
                if last != "BadRequest" and len(seen) < max_retries + 1:
                    problems.append(f"{prompt}: gave up after {len(seen)} attempts, the last {last!r}, with "
                                    "retries left")
        failed = isinstance(ends.get(pid), ProcessFailed)
        if failed and (not calls or "error" not in calls[-1].outcome.to_json()):
            problems.append(f"pid {pid} failed, but its last journaled call did not")
    for prompt in by_prompt:
        if prompt not in journaled:
            problems.append(f"{prompt}: the server saw it, no journal holds it")
    return problems
