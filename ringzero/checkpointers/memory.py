"""MemoryCheckpointer: the protocol in a dict. Fast, shared within one process, not durable."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import replace

from ringzero.checkpointers._filters import matches
from ringzero.core.protocols import CheckpointerCapabilities
from ringzero.core.types import JSON, Checkpoint, PendingWrite

__all__ = ["MemoryCheckpointer"]


class MemoryCheckpointer:
    """Keeps every checkpoint in memory; everything is lost with the process."""

    capabilities = CheckpointerCapabilities(durable=False, multi_process=False, delete_checkpoints=True, claims=True)

    def __init__(self) -> None:
        self._checkpoints: dict[tuple[str, str], dict[str, Checkpoint]] = {}
        self._writes: dict[tuple[str, str, str], dict[tuple[str, int], PendingWrite]] = {}

    async def put(self, checkpoint: Checkpoint) -> None:
        stored = Checkpoint(  # a copy, so that later changes to the caller's metadata do not leak in
            checkpoint.thread_id, checkpoint.namespace, checkpoint.id, checkpoint.payload,
            checkpoint.parent_id, dict(checkpoint.metadata),
        )
        self._checkpoints.setdefault((checkpoint.thread_id, checkpoint.namespace), {})[checkpoint.id] = stored

    async def claim(self, checkpoint: Checkpoint) -> bool:
        if checkpoint.id in self._checkpoints.get((checkpoint.thread_id, checkpoint.namespace), {}):
            return False
        await self.put(checkpoint)
        return True

    async def put_writes(
        self, thread_id: str, namespace: str, checkpoint_id: str, writes: Sequence[PendingWrite]
    ) -> None:
        slot = self._writes.setdefault((thread_id, namespace, checkpoint_id), {})
        for write in writes:
            slot[(write.task_id, write.idx)] = write

    def _with_writes(self, cp: Checkpoint) -> Checkpoint:
        writes = self._writes.get((cp.thread_id, cp.namespace, cp.id))
        return cp if not writes else replace(cp, writes=tuple(writes.values()))

    async def get(self, thread_id: str, namespace: str = "", checkpoint_id: str | None = None) -> Checkpoint | None:
        thread = self._checkpoints.get((thread_id, namespace))
        if not thread:
            return None
        key = checkpoint_id if checkpoint_id is not None else max(thread)
        cp = thread.get(key)
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
        found = [
            cp
            for (thread, ns), cps in list(self._checkpoints.items())
            if (thread_id is None or thread == thread_id) and (namespace is None or ns == namespace)
            for cp in list(cps.values())
            if (before is None or cp.id < before) and matches(cp.metadata, filter)
        ]
        found.sort(key=lambda cp: (cp.id, cp.thread_id, cp.namespace), reverse=True)
        for cp in found[:limit] if limit is not None else found:
            yield self._with_writes(cp)

    async def delete_thread(self, thread_id: str) -> None:
        for key in [k for k in self._checkpoints if k[0] == thread_id]:
            del self._checkpoints[key]
        for wkey in [k for k in self._writes if k[0] == thread_id]:
            del self._writes[wkey]

    async def delete_checkpoints(self, thread_id: str, namespace: str, ids: Sequence[str]) -> None:
        thread = self._checkpoints.get((thread_id, namespace), {})
        for cid in ids:
            thread.pop(cid, None)
            self._writes.pop((thread_id, namespace, cid), None)

    async def aclose(self) -> None:
        return None
