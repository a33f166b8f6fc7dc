"""``ctx.memory``: a process's view of long-term memory, each call a journaled syscall, so
that a resumed program is served the same recalls and searches it saw before its crash."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ringzero.core._engine.syscall import syscall
from ringzero.core.contract.outcomes import Outcome, Value
from ringzero.core.contract.types import JSON
from ringzero.core.support.memory import Memory, MemoryStore, check_memory_name

if TYPE_CHECKING:
    from ringzero.core._engine.process import Process

__all__ = ["ProcessMemory"]


class ProcessMemory:
    """``ctx.memory``: a process's view of long-term memory, one namespace at a time.

    The default namespace is the process's name, so the runs of one agent share what they
    remember; ``ctx.memory.namespace("team")`` is another namespace, shared by every process
    that names it. Each call is a journaled syscall.
    """

    def __init__(self, process: Process, namespace: str) -> None:
        check_memory_name("namespace", namespace)
        self._process = process
        self.name = namespace

    def namespace(self, name: str) -> ProcessMemory:
        return ProcessMemory(self._process, name)

    async def remember(self, key: str, value: JSON) -> None:
        await self._call("remember", {"key": key, "value": value}, lambda s: s.put(self.name, key, value))

    async def recall(self, key: str) -> JSON:
        """The value remembered under ``key``, or None."""
        async def get(store: MemoryStore) -> JSON:
            memory = await store.get(self.name, key)
            return None if memory is None else memory.value

        return await self._call("recall", {"key": key}, get)

    async def search(self, query: str, limit: int = 5) -> list[Memory]:
        async def found(store: MemoryStore) -> JSON:
            return [m.to_dict() for m in await store.search(self.name, query, limit)]

        rows: Any = await self._call("search", {"query": query, "limit": limit}, found)
        return [Memory.from_dict(row) for row in rows]

    async def forget(self, key: str) -> bool:
        return bool(await self._call("forget", {"key": key}, lambda s: s.delete(self.name, key)))

    async def _call(self, op: str, args: dict[str, JSON], work: Callable[[MemoryStore], Any]) -> JSON:
        store = self._process.runtime.memory

        async def live() -> Outcome:
            result = await work(store)
            return Value(result.to_dict() if isinstance(result, Memory) else result)

        outcome = await syscall(self._process, "memory", {"op": op, "namespace": self.name, **args},
                                f"{op} in {self.name}", live)
        return outcome.value if isinstance(outcome, Value) else None
