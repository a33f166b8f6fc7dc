"""KernelSaver: LangGraph's conformance suite on each checkpointer, and real compiled graphs."""

from __future__ import annotations

import asyncio
import datetime
import operator
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Annotated, Any

import pytest
from langgraph.checkpoint.conformance import checkpointer_test, validate
from langgraph.graph import END, START, StateGraph
from langgraph.types import Command, interrupt
from typing_extensions import TypedDict

from ringzero.adapters.langgraph import KernelSaver
from ringzero.checkpointers import MemoryCheckpointer, PostgresCheckpointer, SqliteCheckpointer
from ringzero.core.contract.errors import WrongEventLoop
from ringzero.core.contract.protocols import Checkpointer
from tests.postgres import fresh_database


@pytest.mark.parametrize("backend", ["memory", "sqlite", "postgres"])
async def test_langgraph_conformance_passes_every_capability(backend: str, tmp_path: Path,
                                                             request: pytest.FixtureRequest,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    files = iter(range(100))
    admin_dsn = request.getfixturevalue("postgres_dsn") if backend == "postgres" else ""

    def new_store() -> Checkpointer:
        if backend == "memory":
            return MemoryCheckpointer()
        if backend == "sqlite":
            return SqliteCheckpointer(tmp_path / f"{next(files)}.db")
        return PostgresCheckpointer(fresh_database(admin_dsn))

    @checkpointer_test(name=f"KernelSaver({backend})")
    async def factory() -> AsyncIterator[KernelSaver]:
        store = new_store()
        yield KernelSaver(store)
        await store.aclose()

    report = await validate(factory)
    with capsys.disabled():
        print()
        report.print_report()
    results = report.results
    assert set(results) == {"put", "put_writes", "get_tuple", "list", "delete_thread",
                            "delete_for_runs", "copy_thread", "prune"}
    failed = {cap: r.failures for cap, r in results.items() if not (r.detected and r.passed)}
    assert failed == {}


class State(TypedDict):
    steps: Annotated[list[str], operator.add]
    answer: str


def plan(state: State) -> dict[str, Any]:
    return {"steps": ["plan"]}


def build(saver: KernelSaver) -> Any:
    def ask_human(state: State) -> dict[str, Any]:
        answer = interrupt("approve the plan?")
        return {"steps": ["asked"], "answer": answer}

    graph = StateGraph(State)
    graph.add_node("plan", plan)
    graph.add_node("ask_human", ask_human)
    graph.add_edge(START, "plan")
    graph.add_edge("plan", "ask_human")
    graph.add_edge("ask_human", END)
    return graph.compile(checkpointer=saver)


def test_a_sync_graph_is_interrupted_resumed_and_keeps_its_history(tmp_path: Path) -> None:
    with KernelSaver.from_conn_string(str(tmp_path / "graph.db")) as saver:
        graph = build(saver)
        config = {"configurable": {"thread_id": "t1"}}
        first = graph.invoke({"steps": [], "answer": ""}, config)
        assert first["__interrupt__"][0].value == "approve the plan?"
        assert graph.get_state(config).next == ("ask_human",)
        done = graph.invoke(Command(resume="yes"), config)
        assert done["steps"] == ["plan", "asked"] and done["answer"] == "yes"
        history = list(graph.get_state_history(config))
        assert len(history) >= 4 and history[0].values["answer"] == "yes"
        saver.delete_thread("t1")
        assert graph.get_state(config).values == {}


@pytest.mark.skipif(sys.version_info < (3, 11), reason="LangGraph's interrupt() cannot find its run's config under "
                    "ainvoke before Python 3.11 (with any saver, its own InMemorySaver included)")
async def test_an_async_graph_resumes_in_a_second_saver_on_the_same_file(tmp_path: Path) -> None:
    path = tmp_path / "graph.db"
    config = {"configurable": {"thread_id": "t2"}}
    first_store = SqliteCheckpointer(path)
    await build(KernelSaver(first_store)).ainvoke({"steps": [], "answer": ""}, config)
    await first_store.aclose()
    second_store = SqliteCheckpointer(path)  # a new process would do exactly this
    done = await build(KernelSaver(second_store)).ainvoke(Command(resume="approved"), config)
    await second_store.aclose()
    assert done["answer"] == "approved" and done["steps"] == ["plan", "asked"]


@pytest.mark.parametrize("runtime_loop", ["stops", "goes on"])
def test_what_a_closed_saver_wrote_is_read_by_the_next_saver_on_the_file(tmp_path: Path, runtime_loop: str) -> None:
    """A sync graph on a saver over a store the caller keeps (LangGraph's ``SqliteSaver(conn)``
    shape), the saver closed, then a second saver on the same file in the same process: it reads
    the thread. The first store's records were appended to its log, folded into the file by a
    timer on the runtime loop: the second saver read an empty thread when the saver's close
    stopped that loop (the timer went with it), and for the timer's 5 ms when another object
    kept the loop going."""

    class Count(TypedDict):
        n: int

    graph = StateGraph(Count)
    graph.add_node("step", lambda state: {"n": state["n"] + 1})
    graph.add_edge(START, "step")
    graph.add_edge("step", END)
    path = tmp_path / "graph.db"
    config = {"configurable": {"thread_id": "kept"}}
    bystander = KernelSaver(MemoryCheckpointer())  # another user of the runtime loop, keeping it going
    if runtime_loop == "goes on":
        assert bystander.get_tuple(config) is None
    store = SqliteCheckpointer(path)  # the caller's: closing the saver leaves it open
    saver = KernelSaver(store)
    assert graph.compile(checkpointer=saver).invoke({"n": 1}, config) == {"n": 2}
    saver.close()
    with KernelSaver.from_conn_string(str(path)) as second:
        assert graph.compile(checkpointer=second).get_state(config).values == {"n": 2}
    with KernelSaver(store) as again:  # the caller's store still works, on the next loop that uses it
        assert graph.compile(checkpointer=again).invoke({"n": 5}, config) == {"n": 6}
    bystander.close()
    asyncio.run(store.aclose())


def test_a_sync_call_from_the_savers_own_loop_is_refused_not_deadlocked() -> None:
    saver = KernelSaver(MemoryCheckpointer())
    config = {"configurable": {"thread_id": "t", "checkpoint_ns": ""}}
    assert saver.get_tuple(config) is None  # starts the private loop

    async def inside() -> None:
        saver.get_tuple(config)

    assert saver.home.loop is not None
    future = asyncio.run_coroutine_threadsafe(inside(), saver.home.loop)
    with pytest.raises(WrongEventLoop, match="synchronously on the event loop it runs on"):
        future.result(timeout=5)
    saver.close()


class Count(TypedDict):
    n: int
    trail: Annotated[list[str], operator.add]


def counter_graph(saver: KernelSaver, with_subgraph: bool = False) -> Any:
    def add(state: Count) -> dict[str, Any]:
        return {"n": state["n"] + 1, "trail": ["add"]}

    def double(state: Count) -> dict[str, Any]:
        return {"n": state["n"] * 2, "trail": ["double"]}

    graph = StateGraph(Count)
    graph.add_node("add", add)
    if with_subgraph:
        inner = StateGraph(Count)
        inner.add_node("double", double)
        inner.add_edge(START, "double")
        inner.add_edge("double", END)
        graph.add_node("double", inner.compile())  # shares the parent's checkpointer
    else:
        graph.add_node("double", double)
    graph.add_edge(START, "add")
    graph.add_edge("add", "double")
    graph.add_edge("double", END)
    return graph.compile(checkpointer=saver)


def test_stream_update_state_and_time_travel(tmp_path: Path) -> None:
    with KernelSaver.from_conn_string(str(tmp_path / "g.db")) as saver:
        app = counter_graph(saver)
        config = {"configurable": {"thread_id": "c"}}
        updates = list(app.stream({"n": 1, "trail": []}, config, stream_mode="updates"))
        assert [list(u) for u in updates] == [["add"], ["double"]]
        assert app.get_state(config).values["n"] == 4
        app.update_state(config, {"n": 100})  # a human edits the state
        assert app.get_state(config).values["n"] == 100
        # Time travel: replay from the checkpoint taken after "add", before "double".
        after_add = next(s for s in app.get_state_history(config) if s.next == ("double",))
        replayed = app.invoke(None, after_add.config)
        assert replayed["n"] == 4 and app.get_state(config).values["n"] == 4


async def test_a_subgraph_checkpoints_under_its_own_namespace(tmp_path: Path) -> None:
    store = SqliteCheckpointer(tmp_path / "sub.db")
    app = counter_graph(KernelSaver(store), with_subgraph=True)
    config = {"configurable": {"thread_id": "s"}}
    assert (await app.ainvoke({"n": 2, "trail": []}, config))["n"] == 6
    namespaces = {c.namespace async for c in store.list("s")}
    assert "" in namespaces and any(ns.startswith("double") for ns in namespaces)
    await store.aclose()


async def test_an_encrypting_serializer_keeps_state_unreadable_at_rest(tmp_path: Path) -> None:
    from langgraph.checkpoint.serde.encrypted import EncryptedSerializer

    path = tmp_path / "secret.db"
    key = b"k" * 32
    store = SqliteCheckpointer(path)
    app = counter_graph(KernelSaver(store, serde=EncryptedSerializer.from_pycryptodome_aes(key=key)))
    config = {"configurable": {"thread_id": "secret-thread"}}
    await app.ainvoke({"n": 1, "trail": ["patient-id-4471"]}, config)
    await store.aclose()
    raw = path.read_bytes() + (path.with_name(path.name + "-wal").read_bytes()
                               if path.with_name(path.name + "-wal").exists() else b"")
    assert b"patient-id-4471" not in raw
    reopened = SqliteCheckpointer(path)
    again = counter_graph(KernelSaver(reopened, serde=EncryptedSerializer.from_pycryptodome_aes(key=key)))
    assert (await again.aget_state(config)).values["trail"][0] == "patient-id-4471"
    await reopened.aclose()


async def test_a_saver_sharing_a_kernels_store_lists_only_graph_checkpoints(tmp_path: Path) -> None:
    from ringzero import Context, Kernel

    async def napper(ctx: Context) -> str:
        await ctx.sleep(0.3)  # long enough for an activity row
        return "rested"

    store = SqliteCheckpointer(tmp_path / "shared.db")
    saver = KernelSaver(store)
    builder = StateGraph(State)  # no interrupt: it runs on Python 3.10 too
    builder.add_node("plan", plan)
    builder.add_edge(START, "plan")
    builder.add_edge("plan", END)
    graph = builder.compile(checkpointer=saver)
    async with Kernel(checkpointer=store, monitor_interval=0.1) as kernel:
        assert await (await kernel.spawn(napper)).wait() == "rested"
        config = {"configurable": {"thread_id": "graph-thread"}}
        await graph.ainvoke({"steps": [], "answer": ""}, config)
        kernel_rows = [cp.thread_id async for cp in store.list(None)]
        assert any(t.startswith("ringzero/") for t in kernel_rows)  # the kernel's records are in this store
        listed = [t.config["configurable"]["thread_id"] async for t in saver.alist(None)]
        assert listed and set(listed) == {"graph-thread"}
        assert len([t async for t in saver.alist(None, limit=1)]) == 1


async def test_checkpoint_metadata_is_kept_as_its_json_copy_and_filters(tmp_path: Path) -> None:
    """The metadata kept beside a checkpoint is what a JSON round trip of it gives (values that
    are not JSON as their repr), a copy the graph's later changes do not reach."""
    store = SqliteCheckpointer(tmp_path / "meta.db")
    saver = KernelSaver(store)
    nested = {"depth": [1, 2.5, None, True]}
    day = datetime.date(2026, 11, 23)
    odd = {"pair": (1, 2), "day": day, 3: "three"}
    for i, metadata in enumerate([{"plain": "yes", "nested": nested}, odd]):
        config = {"configurable": {"thread_id": "t", "checkpoint_ns": ""}}
        checkpoint = {"v": 1, "id": f"0000{i}", "ts": "2026-11-23T00:00:00+00:00", "channel_values": {},
                      "channel_versions": {}, "versions_seen": {}, "updated_channels": None}
        await saver.aput(config, checkpoint, metadata, {})  # type: ignore[arg-type]
    nested["depth"].append("later")  # the graph's dict changes after the put: the record does not
    found = [cp async for cp in store.list("t")]
    by_id = {cp.id: cp.metadata for cp in found}
    assert by_id["00000"] == {"plain": "yes", "nested": {"depth": [1, 2.5, None, True]}}
    assert by_id["00001"] == {"pair": [1, 2], "day": repr(day), "3": "three"}
    matched = [t.checkpoint["id"] async for t in saver.alist(None, filter={"nested": {"depth": [1, 2.5, None, True]}})]
    assert matched == ["00000"]
    await store.aclose()
