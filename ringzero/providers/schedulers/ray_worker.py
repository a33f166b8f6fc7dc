"""NodeWorker: the long-lived Ray actor that hosts one kernel on one node of a cluster.

``RayScheduler`` starts one per node (pinned there). Its kernel is built on the node by the
user's factory (``module:function``: the LLM providers, tools, executor and the shared
PostgreSQL store, configured once in code every node imports) and runs every process placed
on the node in the actor's event loop, as a kernel on one machine runs its processes.

Every method answers with an envelope, ``{"ok": value}`` or ``{"raise": [type, message]}``,
so that the caller re-raises ringzero's own error instead of Ray's wrapper of it.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any

from ringzero.core.contract import errors
from ringzero.core.contract.errors import Fenced, InvalidArgument, ProcessNotFound, RingzeroError
from ringzero.core.contract.outcomes import Failure, exception_of
from ringzero.core.contract.remote import RemoteProcessHandle, SpawnRequest
from ringzero.core.contract.types import JSON, Limits
from ringzero.core.handles import ProcessHandle, process_of
from ringzero.core.support.references import check_program, import_reference
from ringzero.providers.schedulers.ray_nodes import NodeOwner

if TYPE_CHECKING:
    from ringzero.core.kernel import Kernel

__all__ = ["NodeWorker", "snapshot_of", "start_node_worker", "unwrap"]

Envelope = dict[str, Any]
_PEER_RETRIES = 60
"""How many times a node asks again for a process that is being moved (about 45 s in all)."""


def snapshot_of(handle: ProcessHandle, node: str) -> dict[str, Any]:
    """What a remote handle knows of a process: its record as JSON, and where it runs."""
    process = process_of(handle)
    process.snapshot()
    return {**process.record.to_json(), "node": node, "fenced": process.fenced is not None}


async def _enveloped(call: Awaitable[Any]) -> Envelope:
    try:
        return {"ok": await call}
    except RingzeroError as exc:
        return {"raise": [type(exc).__name__, str(exc)]}
    except TimeoutError as exc:
        return {"raise": ["TimeoutError", str(exc)]}


def unwrap(answer: Mapping[str, Any]) -> Any:
    """The value of a NodeWorker envelope, or ringzero's own error raised here."""
    if "raise" not in answer:
        return answer["ok"]
    kind, message = answer["raise"]
    if kind == "TimeoutError":
        raise TimeoutError(message)
    raised = exception_of(Failure(kind, message))
    if isinstance(raised, errors.RingzeroError) and type(raised) not in (
            errors.ProcessFailed, errors.BudgetExceeded, errors.RateLimited, errors.ToolFailed, errors.MissingExtra,
            errors.ProcessNotFound):
        raise raised
    raise errors.RingzeroError(f"{kind}: {message}")


class NodeWorker:
    """One node's kernel, reachable through Ray (see the module docstring)."""

    def __init__(self, factory: str, factory_args: Mapping[str, JSON], node: str,
                 gates: Mapping[str, str] | None = None, namespace: str | None = None) -> None:
        self.node = node
        self._gates = dict(gates or {})
        """Provider name -> name of the cluster gate actor its gate takes permits from."""
        self._namespace = namespace
        self._factory = factory
        self._factory_args = dict(factory_args)
        self._kernel: Kernel | None = None
        self._starting: asyncio.Lock | None = None
        self._peers: list[str] = [node]

    async def _get_kernel(self) -> Kernel:
        if self._kernel is None:
            if self._starting is None:
                self._starting = asyncio.Lock()
            async with self._starting:
                if self._kernel is None:
                    from ringzero.core.kernel import Kernel

                    factory: Callable[..., Kernel] = import_reference(self._factory, "the node kernel factory")
                    kernel = factory(**self._factory_args)
                    if not isinstance(kernel, Kernel):
                        raise InvalidArgument(f"{self._factory} returned {kernel!r}, not a ringzero Kernel")
                    kernel.join_cluster(self.node)
                    self._join_cluster_gates(kernel)
                    await kernel.start()
                    self._kernel = kernel
        return self._kernel

    def _join_cluster_gates(self, kernel: Kernel) -> None:
        if not self._gates:
            return
        import ray

        from ringzero.providers.schedulers.ray_gate import ClusterPermits

        for provider, actor_name in self._gates.items():
            gate = kernel.gate(provider)  # a call waiting past the gate's own bound goes first cluster-wide too
            gate.share_permits(ClusterPermits(ray.get_actor(actor_name, namespace=self._namespace),
                                              starvation_after=gate.starvation_after))

    # ----------------------------------------------------------------- calls
    async def hello(self) -> Envelope:
        """Build the kernel (so a bad factory fails at start-up) and say where this worker is."""
        async def go() -> dict[str, Any]:
            kernel = await self._get_kernel()
            return {"node": self.node, "os_pid": os.getpid(), "live": len(kernel.runtime.procs)}

        return await _enveloped(go())

    async def spawn(self, program: str, args: list[JSON], name: str, priority: int,
                    limits: dict[str, Any], parent: int | None = None) -> Envelope:
        """Start a process here: a top-level one, or the child of ``parent`` on another node."""
        async def go() -> dict[str, Any]:
            kernel = await self._get_kernel()
            target = import_reference(program, "the program")
            if parent is None:
                handle = await kernel.spawn(target, *args, name=name, priority=priority,
                                            limits=Limits.from_dict(limits))
            else:
                runtime = kernel.runtime
                check_program(target, args)
                handle = ProcessHandle(runtime, await runtime.spawn_process(
                    target, args, name=name, priority=priority, limits=Limits.from_dict(limits), parent=None,
                    remote_parent=parent))
            assert isinstance(handle, ProcessHandle)  # a node's own kernel schedules locally
            return {**snapshot_of(handle, self.node), "live": len(kernel.runtime.procs)}

        return await _enveloped(go())

    async def wait_for(self, pid: int, timeout: float | None) -> Envelope:
        async def go() -> dict[str, Any]:
            handle = await (await self._get_kernel()).handle(pid)
            try:
                await handle.wait(timeout)
            except Fenced:
                pass  # the snapshot says so: the caller asks the new owner
            except RingzeroError:
                pass  # failed or killed: the snapshot carries it, the caller raises it
            return snapshot_of(handle, self.node)

        return await _enveloped(go())

    async def _act(self, pid: int, action: Callable[[ProcessHandle], Awaitable[None]]) -> Envelope:
        async def go() -> dict[str, Any]:
            handle = await (await self._get_kernel()).handle(pid)
            await action(handle)
            return snapshot_of(handle, self.node)

        return await _enveloped(go())

    async def pause(self, pid: int) -> Envelope:
        return await self._act(pid, lambda h: h.pause())

    async def resume(self, pid: int) -> Envelope:
        return await self._act(pid, lambda h: h.resume())

    async def kill(self, pid: int) -> Envelope:
        return await self._act(pid, lambda h: h.kill())

    async def send(self, pid: int, message: JSON, priority: int) -> Envelope:
        return await self._act(pid, lambda h: h.send(message, priority=priority))

    async def snapshot(self, pid: int) -> Envelope:
        async def nothing(handle: ProcessHandle) -> None:
            return None

        return await self._act(pid, nothing)

    async def adopt(self, pids: list[int], from_node: str) -> Envelope:
        """Take over these processes of dead node ``from_node``: each resumed from its journal
        here, if this node wins its ownership claim (another node may have won it)."""
        async def go() -> list[int]:
            handles = await (await self._get_kernel()).recover(pids=pids, from_node=from_node)
            return [h.pid for h in handles]

        return await _enveloped(go())

    async def set_peers(self, nodes: list[str], spread_children: bool) -> Envelope:
        """The cluster's live nodes (after a start or a failover); with ``spread_children``, the
        children of processes here are placed over them in turn (this node included)."""
        async def go() -> None:
            kernel = await self._get_kernel()
            self._peers = list(nodes)
            kernel.place_children(_PeerPlacement(self) if spread_children else None)

        return await _enveloped(go())

    def _peer(self, node: str) -> Any:
        import ray

        return ray.get_actor(f"ringzero-node-{node}", namespace=self._namespace)

    async def watch(self) -> None:
        """Never answers: the caller learns of this worker's death when the call fails."""
        await asyncio.Event().wait()

    async def shutdown(self) -> Envelope:
        """Stop the kernel as a host shutdown would (its processes stay resumable)."""
        async def go() -> None:
            if self._kernel is not None:
                await self._kernel.aclose()

        return await _enveloped(go())


