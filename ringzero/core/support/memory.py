"""Long-term memory: JSON values under keys, per namespace, durable and searchable.

``MemoryStore`` keeps memories where the kernel's Checkpointer keeps everything else, so memory
is as durable as the store and every kernel on the same store sees it. The built-in stores keep
them in a table of their own with a full-text index (``Checkpointer.memory_index()``): SQLite
FTS5, PostgreSQL full-text search, an in-process BM25 index for ``MemoryCheckpointer``. A search
reads only the memories that hold a word of the query, and namespaces are listed by a query,
not by reading the store. A Checkpointer without ``memory_index()`` (someone else's backend)
still works: its memories are records of the protocol (thread ``ringzero-memory:<namespace>``,
the key as the record's namespace, newest record wins, a tombstone for a forgotten key), and
searching them reads the namespace. With an ``embed`` function, search ranks a namespace's
memories by cosine similarity instead.

Programs use it through ``ctx.memory`` (``ringzero.core._engine.process_memory``): each call is a syscall, so a
resumed program is served the same recalls and searches it saw before its crash.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol, runtime_checkable

from ringzero.core.contract.errors import InvalidArgument
from ringzero.core.contract.ids import time_ordered_id
from ringzero.core.contract.protocols import Checkpointer, MemoryIndexed
from ringzero.core.contract.types import JSON, Checkpoint, ensure_json
from ringzero.core.support.ranking import Embed, rank, words

__all__ = ["Memory", "MemoryIndex", "MemoryStore", "RecordMemoryIndex", "check_memory_name", "in_namespace"]

RECORD_PREFIX = "ringzero-memory:"
"""The thread prefix of memories kept as protocol records (and of those an older ringzero wrote)."""


@dataclass(frozen=True)
class Memory:
    """One remembered value, with when it was first and last written, and a search score."""

    namespace: str
    key: str
    value: JSON
    created_at: float
    updated_at: float
    score: float | None = None

    def to_dict(self) -> dict[str, JSON]:
        return {"namespace": self.namespace, "key": self.key, "value": self.value, "created_at": self.created_at,
                "updated_at": self.updated_at, "score": self.score}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Memory:
        return cls(data["namespace"], data["key"], data["value"], data["created_at"], data["updated_at"],
                   data.get("score"))

    @property
    def text(self) -> str:
        """What search ranks: the key's words and the value as text."""
        return f"{self.key} {self.value if isinstance(self.value, str) else json.dumps(self.value)}"

    @property
    def indexed_words(self) -> str:
        """``text`` as the words every index is fed (``ringzero.core.support.ranking.words``)."""
        return " ".join(words(self.text))


def in_namespace(name: str, namespace: str, prefix: bool) -> bool:
    """Whether memory namespace ``name`` is ``namespace`` (or, with ``prefix``, below it:
    ``users.alice`` is below ``users``; everything is below ``""``)."""
    if not prefix:
        return name == namespace
    return not namespace or name == namespace or name.startswith(namespace + ".")


@runtime_checkable
class MemoryIndex(Protocol):
    """Where a store keeps memories, indexed for search (``Checkpointer.memory_index()``)."""

    async def put(self, namespace: str, key: str, value: JSON, indexed_words: str, now: float) -> Memory:
        """Store ``value`` (keeping ``created_at`` of the value it replaces); the stored memory."""
        ...

    async def get(self, namespace: str, key: str) -> Memory | None: ...

    async def delete(self, namespace: str, key: str) -> bool:
        """Forget ``key``; False if there was nothing to forget."""
        ...

    async def items(self, namespace: str, *, prefix: bool = False) -> list[Memory]:
        """The memories of ``namespace`` (and below it, with ``prefix``), most recently written first."""
        ...

    async def namespaces(self) -> list[str]:
        """Every namespace with at least one memory, sorted."""
        ...

    async def search(self, namespace: str, query_words: Sequence[str], limit: int | None, *,
                     prefix: bool = False) -> list[Memory]:
        """The memories holding at least one of ``query_words``, best first, each with its score."""
        ...


def check_memory_name(what: str, name: str) -> None:
    if not isinstance(name, str) or not name:
        raise InvalidArgument(f"a memory {what} must be a non-empty string, not {name!r}")


