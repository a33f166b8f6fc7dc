"""``ringzero demo --ray --db postgresql://...``: agents on a local Ray cluster, one node killed.

Starts a Ray cluster on this machine (a head and two worker nodes), places eight agents on
the two workers through ``RayScheduler``, kills one worker's process with SIGKILL while they
run, and shows its agents finishing on the other node from their journals in PostgreSQL,
without a recorded model call being made again (the tests count that at the server).
"""

from __future__ import annotations

import asyncio
import collections
import os
import signal

from rich.console import Console
from rich.table import Table

from ringzero import Context, Kernel, RateLimit
from ringzero.core.contract.remote import RemoteProcessHandle
from ringzero.testing import ScriptedProvider

__all__ = ["node_kernel", "researcher", "run_cluster_demo"]

AGENTS = 8
STEPS = 6


def node_kernel(dsn: str) -> Kernel:
    """What every node runs: the shared store and an offline model (0.1 s per answer)."""
    from ringzero.checkpointers.postgres import PostgresCheckpointer

    model = ScriptedProvider(lambda request: f"notes on {request.messages[-1].content}", latency=0.1)
    return Kernel(llm=model, checkpointer=PostgresCheckpointer(dsn, max_connections=4))


async def researcher(ctx: Context, topic: str, steps: int) -> list[str]:
    """A few model calls with a pause between them, long enough to be caught mid-run."""
    notes = []
    for i in range(steps):
        notes.append((await ctx.llm(f"{topic}, part {i + 1}")).content)
        await ctx.sleep(0.3)
    return notes


def _table(title: str, handles: list[RemoteProcessHandle]) -> Table:
    table = Table(title=title, title_justify="left")
    for column in ("pid", "name", "node", "status"):
        table.add_column(column)
    for h in handles:
        table.add_row(str(h.pid), h.name, h.node, h.status.value)
    return table


async def run_cluster_demo(dsn: str, console: Console) -> int:
    """Run the demo; returns 1 if an agent did not finish with all its notes, else 0."""
    # Ray's switch for a cluster on one machine: the nodes listen on 127.0.0.1 only (read when Ray
    # is imported, so it must come first).
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    try:
        import ray
        from ray.cluster_utils import Cluster

        from ringzero.checkpointers.postgres import PostgresCheckpointer
        from ringzero.providers.schedulers.ray_cluster import RayScheduler
    except ImportError:
        console.print("the cluster demo needs the 'ray' and 'postgres' extras: pip install 'ringzero[ray,postgres]'")
        return 1
    console.print("starting a Ray cluster on this machine: a head and two worker nodes ...")
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    for _ in range(2):
        cluster.add_node(num_cpus=2)
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, log_to_driver=False, configure_logging=False)
    scheduler = RayScheduler("ringzero.demo_cluster:node_kernel", {"dsn": dsn}, head=False,
                             rate_limits={"default": RateLimit(requests_per_minute=1200)})
    failed = 0
    try:
        async with Kernel(scheduler=scheduler, checkpointer=PostgresCheckpointer(dsn)) as kernel:
            handles: list[RemoteProcessHandle] = []
            for i in range(AGENTS):
                handle = await kernel.spawn(researcher, f"topic {i}", STEPS, name=f"researcher-{i}")
                assert isinstance(handle, RemoteProcessHandle)
                handles.append(handle)
            console.print(_table("placed", handles))
            await asyncio.sleep(1.0)
            victim = handles[0].node
            worker = await scheduler.worker_os_pid(victim)
            console.print(f"[bold red]killing node {victim}[/] (SIGKILL of its worker, pid {worker}) mid-run")
            os.kill(worker, signal.SIGKILL)
            results = await asyncio.gather(*(h.wait(120) for h in handles), return_exceptions=True)
            for h in handles:
                await h.refresh()
            console.print(_table("finished", handles))
            for move in scheduler.moves:
                console.print(f"moved off {move['from']}: " + ", ".join(
                    f"pid {pid} -> {node}" for pid, node in sorted(move["to"].items())))
            failed = sum(1 for r in results if not isinstance(r, list) or len(r) != STEPS)
            per_node = collections.Counter(h.node for h in handles)
            console.print(f"{AGENTS - failed}/{AGENTS} agents finished with all {STEPS} notes; now on "
                          + ", ".join(f"{node}: {n}" for node, n in sorted(per_node.items())))
    finally:
        ray.shutdown()
        cluster.shutdown()  # type: ignore[no-untyped-call]
    return 1 if failed else 0
