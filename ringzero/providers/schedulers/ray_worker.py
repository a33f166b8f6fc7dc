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

from ringzero.core.errors import Fenced, InvalidArgument, RingzeroError
from ringzero.core.references import import_reference
from ringzero.core.types import JSON, Limits

if TYPE_CHECKING:
    from ringzero.core.kernel import Kernel, ProcessHandle

__all__ = ["NodeWorker", "snapshot_of"]

Envelope = dict[str, Any]


def snapshot_of(handle: ProcessHandle, node: str) -> dict[str, Any]:
    """What a remote handle knows of a process: its record as JSON, and where it runs."""
    process = handle._process
    process.snapshot()
    return {**process.record.to_json(), "node": node, "fenced": process.fenced is not None}


async def _enveloped(call: Awaitable[Any]) -> Envelope:
    try:
        return {"ok": await call}
    except RingzeroError as exc:
        return {"raise": [type(exc).__name__, str(exc)]}
    except TimeoutError as exc:
        return {"raise": ["TimeoutError", str(exc)]}


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
                    kernel.node = self.node
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
            kernel.gate(provider).permits = ClusterPermits(ray.get_actor(actor_name, namespace=self._namespace))

    # ----------------------------------------------------------------- calls
    async def hello(self) -> Envelope:
        """Build the kernel (so a bad factory fails at start-up) and say where this worker is."""
        async def go() -> dict[str, Any]:
            kernel = await self._get_kernel()
            return {"node": self.node, "os_pid": os.getpid(), "live": len(kernel._procs)}

        return await _enveloped(go())

    async def spawn(self, program: str, args: list[JSON], name: str, priority: int,
                    limits: dict[str, Any]) -> Envelope:
        async def go() -> dict[str, Any]:
            from ringzero.core.kernel import ProcessHandle

            kernel = await self._get_kernel()
            target = import_reference(program, "the program")
            handle = await kernel.spawn(target, *args, name=name, priority=priority, limits=Limits.from_dict(limits))
            assert isinstance(handle, ProcessHandle)  # a node's own kernel schedules locally
            return {**snapshot_of(handle, self.node), "live": len(kernel._procs)}

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

    async def watch(self) -> None:
        """Never answers: the caller learns of this worker's death when the call fails."""
        await asyncio.Event().wait()

    async def shutdown(self) -> Envelope:
        """Stop the kernel as a host shutdown would (its processes stay resumable)."""
        async def go() -> None:
            if self._kernel is not None:
                await self._kernel.aclose()

        return await _enveloped(go())
