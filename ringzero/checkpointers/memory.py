"""MemoryCheckpointer: the protocol in dicts. Fast, shared within one process, not durable.

Records are kept by thread, then namespace, so reading a thread touches only that thread;
long-term memory has a BM25 index per namespace (``memory_index()``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import replace

from ringzero.checkpointers._filters import matches
from ringzero.core.contract.protocols import CheckpointerCapabilities
from ringzero.core.contract.types import JSON, NO_METADATA, Checkpoint, PendingWrite
from ringzero.core.support.memory import Memory, in_namespace, scored
from ringzero.core.support.ranking import Bm25Index

__all__ = ["MemoryCheckpointer"]


class MemoryCheckpointer:
    """Keeps every checkpoint in memory; everything is lost with the process."""

    capabilities = CheckpointerCapabilities(durable=False, multi_process=False, delete_checkpoints=True, claims=True,
                                          put_many=True)

    def __init__(self) -> None:
        self._threads: dict[str, dict[str, dict[str, Checkpoint]]] = {}
        self._writes: dict[tuple[str, str, str], dict[tuple[str, int], PendingWrite]] = {}
        self._memories = _InProcessMemoryIndex()

    def memory_index(self) -> _InProcessMemoryIndex:
        """Long-term memory, indexed for search (``ringzero.core.support.memory``)."""
        return self._memories

    async def put(self, checkpoint: Checkpoint) -> None:
        stored = checkpoint if checkpoint.metadata is NO_METADATA else Checkpoint(
            # a copy, so that later changes to the caller's metadata do not leak in
            checkpoint.thread_id, checkpoint.namespace, checkpoint.id, checkpoint.payload,
            checkpoint.parent_id, dict(checkpoint.metadata),
        )
        self._threads.setdefault(checkpoint.thread_id, {}).setdefault(checkpoint.namespace, {})[checkpoint.id] = stored

    async def put_many(self, checkpoints: Sequence[Checkpoint]) -> None:
        """``put`` each, in order: this class's ``put`` cannot fail, so none is left half done."""
        for checkpoint in checkpoints:
            await self.put(checkpoint)

    async def claim(self, checkpoint: Checkpoint) -> bool:
        if checkpoint.id in self._threads.get(checkpoint.thread_id, {}).get(checkpoint.namespace, {}):
            return False
        await self.put(checkpoint)
        return True

    async def put_writes(
        self, thread_id: str, namespace: str, checkpoint_id: str, writes: Sequence[PendingWrite]
    ) -> None:
        slot = self._writes.setdefault((thread_id, namespace, checkpoint_id), {})
        for write in writes:
            if write.idx < 0:
                slot[(write.task_id, write.idx)] = write
            else:
                slot.setdefault((write.task_id, write.idx), write)

    def _with_writes(self, cp: Checkpoint) -> Checkpoint:
        writes = self._writes.get((cp.thread_id, cp.namespace, cp.id))
        return cp if not writes else replace(cp, writes=tuple(writes.values()))

    async def get(self, thread_id: str, namespace: str = "", checkpoint_id: str | None = None) -> Checkpoint | None:
        records = self._threads.get(thread_id, {}).get(namespace)
        if not records:
            return None
        cp = records.get(checkpoint_id if checkpoint_id is not None else max(records))
        return None if cp is None else self._with_writes(cp)

    async def list(
        self,
        thread_id: str | None = None,
        namespace: str | None = None,
        *,
        filter: Mapping[str, JSON] | None = None,
        before: str | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[Checkpoint]:
        threads = list(self._threads.items()) if thread_id is None else [(thread_id, self._threads.get(thread_id, {}))]
        found = [
            cp
            for _, namespaces in threads
            for ns, records in list(namespaces.items())
            if namespace is None or ns == namespace
            for cp in list(records.values())
            if (before is None or cp.id < before) and matches(cp.metadata, filter)
        ]
        found.sort(key=lambda cp: (cp.id, cp.thread_id, cp.namespace), reverse=True)
        for cp in found[:limit] if limit is not None else found:
            yield self._with_writes(cp)

    async def delete_thread(self, thread_id: str) -> None:
        self._threads.pop(thread_id, None)
        for wkey in [k for k in self._writes if k[0] == thread_id]:
            del self._writes[wkey]

    async def delete_checkpoints(self, thread_id: str, namespace: str, ids: Sequence[str]) -> None:
        records = self._threads.get(thread_id, {}).get(namespace, {})
        for cid in ids:
            records.pop(cid, None)
            self._writes.pop((thread_id, namespace, cid), None)

    async def aclose(self) -> None:
        return None


class _InProcessMemoryIndex:
    """Long-term memory in dicts, with a BM25 index per namespace (a ``MemoryIndex``)."""

    def __init__(self) -> None:
        self._memories: dict[str, dict[str, Memory]] = {}
        self._indexes: dict[str, Bm25Index[str]] = {}

    async def put(self, namespace: str, key: str, value: JSON, indexed_words: str, now: float) -> Memory:
        previous = self._memories.get(namespace, {}).get(key)
        memory = Memory(namespace, key, value, previous.created_at if previous else now, now)
        self._memories.setdefault(namespace, {})[key] = memory
        self._indexes.setdefault(namespace, Bm25Index()).add(key, indexed_words)
        return memory

    async def get(self, namespace: str, key: str) -> Memory | None:
        return self._memories.get(namespace, {}).get(key)

    async def delete(self, namespace: str, key: str) -> bool:
        memories = self._memories.get(namespace, {})
        if memories.pop(key, None) is None:
            return False
        self._indexes[namespace].remove(key)
        if not memories:
            del self._memories[namespace], self._indexes[namespace]
        return True

    def _names(self, namespace: str, prefix: bool) -> list[str]:
        if not prefix:
            return [namespace] if namespace in self._memories else []
        return [name for name in self._memories if in_namespace(name, namespace, True)]

    async def items(self, namespace: str, *, prefix: bool = False) -> list[Memory]:
        found = [m for name in self._names(namespace, prefix) for m in self._memories[name].values()]
        return sorted(found, key=lambda m: -m.updated_at)

    async def namespaces(self) -> list[str]:
        return sorted(self._memories)

    async def search(self, namespace: str, query_words: Sequence[str], limit: int | None, *,
                     prefix: bool = False) -> list[Memory]:
        query = " ".join(query_words)
        found = [scored(self._memories[name][key], score) for name in self._names(namespace, prefix)
                 for key, score in self._indexes[name].scores(query).items()]
        found.sort(key=lambda m: -(m.score or 0.0))
        return found[:limit]
