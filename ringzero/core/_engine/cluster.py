"""A kernel's part in a cluster: where its processes may go, and what it owns.

On one machine there is nothing here: ``node`` is None, no placement. A kernel built by a cluster
worker has a ``node``: it claims ownership of its processes in the store (an epoch), so another
node can take them over, and it may place children on other nodes (``child_placement``, set by
the worker as the cluster's live nodes change). A kernel whose scheduler is distributed
(``placement``) places its top-level processes on the cluster's nodes.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ringzero.core.contract.errors import InvalidArgument
from ringzero.core.contract.remote import ChildPlacement, Placement, RemoteProcessHandle, SpawnRequest
from ringzero.core.contract.store import KernelStore
from ringzero.core.contract.types import JSON, Limits, Program
from ringzero.core.support.references import import_reference, importable_reference, reference_of
from ringzero.core.support.timeouts import retrieved

__all__ = ["Cluster"]


class Cluster:
    """The cluster settings of one kernel, and the watches on its children on other nodes."""

    def __init__(self, store: KernelStore, *, placement: Placement | None = None, node: str | None = None,
                 child_placement: ChildPlacement | None = None) -> None:
        if node is not None and (not isinstance(node, str) or not node):
            raise InvalidArgument(f"node is the name of a cluster node, a non-empty string, not {node!r}")
        self.store = store
        self.placement = placement
        """Where new top-level processes go when the scheduler spans machines."""
        self.node = node
        """The cluster node this kernel runs on (None on one machine)."""
        self.child_placement = child_placement
        """Where children spawned here may go instead of this kernel (None: with their parent)."""
        self._watches: set[asyncio.Task[None]] = set()

    def place_children(self, placement: ChildPlacement | None) -> None:
        """Let children spawned here go to other nodes (``placement``), or keep them here (None)."""
        self.child_placement = placement

    @property
    def ownership(self) -> tuple[int, str] | None:
        """The ownership a new process of this kernel's is created with: (epoch 1, node)."""
        return None if self.node is None else (1, self.node)

    async def place(self, program: Program, args: Sequence[JSON], *, name: str | None, priority: int,
                    limits: Limits, resources: Mapping[str, float]) -> RemoteProcessHandle:
        """Start a top-level process on a node that has ``resources`` free."""
        assert self.placement is not None
        reference = importable_reference(program)
        if reference is None or _imported(reference) is not program:
            raise InvalidArgument(f"a process placed on another machine is started by reference, and "
                                  f"{reference_of(program)!r} does not import back to it: define it at the top "
                                  "level of an importable module (not in __main__ or a function)")
        for key, amount in resources.items():
            if not isinstance(key, str) or isinstance(amount, bool) or not isinstance(amount, (int, float)) \
                    or not amount >= 0:
                raise InvalidArgument(f"resources maps names to non-negative amounts, got {key!r}: {amount!r}")
        request = SpawnRequest(program=reference, args=list(args), name=name or program.__name__,
                               priority=priority, limits=limits, resources=dict(resources))
        return await self.placement.place(request)

    async def remote_handle(self, pid: int) -> RemoteProcessHandle | None:
        """The handle of ``pid`` on another node, where this kernel places children there."""
        if self.child_placement is None:
            return None
        return await RemoteProcessHandle(self.child_placement, {"pid": pid, "name": "", "status": "created",
                                                                "program": ""}).refresh()

    def when_ended(self, child: RemoteProcessHandle, then: Callable[[Mapping[str, Any]], None]) -> None:
        """Follow ``child``, on another node (on the node that takes it over, if it moves), and
        call ``then`` with how it ended (``RemoteProcessHandle.ended``) when it does."""

        async def follow() -> None:
            then(await child.ended())

        watch = asyncio.ensure_future(follow())
        self._watches.add(watch)
        watch.add_done_callback(self._watches.discard)
        watch.add_done_callback(retrieved)

    async def take_over(self, pid: int, from_node: str | None) -> tuple[int, str] | None:
        """Claim the next ownership epoch of ``pid`` for this node: (epoch, node), or None when
        another node claimed it first, or (with ``from_node``) took it from that node."""
        assert self.node is not None
        current = await self.store.owner(pid)
        if from_node is not None and (current is None or current[1] != from_node):
            return None
        epoch = (current[0] if current else 0) + 1
        return (epoch, self.node) if await self.store.claim_owner(pid, epoch, self.node) else None

    async def claim_wake(self, pid: int, host: str, epoch: int) -> tuple[int, str] | None:
        """Kernels sharing a store: take ``pid`` for ``host`` (this kernel's host id, or its node)
        before it runs again, as owner ``epoch + 1`` where ``epoch`` is the owner the waker saw
        (0: none yet). Of kernels
        racing to wake it from what they saw, one gets ``(epoch + 1, host)``; the others, and a
        kernel whose view is stale (someone took it since), get None and leave it alone."""
        return (epoch + 1, host) if await self.store.claim_owner(pid, epoch + 1, host) else None

    def stop_watching(self) -> None:
        """Stop following remote children (the kernel shuts down; their refunds are not due)."""
        for watch in list(self._watches):
            watch.cancel()

    async def aclose(self) -> None:
        """Close the placement: stop the nodes' kernels as a host shutdown would."""
        if self.placement is not None:
            await self.placement.aclose()


def _imported(reference: str) -> Any:
    try:
        return import_reference(reference, "the program")
    except InvalidArgument:
        return None
