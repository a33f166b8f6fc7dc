"""Processes on a real Ray cluster (a head and two worker nodes on this machine) sharing a real
PostgreSQL: placement, every handle operation, the cluster-wide LLM gate, a node killed."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("ray", reason="the Ray tests need the 'ray' extra (pip install 'ringzero[ray]')")

from ringzero import InvalidArgument, Kernel, ProcessFailed, ProcessStatus, StopReason
from ringzero.checkpointers.postgres import PostgresCheckpointer
from ringzero.core.contract.remote import RemoteProcessHandle
from tests import ray_programs
from tests.postgres import fresh_database

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]  # a Ray cluster on 2 busy cores starts in minutes

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    """A head (no CPUs for processes) and two worker nodes, one with a ``sandbox`` resource."""
    import ray
    from ray.cluster_utils import Cluster

    failure: Exception | None = None
    for _ in range(2):  # Ray gives a node 30 s to register; a busy host may need a second try
        made = Cluster()
        try:
            made.add_node(num_cpus=1, include_dashboard=False)
            nodes = [made.add_node(num_cpus=2), made.add_node(num_cpus=2, resources={"sandbox": 1})]
            made.wait_for_nodes()
            break
        except Exception as exc:  # pragma: no cover - depends on the host
            failure = exc
            made.shutdown()
    else:  # pragma: no cover - depends on the host
        pytest.skip(f"a local Ray cluster cannot start on this host (tried twice): {failure}")
    ray.init(address=made.address, runtime_env={"env_vars": {"PYTHONPATH": str(REPO)}},
             log_to_driver=False, configure_logging=False)
    made.worker_nodes_list = nodes
    try:
        yield made
    finally:
        ray.shutdown()
        made.shutdown()


@pytest.fixture
def server() -> Iterator[ray_programs.CountingServer]:
    with ray_programs.CountingServer(delay=0.01).running() as running:
        yield running


async def _kernel(cluster: Any, dsn: str, llm_url: str, **options: Any) -> Kernel:
    from ringzero.providers.schedulers.ray_cluster import RayScheduler

    scheduler = RayScheduler("tests.ray_programs:node_kernel", {"dsn": dsn, "llm_url": llm_url},
                             namespace=f"t{uuid.uuid4().hex[:8]}", **options)
    kernel = Kernel(scheduler=scheduler, checkpointer=PostgresCheckpointer(dsn))
    await kernel.start()
    return kernel


@pytest.fixture
async def dsn(postgres_dsn: str) -> AsyncIterator[str]:
    yield fresh_database(postgres_dsn)


async def test_the_cluster_page_runs_a_process_on_a_node_with_its_resources(
        cluster: Any, dsn: str, server: ray_programs.CountingServer, capsys: pytest.CaptureFixture[str]) -> None:
    """docs/cluster.md's first block, on this test's cluster, with its three names of the reader's
    own (the store's DSN, the node kernel factory, the program) made this test's."""
    import ast
    import re

    page = (REPO / "docs/cluster.md").read_text()
    marker = "::test_the_cluster_page_runs_a_process_on_a_node_with_its_resources -->\n```python\n"
    block = re.search(re.escape(marker) + "(.*?)```", page, re.S)
    assert block is not None
    code = block.group(1)
    for reader_s, ours in (
            ('DSN = "postgresql://agents@db.internal/agents"', f"DSN = {dsn!r}"),
            ('"myapp.cluster:node_kernel", {"dsn": DSN}',
             f'"tests.ray_programs:node_kernel", {{"dsn": DSN, "llm_url": {server.url!r}}}'),
            ("from myapp.agents import research", "from tests.ray_programs import research")):
        assert reader_s in code, f"the page's block no longer has {reader_s!r}"
        code = code.replace(reader_s, ours)
    namespace: dict[str, Any] = {}
    await eval(compile(code, "docs/cluster.md", "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT), namespace)
    process = namespace["p"]
    assert capsys.readouterr().out.split(maxsplit=1) == [process.node, "echo research topic\n"]
    assert process.status is ProcessStatus.EXITED


async def test_two_hundred_processes_spread_over_the_nodes_with_every_handle_operation(
        cluster: Any, dsn: str, server: ray_programs.CountingServer) -> None:
    kernel = await _kernel(cluster, dsn, server.url, head=False)
    try:
        handles = list(await asyncio.gather(*(kernel.spawn(ray_programs.chatter, f"p{i}", 2, 0.0)
                                              for i in range(194))))
        assert all(isinstance(h, RemoteProcessHandle) for h in handles)
        sleeper = await kernel.spawn(ray_programs.chatter, "slow", 3, 2.0)
        doomed = await kernel.spawn(ray_programs.forever)
        inbox = await kernel.spawn(ray_programs.listener, 2, 4.0)
        family = await kernel.spawn(ray_programs.parent_of_two, "fam")
        boxed = await kernel.spawn(ray_programs.chatter, "boxed", 1, 0.0, resources={"sandbox": 1})
        cpu_heavy = await kernel.spawn(ray_programs.chatter, "cpu", 1, 0.0, resources={"CPU": 2})
        everyone = [*handles, sleeper, doomed, inbox, family, boxed, cpu_heavy]
        assert len(everyone) == 200
        per_node: dict[str, int] = {}
        for h in everyone:
            assert isinstance(h, RemoteProcessHandle)
            per_node[h.node] = per_node.get(h.node, 0) + 1
        assert len(per_node) == 2 and min(per_node.values()) >= 80, per_node  # spread over both workers

        with pytest.raises(InvalidArgument, match="no node of the cluster has"):
            await kernel.spawn(ray_programs.chatter, "gpu", 1, 0.0, resources={"GPU": 1})

        assert isinstance(sleeper, RemoteProcessHandle)
        await sleeper.pause()
        await asyncio.sleep(2.5)  # it reaches its next syscall boundary and stops there
        await sleeper.refresh()
        assert sleeper.status is ProcessStatus.PAUSED
        await sleeper.resume()

        await inbox.send({"n": 1})
        await inbox.send({"n": 2}, priority=1)
        assert await inbox.wait(30) == [{"n": 2}, {"n": 1}]

        await asyncio.sleep(0.3)  # mid-run, most likely inside an LLM call (each takes 10 ms)
        started = time.monotonic()
        await doomed.kill()
        assert time.monotonic() - started < 1.0
        assert doomed.status is ProcessStatus.KILLED and doomed.stop_reason is StopReason.KILLED
        with pytest.raises(ProcessFailed):
            await doomed.wait()

        results = await asyncio.gather(*(h.wait(60) for h in handles))
        assert results[7] == ["echo p7:0", "echo p7:1"]
        assert await family.wait(30) == [["echo fam/0:0"], ["echo fam/1:0"]]
        assert await boxed.wait(30) == ["echo boxed:0"]
        assert isinstance(boxed, RemoteProcessHandle) and isinstance(cpu_heavy, RemoteProcessHandle)
        assert await cpu_heavy.wait(30) == ["echo cpu:0"]
        assert await sleeper.wait(30) == ["echo slow:0", "echo slow:1", "echo slow:2"]
        assert server.repeated() == {}

        rows = {row.pid: row for row in await kernel.ps(all=True)}
        assert rows[handles[0].pid].status is ProcessStatus.EXITED and rows[handles[0].pid].llm_calls == 2
        owners = await kernel.store.owners()
        assert {owners[h.pid][1] for h in everyone} == set(per_node)
        boxed_node = owners[boxed.pid][1]
        assert boxed.node == boxed_node
    finally:
        await kernel.aclose()


async def _recorded_prompts(kernel: Kernel, pids: list[int]) -> set[str]:
    """The prompts whose answers are in the journals (an answer ``echo P`` records prompt P)."""
    recorded = set()
    for pid in pids:
        for entry in await kernel.store.journal(pid):
            if entry.kind == "llm" and "value" in entry.outcome.to_json():
                recorded.add(str(entry.outcome.to_json()["value"]["message"]["content"]).removeprefix("echo "))  # type: ignore[call-overload,index]
    return recorded


async def test_a_killed_node_s_processes_finish_on_the_others_without_repeating_a_recorded_call(
        cluster: Any, dsn: str, server: ray_programs.CountingServer) -> None:
    kernel = await _kernel(cluster, dsn, server.url, head=False)
    try:
        from ringzero.providers.schedulers.ray_cluster import RayScheduler

        scheduler = kernel.scheduler
        assert isinstance(scheduler, RayScheduler)
        handles = list(await asyncio.gather(*(kernel.spawn(ray_programs.chatter, f"k{i}", 8, 0.15)
                                              for i in range(50))))
        nodes = {h.node for h in handles if isinstance(h, RemoteProcessHandle)}
        assert len(nodes) == 2
        await asyncio.sleep(0.6)  # every process is mid-run: a few calls recorded, more to come
        victim = min(nodes)
        on_victim = [h.pid for h in handles if isinstance(h, RemoteProcessHandle) and h.node == victim]
        worker = await scheduler.worker_os_pid(victim)
        os.kill(worker, signal.SIGSTOP)  # frozen: what it recorded is now all it will ever record
        await asyncio.sleep(0.3)
        before = await _recorded_prompts(kernel, on_victim)
        assert before, "the victim had recorded nothing yet: the test would prove nothing"
        os.kill(worker, signal.SIGKILL)

        results = await asyncio.gather(*(h.wait(90) for h in handles))
        assert all(r == [f"echo k{i}:{j}" for j in range(8)] for i, r in enumerate(results))
        assert scheduler.moves and scheduler.moves[0]["from"] == victim
        assert sorted(scheduler.moves[0]["to"]) == sorted(pid for pid in on_victim
                                                          if pid in scheduler.moves[0]["to"])
        assert set(scheduler.moves[0]["to"].values()) == nodes - {victim}
        again = server.repeated()
        assert not set(again) & before, f"recorded calls made again: {set(again) & before}"
        assert len(again) <= len(on_victim)  # at most the one call each had in flight
        owners = await kernel.store.owners()
        assert all(owners[pid][0] == 2 and owners[pid][1] != victim for pid in scheduler.moves[0]["to"])
    finally:
        await kernel.aclose()


async def test_one_rate_limit_holds_across_the_nodes_and_a_429_holds_every_node_back(
        cluster: Any, dsn: str) -> None:
    from ringzero import RateLimit

    bound = 5.0  # requests per second for the whole cluster; the server refuses a 7th in any second
    with ray_programs.CountingServer(delay=0.01, per_second=bound + 1, retry_after_first=1).running() as server:
        kernel = await _kernel(cluster, dsn, server.url, head=False,
                               rate_limits={"default": RateLimit(requests_per_minute=bound * 60, burst_requests=1)})
        try:
            handles = [await kernel.spawn(ray_programs.chatter, f"r{i}", 5, 0.0) for i in range(10)]
            assert len({h.node for h in handles if isinstance(h, RemoteProcessHandle)}) == 2
            results = await asyncio.gather(*(h.wait(120) for h in handles))
            gate = await kernel.scheduler.gates["default"].stats.remote()  # type: ignore[attr-defined]
        finally:
            await kernel.aclose()
    assert all(len(r) == 5 for r in results)  # 0 failed calls
    assert server.rejected == 1  # the scripted 429, and no other: the cluster never ran past the server's limit
    assert server.told_to_wait_at is not None
    accepted = sorted(server.accepted)
    assert len(accepted) == 50
    # Retry-After: 1 held back both nodes. The news takes a moment to reach the gate actor (one
    # monotonic clock: every node of this cluster is on this host). A call may land during the
    # hold only with a permit granted before the news came: a permit granted in the hold would
    # let more calls land than the permits granted before it, less those already used.
    told, held_at = server.told_to_wait_at, gate["held_at"]
    assert held_at is not None and told <= held_at < told + 1.0, (told, held_at)
    sent_by_then = sum(1 for t in accepted if t <= told) + 1  # and the call refused with the 429
    in_the_hold = [t - told for t in accepted if told < t < told + 1.0]
    assert len(in_the_hold) <= gate["granted_when_held"] - sent_by_then, (in_the_hold, gate, sent_by_then)
    rate = (len(accepted) - 1) / (accepted[-1] - accepted[0])
    assert bound * 0.9 <= rate <= bound * 1.1, rate


async def test_children_spread_over_the_nodes_with_waits_refunds_and_kills_across_them(
        cluster: Any, dsn: str, server: ray_programs.CountingServer) -> None:
    from ringzero import Limits

    kernel = await _kernel(cluster, dsn, server.url, head=False, children="spread")
    try:
        parent = await kernel.spawn(ray_programs.spreading_parent, 6, limits=Limits(llm_calls=40))
        assert isinstance(parent, RemoteProcessHandle)
        out = await parent.wait(60)
        assert out["results"] == [[f"echo kid{i}:0", f"echo kid{i}:1"] for i in range(6)]
        assert len(out["remote"]) == 3 and set(out["remote"]) == {n for n in kernel.scheduler.nodes  # type: ignore[attr-defined]
                                                                  if n != parent.node}
        # Each child reserved 3 calls and spent 2: the parent was charged 2 each, refunded 1 each,
        # wherever the child ran.
        assert out["llm_calls"] == 12 and out["left"] == 40 - 12
        owners = await kernel.store.owners()
        rows = {r.pid: r for r in await kernel.ps(all=True)}
        kids = [pid for pid, r in rows.items() if r.parent == parent.pid]
        assert len(kids) == 6 and len({owners[pid][1] for pid in kids}) == 2

        boss = await kernel.spawn(ray_programs.parent_of_sleepers, 4)
        await asyncio.sleep(1.5)
        rows = {r.pid: r for r in await kernel.ps(all=True)}
        sleepers = [pid for pid, r in rows.items() if r.parent == boss.pid]
        assert len(sleepers) == 4 and {owners_now[1] for owners_now in
                                       [(await kernel.store.owner(pid)) or (0, "") for pid in sleepers]} \
            == set(kernel.scheduler.nodes)  # type: ignore[attr-defined]
        await boss.kill()
        rows = {r.pid: r for r in await kernel.ps(all=True)}
        assert all(rows[pid].status is ProcessStatus.KILLED for pid in [boss.pid, *sleepers])
    finally:
        await kernel.aclose()


async def test_a_process_moved_off_a_dead_node_waits_for_a_node_with_its_resources(
        cluster: Any, dsn: str, server: ray_programs.CountingServer) -> None:
    """Last in this module: it adds a node to the shared cluster."""
    kernel = await _kernel(cluster, dsn, server.url, head=False)
    try:
        from ringzero.providers.schedulers.ray_cluster import RayScheduler

        scheduler = kernel.scheduler
        assert isinstance(scheduler, RayScheduler)
        boxed = await kernel.spawn(ray_programs.chatter, "needs-sandbox", 40, 0.05, resources={"sandbox": 1})
        assert isinstance(boxed, RemoteProcessHandle)
        sandbox_node = boxed.node
        await asyncio.sleep(0.5)
        os.kill(await scheduler.worker_os_pid(sandbox_node), signal.SIGKILL)
        for _ in range(600):
            if boxed.pid in scheduler.waiting:
                break
            await asyncio.sleep(0.1)
        assert boxed.pid in scheduler.waiting, "it was moved to a node without a sandbox"
        assert all(boxed.pid not in move["to"] for move in scheduler.moves)
        listing = await asyncio.to_thread(subprocess.run, [sys.executable, "-m", "ringzero.cli", "ps", "--db", dsn],
                                          capture_output=True, text=True, timeout=120,
                                          env={**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "200"})
        assert "no live node has sandbox=1" in " ".join(listing.stdout.split()), listing.stdout

        before = set(scheduler.nodes)
        cluster.add_node(num_cpus=2, resources={"sandbox": 1})  # Ray starts a node from the main thread only
        cluster.wait_for_nodes()
        for _ in range(1200):  # the scheduler finds the new node and moves the process there
            if boxed.pid not in scheduler.waiting:
                break
            await asyncio.sleep(0.1)
        assert boxed.pid not in scheduler.waiting
        assert await boxed.wait(120) == [f"echo needs-sandbox:{i}" for i in range(40)]
        assert scheduler.moves[-1]["to"][boxed.pid] not in before, "it runs on the node that joined"
    finally:
        await kernel.aclose()
