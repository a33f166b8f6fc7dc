"""The nodes of a Ray cluster as ``RayScheduler`` sees them, and where processes go among them."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ringzero.core.contract.types import JSON

__all__ = ["Node", "NodeOwner", "may_host", "place_groups", "quiet", "resources_text", "still_waiting", "trees"]

log = logging.getLogger("ringzero.providers.schedulers.ray_cluster")

HEAD_RESOURCE = "node:__internal_head__"
"""The resource Ray gives the head node only."""


@dataclass
class Node:
    """One node of the cluster and the worker that hosts its kernel."""

    node_id: str
    name: str
    worker: Any
    total: dict[str, float]
    reserved: dict[str, float] = field(default_factory=dict)
    load: int = 0
    os_pid: int = 0
    watch: asyncio.Task[None] | None = None

    def watched_by(self, task: asyncio.Task[None]) -> None:
        """The task that watches the node's worker for its end."""
        self.watch = task

    def fits(self, wanted: Mapping[str, float], *, now: bool) -> bool:
        """Whether the node has ``wanted`` (``now``: free now, beside what it reserved)."""
        return all(self.total.get(k, 0.0) - (self.reserved.get(k, 0.0) if now else 0.0) >= v - 1e-9
                   for k, v in wanted.items())

    def take(self, wanted: Mapping[str, float], processes: int = 1) -> None:
        """Reserve ``wanted`` for ``processes`` more processes."""
        self.load += processes
        for k, v in wanted.items():
            self.reserved[k] = self.reserved.get(k, 0.0) + v

    def give_back(self, wanted: Mapping[str, float]) -> None:
        """One process fewer, and what it reserved."""
        self.load = max(0, self.load - 1)
        for k, v in wanted.items():
            self.reserved[k] = max(0.0, self.reserved.get(k, 0.0) - v)


class NodeOwner:
    """``ProcessOwner`` for processes on the cluster: each call goes through ``call(pid, method,
    *args)`` to the node that runs the process now."""

    def __init__(self, call: Callable[..., Awaitable[dict[str, Any]]]) -> None:
        self._call = call

    async def wait_for(self, pid: int, timeout: float | None) -> dict[str, Any]:
        return await self._call(pid, "wait_for", timeout)

    async def pause(self, pid: int) -> dict[str, Any]:
        return await self._call(pid, "pause")

    async def resume(self, pid: int) -> dict[str, Any]:
        return await self._call(pid, "resume")

    async def kill(self, pid: int) -> dict[str, Any]:
        return await self._call(pid, "kill")

    async def send(self, pid: int, message: JSON, priority: int) -> dict[str, Any]:
        return await self._call(pid, "send", message, priority)

    async def snapshot(self, pid: int) -> dict[str, Any]:
        return await self._call(pid, "snapshot")


def place_groups(groups: Iterable[tuple[list[int], dict[str, float]]], nodes: Iterable[Node],
                 ) -> tuple[dict[str, list[int]], list[tuple[list[int], dict[str, float]]]]:
    """Each group of processes (a parent with its children, and what they need together) on the
    least loaded node that has the resources, free now if any such node has them free; the
    plan (node name -> pids), and the groups no node has the resources for."""
    live = list(nodes)
    plan: dict[str, list[int]] = {}
    stranded = []
    for group, wanted in groups:
        able = [n for n in live if n.fits(wanted, now=False)]
        if not able:
            stranded.append((group, wanted))
            continue
        target = min([n for n in able if n.fits(wanted, now=True)] or able, key=lambda n: (n.load, n.name))
        target.take(wanted, len(group))
        plan.setdefault(target.name, []).extend(group)
    return plan, stranded


def resources_text(wanted: Mapping[str, float]) -> str:
    return ", ".join(f"{k}={v:g}" for k, v in sorted(wanted.items())) or "nothing"


def trees(pids: set[int], parents: Mapping[int, int | None]) -> list[list[int]]:
    """``pids`` grouped by their topmost ancestor within ``pids``: a parent moves with its children."""
    def root(pid: int) -> int:
        parent = parents.get(pid)
        while parent is not None and parent in pids:
            pid, parent = parent, parents.get(parent)
        return pid

    groups: dict[int, list[int]] = {}
    for pid in sorted(pids):
        groups.setdefault(root(pid), []).append(pid)
    return list(groups.values())


def may_host(info: Mapping[str, Any], *, head: bool, require: Mapping[str, float],
             ) -> tuple[str, str, dict[str, float]] | None:
    """(name, node id, resources) of a node ``ray.nodes()`` lists, where it is alive and may host
    a worker (the head only with ``head``; only nodes that have ``require``); else None."""
    node_id = str(info["NodeID"])
    resources = {str(k): float(v) for k, v in dict(info.get("Resources") or {}).items()}
    if not info.get("Alive") or (not head and HEAD_RESOURCE in resources):
        return None
    if any(resources.get(k, 0.0) < v for k, v in require.items()):
        return None
    return node_id[:12], node_id, resources


def quiet(task: asyncio.Task[Any]) -> None:
    """A done callback for a watcher task: its failure is logged (debug), not raised."""
    if not task.cancelled() and task.exception() is not None:
        log.debug("ringzero: a watcher ended with %r", task.exception())


def still_waiting(waiting: dict[int, tuple[str, dict[str, float]]], records: Mapping[int, Any]) -> dict[str, set[int]]:
    """The processes in ``waiting`` (pid -> the dead node they come from, what they need) that
    have not ended, by dead node; those that ended leave ``waiting``."""
    by_node: dict[str, set[int]] = {}
    for pid, (dead, _) in list(waiting.items()):
        if pid in records and not records[pid].status.terminal:
            by_node.setdefault(dead, set()).add(pid)
        else:
            waiting.pop(pid, None)
    return by_node
