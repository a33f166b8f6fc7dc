"""KernelMemoryStore against LangGraph's own InMemoryStore: the same operations, the same answers.

LangGraph publishes no conformance suite for stores, so this suite mirrors its documented
behaviour by running every operation on both stores and comparing what comes back.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from langgraph.graph import START, StateGraph
from langgraph.store.base import BaseStore, InvalidNamespaceError
from langgraph.store.memory import InMemoryStore
from typing_extensions import TypedDict

from ringzero import Context, Kernel
from ringzero.adapters.langgraph import KernelMemoryStore
from ringzero.checkpointers import MemoryCheckpointer, SqliteCheckpointer

PUTS: list[tuple[tuple[str, ...], str, dict[str, Any]]] = [
    (("users", "alice"), "prefs", {"food": "ramen", "age": 31, "tags": ["a", "b"], "address": {"city": "Oslo"}}),
    (("users", "alice"), "job", {"title": "pilot", "age": 31}),
    (("users", "bob"), "prefs", {"food": "tacos", "age": 45, "address": {"city": "Lima"}}),
    (("users", "bob", "archive"), "old", {"food": "soup", "age": 12}),
    (("docs",), "readme", {"text": "how to install the kernel"}),
    (("docs",), "faq", {"text": "why does the kernel journal syscalls"}),
]


@pytest.fixture
def both(tmp_path: Path) -> Iterator[list[BaseStore]]:
    """LangGraph's InMemoryStore and ours over SQLite, holding the same items; ours and its
    checkpointer are closed after the test, as a user closes what they open."""
    checkpointer = SqliteCheckpointer(tmp_path / "store.db")
    ours = KernelMemoryStore(checkpointer)
    stores: list[BaseStore] = [InMemoryStore(), ours]
    for store in stores:
        for namespace, key, value in PUTS:
            store.put(namespace, key, value)
    yield stores
    ours.close()
    asyncio.run(checkpointer.aclose())


def plain(items: Any) -> Any:
    if items is None:
        return None
    if isinstance(items, list):
        return [plain(i) for i in items]
    return (items.namespace, items.key, items.value)


SEARCHES: list[dict[str, Any]] = [
    {"namespace_prefix": ("users",)},
    {"namespace_prefix": ("users",), "filter": {"age": {"$gte": 31}}},
    {"namespace_prefix": ("users",), "filter": {"address": {"city": "Oslo"}}},
    {"namespace_prefix": ("users",), "filter": {"food": {"$ne": "ramen"}, "age": {"$lt": 40}}},
    {"namespace_prefix": ("users",), "filter": {"tags": ["a", "b"]}},
    {"namespace_prefix": ("nothing",)},
    {"namespace_prefix": ()},
]


@pytest.mark.parametrize("search", SEARCHES, ids=lambda s: str(s.get("filter") or s["namespace_prefix"]))
def test_search_filters_as_langgraph_does(both: list[BaseStore], search: dict[str, Any]) -> None:
    reference, ours = both
    prefix = search.pop("namespace_prefix")
    expected = plain(reference.search(prefix, **search, limit=50))
    assert sorted(plain(ours.search(prefix, **search, limit=50)), key=repr) == sorted(expected, key=repr)


def test_get_put_update_delete_limit_offset_and_namespaces_as_langgraph_does(both: list[BaseStore]) -> None:
    reference, ours = both
    for kwargs in [{}, {"prefix": ("users",)}, {"suffix": ("archive",)}, {"max_depth": 1},
                   {"prefix": ("users", "*")}, {"suffix": ("*", "bob")}, {"limit": 2, "offset": 1}]:
        assert ours.list_namespaces(**kwargs) == reference.list_namespaces(**kwargs), kwargs
    for store in (reference, ours):
        store.put(("users", "alice"), "prefs", {"food": "udon", "age": 32})
        store.delete(("users", "bob"), "prefs")
        store.delete(("users", "nobody"), "missing")  # deleting what is not there is no error
    for namespace, key in [(("users", "alice"), "prefs"), (("users", "bob"), "prefs"), (("docs",), "faq")]:
        assert plain(ours.get(namespace, key)) == plain(reference.get(namespace, key))
    for offset in range(3):
        assert plain(ours.search(("docs",), limit=1, offset=offset)) == plain(
            reference.search(("docs",), limit=1, offset=offset))
    # A namespace whose items are all gone is no longer listed, as in LangGraph's SQL stores
    # (its InMemoryStore keeps listing emptied namespaces, and even ones only read or deleted from).
    assert ours.list_namespaces(prefix=("users",)) == [("users", "alice"), ("users", "bob", "archive")]
    for store in (reference, ours):
        with pytest.raises(InvalidNamespaceError):
            store.put(("bad.label",), "k", {"v": 1})
        with pytest.raises(ValueError, match="Unsupported operator"):
            store.search(("users",), filter={"age": {"$near": 3}})


async def test_a_query_ranks_every_match_and_scores_it(tmp_path: Path) -> None:
    store = KernelMemoryStore(MemoryCheckpointer())
    for namespace, key, value in PUTS:
        await store.aput(namespace, key, value)
    found = await store.asearch(("docs",), query="why journal syscalls")
    assert [item.key for item in found] == ["faq", "readme"] and found[0].score > found[1].score  # type: ignore[operator]
    item = await store.aget(("docs",), "faq")
    assert item is not None and item.created_at <= item.updated_at


class Notes(TypedDict):
    text: str


async def remembered_by_the_graph(ctx: Context) -> Any:
    return await ctx.memory.namespace("team").recall("decision")


async def test_a_graphs_store_is_the_kernels_memory(tmp_path: Path) -> None:
    """What a LangGraph node puts in its store, a kernel program recalls, and the other way round."""
    checkpointer = SqliteCheckpointer(tmp_path / "k.db")

    async def decide(state: Notes, *, store: BaseStore) -> dict[str, str]:
        await store.aput(("team",), "decision", {"text": state["text"]})
        return {}

    graph = StateGraph(Notes)
    graph.add_node("decide", decide)
    graph.add_edge(START, "decide")
    async with Kernel(checkpointer=checkpointer) as kernel:
        app = graph.compile(store=KernelMemoryStore(kernel.memory))
        await app.ainvoke({"text": "ship on Friday"})
        recalled = await (await kernel.spawn(remembered_by_the_graph)).wait()
        await kernel.memory.put("team", "plain", "a bare string")
        wrapped = await KernelMemoryStore(kernel.memory).aget(("team",), "plain")
    assert recalled == {"text": "ship on Friday"}
    assert wrapped is not None and wrapped.value == {"value": "a bare string"}