def start_node_worker(node_id: str, name: str, factory: str, factory_args: Mapping[str, JSON],
                      gates: Mapping[str, str], namespace: str) -> Any:
    """Start the ``NodeWorker`` actor of node ``name`` (pinned to it): the handle."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    worker_class: Any = ray.remote(NodeWorker)
    return worker_class.options(
        name=f"ringzero-node-{name}", namespace=namespace, num_cpus=0, max_concurrency=100_000,
        max_restarts=0, scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False),
    ).remote(factory, dict(factory_args), name, dict(gates), namespace)


class _PeerPlacement:
    """``ChildPlacement`` on a node: children go to the live nodes in turn, this one included;
    their handles reach them through the node that owns them in the shared store."""

    def __init__(self, worker: NodeWorker) -> None:
        self._worker = worker
        self._turn = 0

    async def place_child(self, request: SpawnRequest, parent: int) -> RemoteProcessHandle | None:
        from ray.exceptions import RayActorError

        peers = self._worker._peers
        self._turn += 1
        node = peers[self._turn % len(peers)] if peers else self._worker.node
        if node == self._worker.node:
            return None
        try:
            answer = await self._worker._peer(node).spawn.remote(
                request.program, request.args, request.name, request.priority, request.limits.to_dict(), parent)
        except (RayActorError, ValueError):  # that node is gone (ValueError: its actor name is)
            return None
        return RemoteProcessHandle(self, unwrap(answer))

    def owner_of(self, pid: int) -> _PeerOwner:
        return _PeerOwner(self._worker)


class _PeerOwner(NodeOwner):
    """``ProcessOwner`` from a node: each call goes to the node the store names as the owner,
    waiting out a failover in progress (the driver's scheduler moves processes off dead nodes)."""

    def __init__(self, worker: NodeWorker) -> None:
        super().__init__(self._at_owner)
        self._worker = worker

    async def _at_owner(self, pid: int, method: str, *args: Any) -> dict[str, Any]:
        from ray.exceptions import RayActorError

        kernel = await self._worker._get_kernel()
        for attempt in range(_PEER_RETRIES):
            owner = await kernel.store.owner(pid)
            if owner is None:
                raise ProcessNotFound(pid)
            try:
                answer = await getattr(self._worker._peer(owner[1]), method).remote(pid, *args)
            except (RayActorError, ValueError):
                answer = {"raise": ["ProcessNotFound", "its node is gone"]}
            if ("raise" in answer and answer["raise"][0] == "ProcessNotFound") or answer.get("ok", {}).get("fenced"):
                await asyncio.sleep(min(1.0, 0.05 * (attempt + 1)))  # moved, or being moved: ask the store again
                continue
            result: dict[str, Any] = unwrap(answer)
            return result
        raise ProcessNotFound(pid)

