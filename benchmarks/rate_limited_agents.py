"""50 agents x 10 calls against a local server that answers 429 past its rate limit.

The peer is what most agent code does today: ``asyncio.gather`` over the agents, each
calling the API directly; a 429 is a failed call. ringzero runs the same agents as
processes behind one LLM gate configured with the server's published limit. The bound
is the fastest any client can finish: (calls - burst) / rate seconds.

    .venv/bin/python benchmarks/rate_limited_agents.py [--agents 50 --calls 10 --rate 100 --burst 10]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
from _progress import step
from rich.console import Console
from rich.table import Table

from ringzero import Context, Kernel, LLMGate, RateLimit, RetryPolicy
from ringzero.checkpointers import MemoryCheckpointer, SqliteCheckpointer
from ringzero.core.contract.errors import ProviderError, ProviderUnavailable, RateLimited
from ringzero.core.contract.protocols import ProviderCapabilities
from ringzero.core.contract.types import LLMRequest, LLMResponse, Message, Usage

HERE = Path(__file__).resolve().parent


class MinimalHttpProvider:
    """Just enough of an OpenAI-compatible client for this benchmark (the real one is
    ringzero.providers.llm.OpenAIProvider, from its own issue)."""

    capabilities = ProviderCapabilities(tool_calls=False)

    def __init__(self, client: httpx.AsyncClient) -> None:
        self.client = client

    async def complete(self, request: LLMRequest) -> LLMResponse:
        try:
            reply = await self.client.post("/v1/chat/completions", json={
                "model": "bench", "messages": [{"role": m.role, "content": m.content} for m in request.messages]})
        except httpx.HTTPError as exc:
            raise ProviderUnavailable(str(exc)) from exc
        if reply.status_code == 429:
            raise RateLimited("429", retry_after=float(reply.headers.get("retry-after", "1")))
        if reply.status_code >= 500:
            raise ProviderUnavailable(f"HTTP {reply.status_code}")
        data = reply.json()
        usage = data["usage"]
        return LLMResponse(Message("assistant", data["choices"][0]["message"]["content"]),
                           Usage(usage["prompt_tokens"], usage["completion_tokens"]))


async def plain_gather(client: httpx.AsyncClient, agents: int, calls: int) -> int:
    """The peer: every agent calls the API itself; returns how many calls failed."""
    async def agent(i: int) -> int:
        failed = 0
        for n in range(calls):
            reply = await client.post("/v1/chat/completions", json={
                "model": "bench", "messages": [{"role": "user", "content": f"agent {i} call {n}"}]})
            failed += reply.status_code != 200
        return failed

    return sum(await asyncio.gather(*(agent(i) for i in range(agents))))


async def agent_program(ctx: Context, i: int, calls: int) -> int:
    for n in range(calls):
        await ctx.llm(f"agent {i} call {n}")
    return calls


async def through_ringzero(client: httpx.AsyncClient, agents: int, calls: int, rate: float, burst: float,
                           durable: Path | None) -> int:
    gate = LLMGate(MinimalHttpProvider(client), RateLimit(requests_per_minute=rate * 60, burst_requests=burst),
                   RetryPolicy(max_retries=20, base_delay=0.05))
    store = SqliteCheckpointer(durable) if durable else MemoryCheckpointer()
    failed = 0
    async with Kernel(checkpointer=store, llm=gate) as kernel:
        handles = [await kernel.spawn(agent_program, i, calls) for i in range(agents)]
        for handle in handles:
            try:
                await handle.wait()
            except ProviderError:
                failed += calls
    return failed + gate.stats.failures


async def run(label: str, port: int, job: object, total: int, bound: float) -> list[str]:
    limits = httpx.Limits(max_connections=100, max_keepalive_connections=100)
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", limits=limits, timeout=30) as client:
        before = (await client.get("/stats")).json()
        started = time.perf_counter()
        failed = await job(client)  # type: ignore[operator]
        wall = time.perf_counter() - started
        after = (await client.get("/stats")).json()
    refused = after["refused"] - before["refused"]
    return [label, f"{total - failed}/{total}", str(failed), str(refused), f"{wall:.2f}", f"{bound:.2f}",
            f"{(wall / bound - 1) * 100:+.1f}%" if failed == 0 else "n/a (calls failed)"]


@contextlib.contextmanager
def local_server(rate: float, burst: float) -> Iterator[int]:
    """Start _ratelimited_server.py on 127.0.0.1 and yield its port."""
    server = subprocess.Popen([sys.executable, str(HERE / "_ratelimited_server.py"), str(rate), str(burst)],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None
        yield int(server.stdout.readline())
    finally:
        server.terminate()
        server.wait(5)
        assert server.stdout is not None
        server.stdout.close()


async def main(agents: int, calls: int, rate: float, burst: float) -> None:
    total = agents * calls
    bound = (total - burst) / rate
    table = Table(title=f"{agents} agents x {calls} calls, server limit {rate:g} req/s (burst {burst:g}), 127.0.0.1")
    for column in ("client", "succeeded", "failed calls", "429s seen", "wall s", "bound s", "vs bound"):
        table.add_column(column, justify="left" if column == "client" else "right")
    with tempfile.TemporaryDirectory() as tmp:
        cases = [
            ("plain asyncio.gather (the peer)", lambda c: plain_gather(c, agents, calls)),
            ("ringzero, journal in memory", lambda c: through_ringzero(c, agents, calls, rate, burst, None)),
            ("ringzero, journal in SQLite", lambda c: through_ringzero(c, agents, calls, rate, burst,
                                                                       Path(tmp) / "bench.db")),
        ]
        for label, job in cases:  # a fresh server (and a full bucket) for each client
            with local_server(rate, burst) as port:
                step(label)
                table.add_row(*await run(label, port, job, total, bound))
    Console(width=130).print(table)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--agents", type=int, default=50)
    parser.add_argument("--calls", type=int, default=10)
    parser.add_argument("--rate", type=float, default=100.0)
    parser.add_argument("--burst", type=float, default=10.0)
    args = parser.parse_args()
    asyncio.run(main(args.agents, args.calls, args.rate, args.burst))
