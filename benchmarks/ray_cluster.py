"""What placing processes on a Ray cluster costs, against the same work in one local kernel.

A head and two worker nodes are started on this machine (``ray.cluster_utils.Cluster``), all
sharing one PostgreSQL server (the tests' own: Debian's package, started on 127.0.0.1). Every
kernel, local or on a node, journals into that server, so the rows differ only by where the
process runs. Rows:

- spawn: the caller's ``await kernel.spawn(...)`` until it has the handle (median);
- ``ctx.llm`` inside the process, provider answering at once (median): local kernel, a node's
  kernel, and a node's kernel whose gate takes permits from the cluster gate actor;
- 2,000 short agents (3 LLM calls of 20 ms each) on one node vs on three nodes;
- the resident memory of a node's worker process per idle process (1,000 blocked in recv).

    .venv/bin/python benchmarks/ray_cluster.py [--agents 2000]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # Ray on one machine: nodes on 127.0.0.1

import _cluster_programs as programs  # noqa: E402
import ray  # noqa: E402
from ray.cluster_utils import Cluster  # noqa: E402

from ringzero import Kernel, RateLimit  # noqa: E402
from ringzero.checkpointers.postgres import PostgresCheckpointer  # noqa: E402
from ringzero.providers.schedulers.ray_cluster import RayScheduler  # noqa: E402
from tests.postgres import fresh_database, postgres_dsn  # noqa: E402


def _rss_of(pid: int) -> int:
    with open(f"/proc/{pid}/statm") as f:
        return int(f.read().split()[1]) * 4096


def _scheduler(dsn: str, **options: Any) -> RayScheduler:
    return RayScheduler("_cluster_programs:node_kernel", {"dsn": dsn, **options.pop("kernel_args", {})},
                        namespace=f"b{uuid.uuid4().hex[:8]}", **options)


async def _spawn_median(kernel: Kernel, n: int) -> float:
    took = []
    handles = []
    for _ in range(n):
        started = time.perf_counter()
        handles.append(await kernel.spawn(programs.nothing))
        took.append(time.perf_counter() - started)
    await asyncio.gather(*(h.wait() for h in handles))
    return statistics.median(took)


async def _llm_median(kernel: Kernel, calls: int) -> float:
    handle = await kernel.spawn(programs.timed_calls, calls)
    took = await handle.wait()
    return statistics.median(took[10:])  # after the first connections are made


async def _agents_per_second(kernel: Kernel, agents: int) -> float:
    started = time.perf_counter()
    handles = await asyncio.gather(*(kernel.spawn(programs.short_agent, 3) for _ in range(agents)))
    await asyncio.gather(*(h.wait(600) for h in handles))
    return agents / (time.perf_counter() - started)


async def main(agents: int) -> None:
    console = Console()
    server = postgres_dsn.__wrapped__()  # type: ignore[attr-defined]
    admin = next(server)
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    cluster.add_node(num_cpus=2, resources={"first_worker": 1})
    cluster.add_node(num_cpus=2)
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, runtime_env={"env_vars": {"PYTHONPATH": str(HERE)}},
             log_to_driver=False, configure_logging=False)
    rows: list[tuple[str, str, str, str]] = []
    try:
        dsn = fresh_database(admin)
        async with Kernel(llm=programs.node_kernel(dsn).gate(), checkpointer=PostgresCheckpointer(dsn)) as local:
            local_spawn = await _spawn_median(local, 200)
            local_llm = await _llm_median(local, 300)
        dsn = fresh_database(admin)
        async with Kernel(scheduler=_scheduler(dsn, head=False), checkpointer=PostgresCheckpointer(dsn)) as remote:
            remote_spawn = await _spawn_median(remote, 200)
            remote_llm = await _llm_median(remote, 300)
        dsn = fresh_database(admin)
        gated = _scheduler(dsn, head=False, rate_limits={"default": RateLimit(requests_per_minute=6_000_000)})
        async with Kernel(scheduler=gated, checkpointer=PostgresCheckpointer(dsn)) as remote:
            gated_llm = await _llm_median(remote, 300)
        rows.append(("spawn, caller's wait for the handle (median)", f"{local_spawn * 1e3:.2f} ms",
                     f"{remote_spawn * 1e3:.2f} ms", f"{remote_spawn / local_spawn:.1f}x"))
        rows.append(("ctx.llm inside the process, durable in PostgreSQL (median)", f"{local_llm * 1e6:.0f} µs",
                     f"{remote_llm * 1e6:.0f} µs", f"{remote_llm / local_llm:.2f}x"))
        rows.append(("ctx.llm on a node, gate leasing from the cluster gate actor", f"{local_llm * 1e6:.0f} µs",
                     f"{gated_llm * 1e6:.0f} µs", f"{gated_llm / local_llm:.2f}x"))

        dsn = fresh_database(admin)
        kernel_args = {"latency": 0.02}
        async with Kernel(scheduler=_scheduler(dsn, require={"first_worker": 1}, kernel_args=kernel_args),
                          checkpointer=PostgresCheckpointer(dsn)) as one:
            one_rate = await _agents_per_second(one, agents)
        dsn = fresh_database(admin)
        async with Kernel(scheduler=_scheduler(dsn, head=True, kernel_args=kernel_args),
                          checkpointer=PostgresCheckpointer(dsn)) as three:
            three_rate = await _agents_per_second(three, agents)
        dsn = fresh_database(admin)
        async with Kernel(llm=programs.node_kernel(dsn, latency=0.02).gate(),
                          checkpointer=PostgresCheckpointer(dsn)) as local:
            local_rate = await _agents_per_second(local, agents)
        rows.append((f"{agents} short agents (3 calls of 20 ms), agents/s: local kernel | 1 node / 3 nodes",
                     f"{local_rate:.0f}/s", f"{one_rate:.0f}/s / {three_rate:.0f}/s",
                     f"{one_rate / local_rate:.2f}x / {three_rate / local_rate:.2f}x"))

        dsn = fresh_database(admin)
        scheduler = _scheduler(dsn, head=False)
        async with Kernel(scheduler=scheduler, checkpointer=PostgresCheckpointer(dsn)) as remote:
            await scheduler.start()
            pids = {name: await scheduler.worker_os_pid(name) for name in scheduler.nodes}
            before = {name: _rss_of(pid) for name, pid in pids.items()}
            idle = [await remote.spawn(programs.idle) for _ in range(1000)]
            await asyncio.sleep(1.0)
            grown = sum(_rss_of(pid) - before[name] for name, pid in pids.items())
            for handle in idle:
                await handle.send("go")
            await asyncio.gather(*(h.wait(60) for h in idle))
        rows.append(("idle process on a node: worker resident memory each (1,000 in recv)", "",
                     f"{grown / 1000 / 1024:.1f} KiB", ""))
    finally:
        ray.shutdown()
        cluster.shutdown()
        next(server, None)
    table = Table(title="Ray cluster on one machine (head + 2 worker nodes), PostgreSQL store", title_justify="left")
    for column in ("what", "local kernel", "on a node", "ratio"):
        table.add_column(column)
    for row in rows:
        table.add_row(*row)
    console.print(table)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--agents", type=int, default=2000)
    asyncio.run(main(parser.parse_args().agents))