class MemoryStore:
    """Namespaced long-term memory in a Checkpointer's store."""

    def __init__(self, checkpointer: Checkpointer, *, embed: Embed | None = None) -> None:
        self.checkpointer = checkpointer
        self.embed = embed
        self.index: MemoryIndex = checkpointer.memory_index() if isinstance(checkpointer, MemoryIndexed) \
            else RecordMemoryIndex(checkpointer)
        """Where the memories are kept: the store's own index, or protocol records."""

    async def put(self, namespace: str, key: str, value: JSON) -> Memory:
        check_memory_name("namespace", namespace)
        check_memory_name("key", key)
        ensure_json(value, f"the memory {key!r}")
        now = time.time()
        return await self.index.put(namespace, key, value, Memory(namespace, key, value, now, now).indexed_words, now)

    async def get(self, namespace: str, key: str) -> Memory | None:
        return await self.index.get(namespace, key)

    async def delete(self, namespace: str, key: str) -> bool:
        """Forget ``key``; False if there was nothing to forget."""
        return await self.index.delete(namespace, key)

    async def items(self, namespace: str, *, prefix: bool = False) -> list[Memory]:
        """Every memory of ``namespace`` (and of those below it, with ``prefix``), most recently
        written first."""
        return await self.index.items(namespace, prefix=prefix)

    async def namespaces(self) -> list[str]:
        """Every namespace with at least one memory."""
        return await self.index.namespaces()

    async def search(self, namespace: str, query: str, limit: int | None = 5, *, prefix: bool = False) -> list[Memory]:
        """The memories of ``namespace`` that best match ``query``, best first (only those that
        match at all; ``limit=None`` for every one)."""
        if limit is not None and limit < 1:
            raise InvalidArgument(f"limit must be at least 1, not {limit}")
        if self.embed is None:
            return await self.index.search(namespace, sorted(set(words(query))), limit, prefix=prefix)
        memories = await self.items(namespace, prefix=prefix)
        scores = rank(query, [m.text for m in memories], self.embed)
        ranked = sorted(range(len(memories)), key=lambda i: -scores[i])
        return [scored(memories[i], scores[i]) for i in ranked[:limit] if scores[i] > 0]


def scored(memory: Memory, score: float) -> Memory:
    return replace(memory, score=round(score, 6))


class RecordMemoryIndex:
    """Memories as records of any Checkpointer: what a store without an index of its own gets.

    Correct on every store, but listing namespaces reads every record and a search reads the
    whole namespace: a store that is to hold many memories should offer ``memory_index()``.
    """

    def __init__(self, checkpointer: Checkpointer) -> None:
        self.checkpointer = checkpointer

    async def put(self, namespace: str, key: str, value: JSON, indexed_words: str, now: float) -> Memory:
        previous = await self.get(namespace, key)
        memory = Memory(namespace, key, value, previous.created_at if previous else now, now)
        await self._write(namespace, key, {"value": value, "created_at": memory.created_at, "updated_at": now})
        return memory

    async def get(self, namespace: str, key: str) -> Memory | None:
        record = await self.checkpointer.get(RECORD_PREFIX + namespace, key)
        return None if record is None else memory_from_record(namespace, key, record.payload)

    async def delete(self, namespace: str, key: str) -> bool:
        if await self.get(namespace, key) is None:
            return False
        await self._write(namespace, key, {"deleted": True})
        return True

    async def items(self, namespace: str, *, prefix: bool = False) -> list[Memory]:
        names = [name for name in await self.namespaces() if in_namespace(name, namespace, True)] if prefix \
            else [namespace]
        found: list[Memory] = []
        for name in names:
            found += newest_memories([(r.thread_id, r.namespace, r.id, r.payload)
                                      async for r in self.checkpointer.list(RECORD_PREFIX + name)])
        return sorted(found, key=lambda m: -m.updated_at)

    async def namespaces(self) -> list[str]:
        rows = [(r.thread_id, r.namespace, r.id, r.payload) async for r in self.checkpointer.list()
                if r.thread_id.startswith(RECORD_PREFIX)]
        return sorted({m.namespace for m in newest_memories(rows)})

    async def search(self, namespace: str, query_words: Sequence[str], limit: int | None, *,
                     prefix: bool = False) -> list[Memory]:
        memories = await self.items(namespace, prefix=prefix)
        scores = rank(" ".join(query_words), [m.text for m in memories])
        ranked = sorted(range(len(memories)), key=lambda i: -scores[i])
        return [scored(memories[i], scores[i]) for i in ranked[:limit] if scores[i] > 0]

    async def _write(self, namespace: str, key: str, body: dict[str, JSON]) -> None:
        await self.checkpointer.put(Checkpoint(RECORD_PREFIX + namespace, key, time_ordered_id(),
                                               json.dumps(body).encode(),
                                               metadata={"deleted": bool(body.get("deleted"))}))


def memory_from_row(row: Sequence[Any], score: float | None = None) -> Memory:
    """A memory from a store's memory table: ``(namespace, key, value as JSON text, created_at,
    updated_at, ...)``."""
    namespace, key, value, created_at, updated_at = row[:5]
    return Memory(namespace, key, json.loads(value), created_at, updated_at, score)


def memory_from_record(namespace: str, key: str, payload: bytes) -> Memory | None:
    """The memory a protocol record holds (None for a tombstone)."""
    body = json.loads(payload)
    if body.get("deleted"):
        return None
    return Memory(namespace, key, body["value"], body["created_at"], body["updated_at"])


def newest_memories(rows: Iterable[tuple[str, str, str, bytes]]) -> list[Memory]:
    """The live memories among ``(thread_id, key, record_id, payload)`` protocol records: the
    newest record of each key wins. Also how a store moves an older ringzero's memories into
    its index."""
    newest: dict[tuple[str, str], tuple[str, bytes]] = {}
    for thread_id, key, record_id, payload in rows:
        if not thread_id.startswith(RECORD_PREFIX):
            continue
        if (thread_id, key) not in newest or record_id > newest[(thread_id, key)][0]:
            newest[(thread_id, key)] = (record_id, payload)
    found = (memory_from_record(thread_id[len(RECORD_PREFIX):], key, payload)
             for (thread_id, key), (_, payload) in newest.items())
    return [m for m in found if m is not None]
