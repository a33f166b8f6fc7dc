"""``KernelMemoryStore``: LangGraph's long-term store (``BaseStore``) over the kernel's memory.

    graph.compile(checkpointer=KernelSaver(store), store=KernelMemoryStore(store))

A LangGraph namespace ``("users", "alice")`` is the kernel memory namespace ``users.alice``
(LangGraph forbids periods in labels, so the mapping is exact both ways): what a graph puts
under ``("team",)`` is what a kernel program reads with ``ctx.memory.namespace("team")``.
Values are JSON dicts, durable through the Checkpointer. ``search`` reads the namespaces under
its prefix with one query and filters as LangGraph's own stores do (``$eq``, ``$ne``, ``$gt``,
``$gte``, ``$lt``, ``$lte``, nested dicts); with a query it ranks every match by the store's
full-text index (or by the memory's ``embed`` function) and sets ``score``.

The store lives on one event loop, as KernelSaver's does (``ringzero.core.support.loops``): calls
from any loop or thread run there; ``close()``/``aclose()`` (or ``with``) stop the private
thread it starts for sync callers, and later calls raise ``Closed``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from datetime import datetime, timezone
from typing import Any

from ringzero.core.contract.errors import MissingExtra
from ringzero.core.contract.protocols import Checkpointer
from ringzero.core.support.loops import Closing, LoopHome
from ringzero.core.support.memory import Memory, MemoryStore

try:
    from langgraph.store.base import (
        BaseStore,
        GetOp,
        Item,
        ListNamespacesOp,
        MatchCondition,
        Op,
        PutOp,
        Result,
        SearchItem,
        SearchOp,
    )
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise MissingExtra("ringzero.adapters.langgraph", "langgraph") from exc

__all__ = ["KernelMemoryStore"]


class KernelMemoryStore(Closing, BaseStore):
    """A LangGraph ``BaseStore`` whose items are the kernel's long-term memories."""

    def __init__(self, memory: MemoryStore | Checkpointer) -> None:
        self.memory = memory if isinstance(memory, MemoryStore) else MemoryStore(memory)
        self._home = LoopHome("KernelMemoryStore")

    def close(self) -> None:
        """Stop the private loop thread, if one was started (the memory's checkpointer stays
        the caller's). Later calls raise ``Closed``."""
        self._home.close()

    async def aclose(self) -> None:
        await self._home.aclose()

    def batch(self, ops: Iterable[Op]) -> list[Result]:
        return self._home.run_sync(self._batch(list(ops)), "KernelMemoryStore.batch")

    async def abatch(self, ops: Iterable[Op]) -> list[Result]:
        return await self._home.run(self._batch(list(ops)))

    async def _batch(self, ops: list[Op]) -> list[Result]:
        results: list[Result] = []
        for op in ops:
            if isinstance(op, GetOp):
                found = await self.memory.get(_name(op.namespace), op.key)
                results.append(None if found is None else _item(found))
            elif isinstance(op, PutOp):
                if op.value is None:
                    await self.memory.delete(_name(op.namespace), op.key)
                else:
                    await self.memory.put(_name(op.namespace), op.key, json.loads(json.dumps(op.value)))
                results.append(None)
            elif isinstance(op, SearchOp):
                results.append(await self._search(op))
            elif isinstance(op, ListNamespacesOp):
                results.append(await self._namespaces(op))
            else:
                raise ValueError(f"Unknown operation type: {type(op)}")
        return results

    async def _search(self, op: SearchOp) -> list[SearchItem]:
        namespace = _name(tuple(op.namespace_prefix))
        candidates = [m for m in await self.memory.items(namespace, prefix=True)
                      if not op.filter or all(_matches(_field(m.value, k), v) for k, v in op.filter.items())]
        candidates.sort(key=lambda m: (m.created_at, m.namespace, m.key))  # the order they were first written
        scores: list[float | None] = [None] * len(candidates)
        if op.query and candidates:  # every match is ranked: those the index does not find score 0
            found = {(m.namespace, m.key): m.score or 0.0
                     for m in await self.memory.search(namespace, op.query, None, prefix=True)}
            ranked = [found.get((m.namespace, m.key), 0.0) for m in candidates]
            order = sorted(range(len(candidates)), key=lambda i: -ranked[i])
            candidates, scores = [candidates[i] for i in order], [ranked[i] for i in order]
        window = slice(op.offset, op.offset + op.limit)
        return [_search_item(m, s) for m, s in zip(candidates[window], scores[window], strict=True)]

    async def _namespaces(self, op: ListNamespacesOp) -> list[tuple[str, ...]]:
        names = [_labels(n) for n in await self.memory.namespaces()]
        names = [n for n in names if all(_condition(c, n) for c in op.match_conditions or ())]
        if op.max_depth is not None:
            names = [n[:op.max_depth] for n in names]
        return sorted(set(names))[op.offset:op.offset + op.limit]


def _name(namespace: tuple[str, ...]) -> str:
    return ".".join(namespace)


def _labels(name: str) -> tuple[str, ...]:
    return tuple(name.split("."))


def _when(timestamp: float) -> datetime:
    return datetime.fromtimestamp(timestamp, tz=timezone.utc)


def _item(memory: Memory) -> Item:
    return Item(value=_as_dict(memory.value), key=memory.key, namespace=_labels(memory.namespace),
                created_at=_when(memory.created_at), updated_at=_when(memory.updated_at))


def _search_item(memory: Memory, score: float | None) -> SearchItem:
    return SearchItem(namespace=_labels(memory.namespace), key=memory.key, value=_as_dict(memory.value),
                      created_at=_when(memory.created_at), updated_at=_when(memory.updated_at), score=score)


def _as_dict(value: Any) -> dict[str, Any]:
    """LangGraph items hold dicts; a memory a kernel program stored as a plain value is wrapped."""
    return value if isinstance(value, dict) else {"value": value}


def _field(value: Any, key: str) -> Any:
    return value.get(key) if isinstance(value, dict) else None


def _matches(item_value: Any, wanted: Any) -> bool:
    """LangGraph's filter semantics: operators, nested dicts, lists element by element."""
    if isinstance(wanted, dict):
        if any(k.startswith("$") for k in wanted):
            return all(_operator(item_value, op, operand) for op, operand in wanted.items())
        return isinstance(item_value, dict) and all(_matches(item_value.get(k), v) for k, v in wanted.items())
    if isinstance(wanted, (list, tuple)):
        return (isinstance(item_value, (list, tuple)) and len(item_value) == len(wanted)
                and all(_matches(i, w) for i, w in zip(item_value, wanted, strict=False)))
    return bool(item_value == wanted)


def _operator(value: Any, operator: str, operand: Any) -> bool:
    if operator == "$eq":
        return bool(value == operand)
    if operator == "$ne":
        return bool(value != operand)
    comparisons = {"$gt": float.__gt__, "$gte": float.__ge__, "$lt": float.__lt__, "$lte": float.__le__}
    if operator not in comparisons:
        raise ValueError(f"Unsupported operator: {operator}")
    return bool(comparisons[operator](float(value), float(operand)))


def _condition(condition: MatchCondition, labels: tuple[str, ...]) -> bool:
    path = tuple(condition.path)
    if len(labels) < len(path):
        return False
    pairs = zip(labels, path, strict=False) if condition.match_type == "prefix" else zip(
        reversed(labels), reversed(path), strict=False)
    if condition.match_type not in ("prefix", "suffix"):
        raise ValueError(f"Unsupported match type: {condition.match_type}")
    return all(p == "*" or label == p for label, p in pairs)
