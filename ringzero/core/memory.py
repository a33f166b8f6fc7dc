"""Long-term memory: JSON values under keys, per namespace, durable and searchable.

``MemoryStore`` keeps each value as a record of the kernel's Checkpointer (thread
``ringzero-memory:<namespace>``, the key as the record's namespace, newest record wins; a
forgotten key gets a tombstone), so memory is as durable as the store and every kernel on the
same store sees it. ``search`` ranks a namespace's memories with BM25 over their text, or by
cosine similarity when the store has an ``embed`` function.

Programs use it through ``ctx.memory`` (``ProcessMemory``): each call is a syscall, so a
resumed program is served the same recalls and searches it saw before its crash.
"""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ringzero.core.errors import InvalidArgument
from ringzero.core.protocols import Checkpointer
from ringzero.core.ranking import Embed, bm25_scores, cosine
from ringzero.core.types import JSON, Checkpoint, ensure_json

if TYPE_CHECKING:
    from ringzero.core.process import Process

__all__ = ["Memory", "MemoryStore", "ProcessMemory"]

_PREFIX = "ringzero-memory:"
_SEQUENCE = itertools.count()


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


def _check_name(what: str, name: str) -> None:
    if not isinstance(name, str) or not name:
        raise InvalidArgument(f"a memory {what} must be a non-empty string, not {name!r}")


class MemoryStore:
    """Namespaced long-term memory over a Checkpointer."""

    def __init__(self, checkpointer: Checkpointer, *, embed: Embed | None = None) -> None:
        self.checkpointer = checkpointer
        self.embed = embed

    async def put(self, namespace: str, key: str, value: JSON) -> Memory:
        _check_name("namespace", namespace)
        _check_name("key", key)
        ensure_json(value, f"the memory {key!r}")
        now = time.time()
        previous = await self.get(namespace, key)
        memory = Memory(namespace, key, value, previous.created_at if previous else now, now)
        await self._write(namespace, key, {"value": value, "created_at": memory.created_at, "updated_at": now})
        return memory

    async def get(self, namespace: str, key: str) -> Memory | None:
        record = await self.checkpointer.get(_PREFIX + namespace, key)
        return None if record is None else _memory(namespace, key, record.payload)

    async def delete(self, namespace: str, key: str) -> bool:
        """Forget ``key``; False if there was nothing to forget."""
        if await self.get(namespace, key) is None:
            return False
        await self._write(namespace, key, {"deleted": True})
        return True

    async def items(self, namespace: str) -> list[Memory]:
        """Every live memory of ``namespace``, most recently written first."""
        newest: dict[str, Checkpoint] = {}
        async for record in self.checkpointer.list(_PREFIX + namespace):
            if record.namespace not in newest or record.id > newest[record.namespace].id:
                newest[record.namespace] = record
        found = (_memory(namespace, key, record.payload) for key, record in newest.items())
        return sorted((m for m in found if m is not None), key=lambda m: -m.updated_at)

    async def namespaces(self) -> list[str]:
        """Every namespace with at least one live memory."""
        names: set[str] = set()
        async for record in self.checkpointer.list():
            if record.thread_id.startswith(_PREFIX):
                names.add(record.thread_id[len(_PREFIX):])
        return sorted([name for name in names if await self.items(name)])

    async def search(self, namespace: str, query: str, limit: int = 5) -> list[Memory]:
        """The memories of ``namespace`` that best match ``query``, best first."""
        if limit < 1:
            raise InvalidArgument(f"limit must be at least 1, not {limit}")
        memories = await self.items(namespace)
        if not memories:
            return []
        texts = [m.text for m in memories]
        scores = self._cosine(query, texts) if self.embed is not None else bm25_scores(query, texts)
        ranked = sorted(range(len(memories)), key=lambda i: -scores[i])
        return [_scored(memories[i], scores[i]) for i in ranked[:limit] if scores[i] > 0]

    def _cosine(self, query: str, texts: Sequence[str]) -> list[float]:
        assert self.embed is not None
        vectors = list(self.embed([query, *texts]))
        return [cosine(vectors[0], vector) for vector in vectors[1:]]

    async def _write(self, namespace: str, key: str, body: dict[str, JSON]) -> None:
        record_id = f"{time.time_ns():020d}.{next(_SEQUENCE):08d}"  # newest sorts last, across processes
        await self.checkpointer.put(Checkpoint(_PREFIX + namespace, key, record_id, json.dumps(body).encode(),
                                               metadata={"deleted": bool(body.get("deleted"))}))


def _memory(namespace: str, key: str, payload: bytes) -> Memory | None:
    body = json.loads(payload)
    if body.get("deleted"):
        return None
    return Memory(namespace, key, body["value"], body["created_at"], body["updated_at"])


def _scored(memory: Memory, score: float) -> Memory:
    return Memory(memory.namespace, memory.key, memory.value, memory.created_at, memory.updated_at, round(score, 6))


class ProcessMemory:
    """``ctx.memory``: a process's view of long-term memory, one namespace at a time.

    The default namespace is the process's name, so the runs of one agent share what they
    remember; ``ctx.memory.namespace("team")`` is another namespace, shared by every process
    that names it. Each call is a journaled syscall.
    """

    def __init__(self, process: Process, namespace: str) -> None:
        _check_name("namespace", namespace)
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
        store = self._process.kernel.memory

        async def live() -> dict[str, JSON]:
            result = await work(store)
            return {"value": result.to_dict() if isinstance(result, Memory) else result}

        outcome = await self._process.syscall("memory", {"op": op, "namespace": self.name, **args},
                                              f"{op} in {self.name}", live)
        return outcome["value"]
