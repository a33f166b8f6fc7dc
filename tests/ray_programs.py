"""What the Ray cluster tests run on every node: the node kernel factory, the programs, and
a counting OpenAI-format server (on 127.0.0.1) that can hold a rate limit of its own.

Module level, so that every Ray worker process imports the same functions by reference.
"""

from __future__ import annotations

import collections
import time
from typing import Any

from ringzero import Context, Kernel, Limits
from ringzero.checkpointers.postgres import PostgresCheckpointer
from ringzero.compat.vendor_servers import Reply, VendorServer, openai_answer, openai_error
from ringzero.core.support.gate import LLMGate, RetryPolicy
from ringzero.providers.llm.openai import OpenAIProvider


def node_kernel(dsn: str, llm_url: str) -> Kernel:
    """Every node's kernel: the shared PostgreSQL store and the test's model server."""
    provider = OpenAIProvider("test-model", base_url=llm_url, api_key="test-key", timeout=30.0)
    gate = LLMGate(provider, retry=RetryPolicy(max_retries=8, base_delay=0.05, max_delay=1.0))
    return Kernel(llm=gate, checkpointer=PostgresCheckpointer(dsn, max_connections=4))


async def research(ctx: Context, topic: str) -> str:
    """The cluster page's program (docs/cluster.md): one model call."""
    return (await ctx.llm(f"research {topic}")).content


async def chatter(ctx: Context, tag: str, calls: int, pause: float) -> list[str]:
    """``calls`` LLM calls, each prompt unique (``tag:i``), with a sleep between them."""
    out = []
    for i in range(calls):
        reply = await ctx.llm(f"{tag}:{i}")
        out.append(reply.content)
        ctx.state["done"] = i + 1
        if pause:
            await ctx.sleep(pause)
    return out


async def listener(ctx: Context, expect: int, first_sleep: float) -> list[Any]:
    """Sleep, then receive ``expect`` messages (most urgent first) and return them."""
    await ctx.sleep(first_sleep)
    got = []
    while len(got) < expect:
        message = await ctx.recv(timeout=30)
        if message is not None:
            got.append(message)
    return got


async def parent_of_two(ctx: Context, tag: str) -> list[Any]:
    """Two children (placed with their parent), each one LLM call; their results."""
    children = [await ctx.spawn(chatter, f"{tag}/{i}", 1, 0.0) for i in range(2)]
    return [await ctx.wait(child) for child in children]


async def spreading_parent(ctx: Context, n: int) -> dict[str, Any]:
    """``n`` children of 2 LLM calls each (3 reserved each); where they ran, what they returned,
    and what this process has spent once they are done (its own steps and their calls)."""
    kids = [await ctx.spawn(chatter, f"kid{i}", 2, 0.0, limits=Limits(llm_calls=3)) for i in range(n)]
    remote = [getattr(kid, "node", "") for kid in kids]
    results = [await ctx.wait(kid) for kid in kids]
    return {"results": results, "remote": [node for node in remote if node], "llm_calls": ctx.spent.llm_calls,
            "left": ctx.remaining("llm_calls")}


async def parent_of_sleepers(ctx: Context, n: int) -> None:
    """``n`` children that run until killed; then waits for a message that never comes."""
    for _ in range(n):
        await ctx.spawn(forever)
    await ctx.recv()


async def forever(ctx: Context) -> None:
    """Sleeps between LLM calls until killed."""
    i = 0
    while True:
        await ctx.llm(f"forever:{ctx.pid}:{i}")
        i += 1
        await ctx.sleep(0.05)


class CountingServer(VendorServer):
    """An OpenAI-format chat server that answers every prompt with ``echo <prompt>`` after
    ``delay`` seconds, counts each prompt, and when ``per_second`` is set answers 429 to any
    request beyond that rate (a sliding one-second window, as a vendor's limiter does)."""

    def __init__(self, delay: float = 0.0, per_second: float | None = None, retry_after_first: int = 0) -> None:
        super().__init__("openai", [])
        self.delay = delay
        self.per_second = per_second
        self.retry_after_first = retry_after_first
        """When set, the first request gets a 429 with this Retry-After (seconds)."""
        self.told_to_wait_at: float | None = None
        self.counts: collections.Counter[str] = collections.Counter()
        self.accepted: list[float] = []
        self.rejected = 0

    def repeated(self) -> dict[str, int]:
        """Prompts the server answered more than once."""
        return {prompt: n for prompt, n in self.counts.items() if n > 1}

    def _admit(self) -> bool:
        with self._lock:
            now = time.monotonic()
            if self.retry_after_first and self.told_to_wait_at is None:
                self.told_to_wait_at = now
                self.rejected += 1
                return False
            if self.per_second is not None:
                recent = [t for t in self.accepted[-int(self.per_second) * 2 - 2:] if now - t < 1.0]
                if len(recent) >= self.per_second:
                    self.rejected += 1
                    return False
            self.accepted.append(now)
            return True

    def answer(self, path: str, headers: dict[str, str], body: dict[str, Any]) -> Reply:
        if not self._admit():
            wait = {"retry-after": str(self.retry_after_first)} if self.retry_after_first else None
            return openai_error(429, "rate limited", "rate_limit_error", headers=wait)
        prompt = str(body["messages"][-1]["content"])
        with self._lock:
            self.counts[prompt] += 1
        reply = openai_answer(f"echo {prompt}")
        reply.delay = self.delay
        return reply
