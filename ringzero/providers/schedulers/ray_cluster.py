"""RayScheduler: processes placed on the nodes of a Ray cluster, sharing one PostgreSQL store.

    scheduler = RayScheduler("myapp.cluster:node_kernel", {"dsn": DSN}, address="auto")
    async with Kernel(scheduler=scheduler, checkpointer=PostgresCheckpointer(DSN)) as kernel:
        p = await kernel.spawn(agent, "task", resources={"CPU": 1})   # runs on some node
        print(p.node, await p.wait())

One ``NodeWorker`` actor per node hosts a kernel built there by your factory (``module:function``
returning a Kernel bound to the shared store); a process runs in that kernel's event loop,
among many. Placement picks a node whose Ray resources (``CPU``, ``GPU``, custom ones such as
a node with the process sandbox) have room for what the spawn asks, and among those the least
loaded. When a worker dies (its process, or its node's raylet) its unfinished processes are
resumed on the surviving nodes from their journals; ownership epochs claimed in the store and
fenced journal writes make sure only one node ever runs and records a process.

Ray is the engine: actors, their placement, their death notices. Nothing here opens a socket.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ringzero.core.contract.errors import InvalidArgument, MissingExtra, ProcessNotFound, ProcessStateError
from ringzero.core.contract.protocols import SchedulerCapabilities
from ringzero.core.contract.remote import RemoteProcessHandle, SpawnRequest
from ringzero.core.contract.types import JSON
from ringzero.core.support.gate import RateLimit
from ringzero.providers.schedulers import ray_nodes
from ringzero.providers.schedulers.local import LocalScheduler
from ringzero.providers.schedulers.ray_gate import start_cluster_gate
from ringzero.providers.schedulers.ray_nodes import Node, NodeOwner
from ringzero.providers.schedulers.ray_worker import start_node_worker
from ringzero.providers.schedulers.ray_worker import unwrap as _unwrap

try:
    import ray
    from ray.exceptions import RayActorError
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise MissingExtra("RayScheduler", "ray") from exc

if TYPE_CHECKING:
    from ringzero.core.contract.store import KernelStore
    from ringzero.core.kernel import Kernel

__all__ = ["RayScheduler"]

log = logging.getLogger(__name__)
_RETRIES = 40
NODE_SCAN = 2.0
"""Seconds between looks for a new node while processes wait for one that can host them."""


class RayScheduler:
    """A Scheduler that also places processes on a Ray cluster (``ringzero.core.contract.remote.Placement``).

    ``kernel`` names the factory every node calls to build its kernel (``module:function``, called
    with ``kernel_args``); it must use the same shared store (PostgreSQL) as the kernel this
    scheduler is given to. ``address`` and ``runtime_env`` go to ``ray.init`` when this process
    is not connected to Ray yet. ``head=False`` keeps processes off the head node; ``require``
    keeps them to nodes that have these resources. ``rate_limits`` sets, per provider name, one
    limit for the whole cluster (see ``ray_gate``). ``children="spread"`` places the children a
    process spawns over the nodes too (default ``"local"``: with their parent).
    """

    capabilities = SchedulerCapabilities(priorities=True, distributed=True)

    def __init__(self, kernel: str, kernel_args: Mapping[str, JSON] | None = None, *, address: str | None = None,
                 runtime_env: Mapping[str, Any] | None = None, head: bool = True,
                 namespace: str = "ringzero", rate_limits: Mapping[str, RateLimit] | None = None,
                 require: Mapping[str, float] | None = None, children: str = "local") -> None:
        if not isinstance(kernel, str) or ":" not in kernel:
            raise InvalidArgument(f"kernel must be a 'module:function' factory reference, not {kernel!r}")
        self.kernel_factory = kernel
        self.kernel_args = dict(kernel_args or {})
        self.address = address
        self.runtime_env = dict(runtime_env or {})
        self.head = head
        if children not in ("local", "spread"):
            raise InvalidArgument(f"children must be 'local' or 'spread', not {children!r}")
        self.children = children
        """``local``: a child runs on its parent's node (and moves with it); ``spread``: children
        go to the live nodes in turn, the parent's included."""
        self.require = {str(k): float(v) for k, v in (require or {}).items()}
        """Only nodes with these Ray resources host a worker (e.g. ``{"agents": 1}``)."""
        self.namespace = namespace
        for provider, limit in (rate_limits or {}).items():
            if not isinstance(limit, RateLimit):
                raise InvalidArgument(f"rate_limits[{provider!r}] must be a ringzero.RateLimit, not {limit!r}")
        self.rate_limits = dict(rate_limits or {})
        """Per provider name: one limit for the whole cluster, held by a ``ClusterGate`` actor."""
        self.gates: dict[str, Any] = {}
        """The cluster gate actors, by provider name (``await gates[name].stats.remote()``)."""
        self.moves: list[dict[str, Any]] = []
        """One entry per node taken over: ``{"from": node, "to": {pid: node}}``."""
        self._local = LocalScheduler()  # slots for any process the driver's own kernel runs
        self._store: KernelStore | None = None
        self._nodes: dict[str, Node] = {}
        self._where: dict[int, str] = {}
        self._reservations: dict[int, dict[str, float]] = {}
        self._gone: set[str] = set()
        self.waiting: dict[int, tuple[str, dict[str, float]]] = {}
        """Processes of a dead node that no live node has the resources for: pid -> (the dead
        node, what they need). They move once a node that has it joins."""
        self._scanner: asyncio.Future[None] | None = None
        self._started = False
        self._start_lock = asyncio.Lock()
        self._failover_lock = asyncio.Lock()
        self._freed = asyncio.Condition()
        self._watchers: set[asyncio.Task[Any]] = set()
        self._inited_ray = False

    # ---------------------------------------------------------- Scheduler
    async def acquire(self, pid: int, priority: int) -> None:
        await self._local.acquire(pid, priority)

    def release(self, pid: int) -> None:
        self._local.release(pid)

    def should_yield(self, pid: int, priority: int) -> bool:
        return self._local.should_yield(pid, priority)

    # ---------------------------------------------------------- Placement
    def attach(self, kernel: Kernel) -> None:
        """Called by the Kernel this scheduler serves: its store is the cluster's shared one."""
        if not kernel.checkpointer.capabilities.multi_process or not kernel.checkpointer.capabilities.claims:
            raise InvalidArgument(f"RayScheduler needs a store every node shares, with claims (PostgresCheckpointer), "
                                  f"not {type(kernel.checkpointer).__name__}")
        self._store = kernel.store

    @property
    def nodes(self) -> dict[str, int]:
        """Live nodes by name, with how many processes each was given."""
        return {name: node.load for name, node in self._nodes.items()}

    async def start(self) -> None:
        """Connect to Ray and start a worker on every live node (done by the first spawn)."""
        async with self._start_lock:
            if self._started:
                return
            if not ray.is_initialized():
                ray.init(address=self.address, runtime_env=self.runtime_env or None, namespace=self.namespace,
                         log_to_driver=False, configure_logging=False)
                self._inited_ray = True
            self._started = True
            for provider, limit in self.rate_limits.items():
                self.gates[provider] = start_cluster_gate(provider, limit, self.namespace)
            await self._discover()

    async def _discover(self) -> None:
        for info in ray.nodes():  # type: ignore[no-untyped-call]
            found = ray_nodes.may_host(info, head=self.head, require=self.require)
            if found is None or found[0] in self._nodes or found[0] in self._gone:
                continue
            name, node_id, resources = found
            actor = start_node_worker(node_id, name, self.kernel_factory, self.kernel_args,
                                      {p: f"ringzero-gate-{p}" for p in self.rate_limits}, self.namespace)
            hello = _unwrap(await actor.hello.remote())
            node = Node(node_id, name, actor, resources, load=int(hello["live"]), os_pid=int(hello["os_pid"]))
            node.watched_by(asyncio.ensure_future(self._watch(node)))
            self._nodes[name] = node
        if not self._nodes:
            raise ProcessStateError("the Ray cluster has no live node that may run processes")
        await self._tell_peers()

    async def _tell_peers(self) -> None:
        """Give every worker the list of live nodes (where it may place children)."""
        names = sorted(self._nodes)
        for node in list(self._nodes.values()):
            with contextlib.suppress(RayActorError):
                _unwrap(await node.worker.set_peers.remote(names, self.children == "spread"))

    async def _watch(self, node: Node) -> None:
        try:
            await node.worker.watch.remote()
        except RayActorError:
            log.warning("ringzero node %s is gone; moving its processes", node.name)
            await self._failover(node.name)

    async def place(self, request: SpawnRequest) -> RemoteProcessHandle:
        await self.start()
        wanted = {k: float(v) for k, v in request.resources.items() if v}
        while True:
            node = await self._choose(wanted)
            try:
                answer = await node.worker.spawn.remote(request.program, request.args, request.name, request.priority,
                                                        request.limits.to_dict())
            except RayActorError:
                self._unreserve(node, wanted)
                await self._failover(node.name)
                continue
            try:
                snapshot = _unwrap(answer)
            except BaseException:
                self._unreserve(node, wanted)
                raise
            pid = int(snapshot["pid"])
            self._where[pid] = node.name
            if wanted:
                self._reservations[pid] = wanted
                self._watch_end(pid)
                assert self._store is not None
                await self._store.note_placement(pid, wanted)  # what a move to another node must honour
            return RemoteProcessHandle(self, snapshot)

    async def _choose(self, wanted: Mapping[str, float]) -> Node:
        async with self._freed:
            while True:
                if not any(n.fits(wanted, now=False) for n in self._nodes.values()):
                    have = {n.name: n.total for n in self._nodes.values()}
                    raise InvalidArgument(f"no node of the cluster has {dict(wanted)} (nodes: {have})")
                ready = [n for n in self._nodes.values() if n.fits(wanted, now=True)]
                if ready:
                    node = min(ready, key=lambda n: (n.load, n.name))
                    node.take(wanted)
                    return node
                await self._freed.wait()

    def _unreserve(self, node: Node | None, wanted: Mapping[str, float]) -> None:
        if node is not None:
            node.give_back(wanted)

    def _watch_end(self, pid: int) -> None:
        """Give a process's reserved resources back when it ends, wherever it ends."""
        async def watch() -> None:
            try:
                await self._call(pid, "wait_for", None)
            finally:
                wanted = self._reservations.pop(pid, {})
                self._unreserve(self._nodes.get(self._where.get(pid, "")), wanted)
                async with self._freed:
                    self._freed.notify_all()

        task = asyncio.ensure_future(watch())
        self._watchers.add(task)
        task.add_done_callback(self._watchers.discard)
        task.add_done_callback(ray_nodes.quiet)

    def owner_of(self, pid: int) -> NodeOwner:
        return NodeOwner(self._call)

    # ---------------------------------------------------------- routing
    async def _call(self, pid: int, method: str, *args: Any) -> dict[str, Any]:
        """Run a NodeWorker method for ``pid`` on the node that owns it now, following moves."""
        await self.start()
        for attempt in range(_RETRIES):
            node = await self._node_for(pid)
            try:
                answer = await getattr(node.worker, method).remote(pid, *args)
            except RayActorError:
                await self._failover(node.name)
                continue
            if "raise" in answer and answer["raise"][0] == "ProcessNotFound":
                self._where.pop(pid, None)  # moved on, or not taken over yet: ask the store again
                await asyncio.sleep(0.02 * (attempt + 1))
                continue
            snapshot: dict[str, Any] = _unwrap(answer)
            if snapshot.get("fenced"):
                self._where.pop(pid, None)
                continue
            self._where[pid] = node.name
            return snapshot
        raise ProcessNotFound(pid)

    async def _node_for(self, pid: int) -> Node:
        name = self._where.get(pid)
        if name is not None and name in self._nodes:
            return self._nodes[name]
        assert self._store is not None, "RayScheduler is not attached to a Kernel"
        owner = await self._store.owner(pid)
        if owner is None:
            if await self._store.load_process(pid) is None:
                raise ProcessNotFound(pid)
            return min(self._nodes.values(), key=lambda n: n.load)  # any node reads an ended record
        if owner[1] not in self._nodes:  # its node is gone (maybe before this scheduler started)
            await self._failover(owner[1])
            owner = await self._store.owner(pid)
        if owner is not None and owner[1] in self._nodes:
            return self._nodes[owner[1]]
        return min(self._nodes.values(), key=lambda n: n.load)  # ended on a gone node: any node reads it

    # ---------------------------------------------------------- failover
    async def _failover(self, dead: str) -> None:
        """Resume the unfinished processes of node ``dead`` on the surviving nodes."""
        async with self._failover_lock:
            if dead in self._gone:
                return
            self._gone.add(dead)
            gone = self._nodes.pop(dead, None)
            if gone is not None and gone.watch is not None and gone.watch is not asyncio.current_task():
                gone.watch.cancel()
            if not self._nodes:
                raise ProcessStateError(f"node {dead} is gone and no node is left to take its processes")
            assert self._store is not None
            owners = await self._store.owners()
            records = {r.pid: r for r in await self._store.load_processes()}
            moving = {pid for pid, (_, node) in owners.items()
                      if node == dead and pid in records and not records[pid].status.terminal}
            await self._move(dead, moving, records)

    async def _move(self, dead: str, moving: set[int], records: Mapping[int, Any]) -> None:
        """Resume ``moving`` (processes of node ``dead``) on live nodes that have the resources
        each was placed with; those no live node has the resources for wait (``waiting``), and
        the store says why, until a node that has them joins."""
        assert self._store is not None
        placements = await self._store.placements()
        groups = []  # a parent with its children, and the resources they need together
        for group in ray_nodes.trees(moving, {pid: records[pid].parent for pid in moving}):
            wanted: dict[str, float] = {}
            for pid in group:
                needs = self._reservations.get(pid) or (placements.get(pid) or {}).get("resources") or {}
                for k, v in needs.items():
                    wanted[k] = wanted.get(k, 0.0) + float(v)
            groups.append((group, wanted))
        plan, stranded = ray_nodes.place_groups(groups, self._nodes.values())  # survivor -> pids
        for group, wanted in stranded:
            why = f"no live node has {ray_nodes.resources_text(wanted)}"
            for pid in group:
                self.waiting[pid] = (dead, wanted)
                await self._store.note_placement(pid, (placements.get(pid) or {}).get("resources") or {}, why)
            log.warning("ringzero: %d process(es) of node %s wait: %s", len(group), dead, why)
            self._watch_for_nodes()
        if plan:
            await self._adopt_plan(dead, plan, placements)

    async def _adopt_plan(self, dead: str, plan: Mapping[str, list[int]], placements: Mapping[int, Any]) -> None:
        """Have each survivor in ``plan`` take over its processes of ``dead``."""
        assert self._store is not None

        async def adopt(node: Node, pids: list[int]) -> list[int]:
            try:  # one call per survivor, all at once: each waits out the dead node's lease once
                return list(_unwrap(await node.worker.adopt.remote(sorted(pids), dead)))
            except RayActorError:
                return []  # that one died too; its own failover takes these with its processes

        targets = [self._nodes[name] for name in plan]
        taken = await asyncio.gather(*(adopt(node, plan[node.name]) for node in targets))
        moved: dict[int, str] = {}
        for node, pids in zip(targets, taken, strict=True):
            for pid in pids:
                self._where[pid] = node.name
                moved[pid] = node.name
                self.waiting.pop(pid, None)
                if (placements.get(pid) or {}).get("waiting"):
                    await self._store.note_placement(pid, placements[pid].get("resources") or {})
        self.moves.append({"from": dead, "to": moved})
        await self._tell_peers()
        log.warning("ringzero moved %d process(es) off node %s", len(moved), dead)

    def _watch_for_nodes(self) -> None:
        """While processes wait for a node that can host them, look for new nodes every
        ``NODE_SCAN`` seconds and move them there once one joins."""
        if self._scanner is not None and not self._scanner.done():
            return

        async def scan() -> None:
            while self.waiting:
                await asyncio.sleep(NODE_SCAN)
                before = set(self._nodes)
                await self._discover()
                if set(self._nodes) == before:
                    continue
                assert self._store is not None
                records = {r.pid: r for r in await self._store.load_processes()}
                by_node = ray_nodes.still_waiting(self.waiting, records)
                async with self._failover_lock:
                    for dead, pids in by_node.items():
                        await self._move(dead, pids, records)

        self._scanner = asyncio.ensure_future(scan())
        self._watchers.add(self._scanner)
        self._scanner.add_done_callback(self._watchers.discard)
        self._scanner.add_done_callback(ray_nodes.quiet)

    # ---------------------------------------------------------- shutdown
    async def aclose(self) -> None:
        """Stop every node's kernel as a host shutdown would (their processes stay resumable)
        and the workers with them; disconnect from Ray if this scheduler connected."""
        for task in list(self._watchers):
            task.cancel()
        for node in list(self._nodes.values()):
            if node.watch is not None:
                node.watch.cancel()
            with contextlib.suppress(RayActorError):
                await node.worker.shutdown.remote()
            ray.kill(node.worker)
        self._nodes.clear()
        for actor in self.gates.values():
            ray.kill(actor)
        self.gates.clear()
        if self._inited_ray:
            ray.shutdown()
            self._inited_ray = False

    async def worker_os_pid(self, node: str) -> int:
        """The OS pid of the worker process on ``node`` (what a test kills to take a node down)."""
        return self._nodes[node].os_pid
