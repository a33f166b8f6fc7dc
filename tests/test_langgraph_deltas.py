"""A LangGraph chat stored by what is new (``ringzero.adapters.langgraph_deltas``): the store
grows with the conversation, not with its square, and every checkpoint of it reads back as
LangGraph wrote it: history, time travel and forks, prunes and deletes, records of the earlier
encoding, values changed in place, a kill -9 mid-conversation. On SQLite, in memory and on
PostgreSQL."""

from __future__ import annotations

import asyncio
import operator
import os
import random
import signal
import string
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Annotated, Any

import pytest
from langchain_core.messages import AIMessage, AnyMessage, HumanMessage
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer
from langgraph.graph import START, StateGraph
from langgraph.graph.message import add_messages
from typing_extensions import TypedDict

from ringzero.adapters.langgraph import KernelSaver
from ringzero.checkpointers import MemoryCheckpointer, PostgresCheckpointer, SqliteCheckpointer
from ringzero.core.contract.protocols import Checkpointer
from ringzero.core.contract.types import Checkpoint
from tests.postgres import fresh_database

ROOT = Path(__file__).resolve().parent.parent
USER, ANSWER = 2000, 200
VOCABULARY = ["".join(random.Random(i).choices(string.ascii_lowercase, k=2 + i % 8)) for i in range(2000)]


def prose(seed: int, size: int) -> str:
    """Text as compressible as a chat's (zlib: about 2x, as English): words of a 2,000-word
    vocabulary, the common ones most often (Zipf), never the same text twice."""
    return " ".join(random.Random(seed).choices(VOCABULARY, weights=[1 / (r + 1) for r in range(2000)],
                                                k=size // 3))[:size]


class Chat(TypedDict):
    messages: Annotated[list[AnyMessage], add_messages]


def answer(state: Chat) -> dict[str, Any]:
    turn = len(state["messages"]) // 2
    return {"messages": [AIMessage(f"answer {turn:04d} " + prose(-turn - 1, ANSWER - 12))]}


def chat(saver: Any) -> Any:
    graph = StateGraph(Chat)
    graph.add_node("model", answer)
    graph.add_edge(START, "model")
    return graph.compile(checkpointer=saver)


def question(turn: int) -> HumanMessage:
    return HumanMessage(f"question {turn:04d} " + prose(turn, USER - 14), id=f"q{turn}")


CONFIG = {"configurable": {"thread_id": "chat"}}


def edit_in_place(left: list[dict[str, int]], right: list[dict[str, int]]) -> list[dict[str, int]]:
    """A reducer that edits the list it was given and returns it."""
    if right and right[0].get("bump"):
        left[0]["n"] += 1
        return left
    left.extend(right)
    return left


class Counters(TypedDict):
    items: Annotated[list[dict[str, int]], edit_in_place]


class Transcript(TypedDict):
    text: Annotated[str, operator.add]


@pytest.fixture(params=["sqlite", "memory", "postgres"])
async def store_for(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Callable[[], Checkpointer]]:
    """Opens the backend's store (again: the same file or database each time)."""
    dsn = fresh_database(request.getfixturevalue("postgres_dsn")) if request.param == "postgres" else ""
    memory = MemoryCheckpointer()
    opened: list[Checkpointer] = []

    def open_store() -> Checkpointer:
        store: Checkpointer = {"sqlite": lambda: SqliteCheckpointer(tmp_path / "chat.db"), "memory": lambda: memory,
                               "postgres": lambda: PostgresCheckpointer(dsn)}[request.param]()
        opened.append(store)
        return store

    open_store.kind = request.param  # type: ignore[attr-defined]
    yield open_store
    for store in opened:
        await store.aclose()


async def talk(graph: Any, turns: range, config: dict[str, Any] = CONFIG) -> None:
    for turn in turns:
        await graph.ainvoke({"messages": [question(turn)]}, config)


async def stored_bytes(store: Checkpointer) -> int:
    total = 0
    async for record in store.list("chat"):
        total += len(record.payload) + sum(len(w.value) for w in record.writes)
    return total


@pytest.mark.perf
async def test_a_chat_is_stored_in_bytes_that_grow_with_its_turns_not_their_square(
        store_for: Callable[[], Checkpointer]) -> None:
    store = store_for()
    graph = chat(KernelSaver(store))
    await talk(graph, range(60))
    at_60 = await stored_bytes(store)
    await talk(graph, range(60, 120))
    at_120 = await stored_bytes(store)
    content = 120 * (USER + ANSWER)
    assert at_120 / at_60 <= 2.2, (at_60, at_120)  # whole values at every step: 3.9x
    assert at_120 <= 3 * content, (at_120, content)  # checkpoints, their writes and metadata, by what is new


async def test_every_checkpoint_reads_back_as_langgraph_wrote_it_byte_for_byte(
        store_for: Callable[[], Checkpointer]) -> None:
    """The same chat on InMemorySaver (which keeps LangGraph's objects as they are) and on a
    KernelSaver: step by step, the same values, and the serializer's bytes of the messages the
    same, for the latest checkpoint and every earlier one (``get_state_history``)."""
    serde = JsonPlusSerializer()
    reference, ours = chat(InMemorySaver()), chat(KernelSaver(store_for()))
    await talk(reference, range(30))
    await talk(ours, range(30))
    theirs = [s async for s in reference.aget_state_history(CONFIG)]
    mine = [s async for s in ours.aget_state_history(CONFIG)]
    assert len(mine) == len(theirs) == 90  # input, __start__ and the node's step, per turn
    for a, b in zip(theirs, mine, strict=True):
        assert [m.content for m in a.values.get("messages", [])] == [m.content for m in b.values.get("messages", [])]
        assert a.next == b.next and a.metadata["step"] == b.metadata["step"]
        if "messages" in b.values:  # the messages are ours (ids assigned by add_messages): the bytes of the latest
            assert serde.dumps_typed(b.values["messages"]) == serde.dumps_typed(
                (await ours.aget_state(b.config)).values["messages"])
    latest = (await ours.aget_state(CONFIG)).values["messages"]
    assert len(latest) == 60 and [m.id for m in latest[::2]] == [f"q{i}" for i in range(30)]


@pytest.mark.parametrize("store_for", ["sqlite", "postgres"], indirect=True)  # the stores the issue names
async def test_200_turns_all_listed_and_time_travel_and_a_fork_from_turn_50(
        store_for: Callable[[], Checkpointer]) -> None:
    """The issue's 200-turn chat: every checkpoint listed by ``get_state_history``; turn 50's
    state holds exactly its 100 messages; a new branch from it (time travel) and a fork of it
    (``update_state``) work, and the first line is still there."""
    graph = chat(KernelSaver(store_for()))
    await talk(graph, range(200))
    history = [s async for s in graph.aget_state_history(CONFIG)]
    assert len(history) == 600 and len({s.config["configurable"]["checkpoint_id"] for s in history}) == 600
    [at_50] = [s for s in history if len(s.values.get("messages", [])) == 100 and not s.next]
    assert [m.id for m in at_50.values["messages"][::2]] == [f"q{i}" for i in range(50)]
    assert [m.content.split()[:2] for m in at_50.values["messages"][-2:]] == [["question", "0049"], ["answer", "0049"]]
    await graph.ainvoke({"messages": [question(1000)]}, at_50.config)  # time travel: a new branch from turn 50
    branch = (await graph.aget_state(CONFIG)).values["messages"]
    assert len(branch) == 102 and branch[-2].id == "q1000" and branch[:100] == at_50.values["messages"]
    forked = await graph.aupdate_state(at_50.config, {"messages": [AIMessage("an edit", id="edit")]})
    assert [m.id for m in (await graph.aget_state(forked)).values["messages"]][-1] == "edit"
    lines = [s async for s in graph.aget_state_history(CONFIG)]
    assert max(len(s.values.get("messages", [])) for s in lines) == 400  # the first line's end is still there
    assert len((await graph.aget_state(at_50.config)).values["messages"]) == 100


async def test_a_store_opened_again_goes_on_from_the_thread_it_holds(store_for: Callable[[], Checkpointer]) -> None:
    """A second saver (a new process would do exactly this) knows nothing of what the first
    wrote: it reads the thread back and goes on storing by what is new."""
    first = store_for()
    await talk(chat(KernelSaver(first)), range(10))
    if store_for.kind != "memory":  # type: ignore[attr-defined]
        await first.aclose()
    again = store_for()
    graph = chat(KernelSaver(again))
    await talk(graph, range(10, 20))
    messages = (await graph.aget_state(CONFIG)).values["messages"]
    assert [m.id for m in messages[::2]] == [f"q{i}" for i in range(20)]
    assert await stored_bytes(again) <= 3 * 20 * (USER + ANSWER)


async def test_two_savers_on_one_store_taking_turns_never_write_over_each_other(
        store_for: Callable[[], Checkpointer]) -> None:
    """Two hosts on one store (two savers, each with its own memory of what it wrote) take
    turns on one thread; the first then goes back to its own turn 5 (time travel from what it
    remembers). Each line of the conversation keeps every message."""
    store = store_for()
    first, second = chat(KernelSaver(store)), chat(KernelSaver(store))
    await talk(first, range(5))
    at_five = await first.aget_state(CONFIG)
    await talk(second, range(5, 10))
    await talk(first, range(10, 12))  # goes on from the latest, the second's
    await first.ainvoke({"messages": [question(50)]}, at_five.config)  # and from its own turn 5
    for graph in (first, second, chat(KernelSaver(store))):
        history = [s async for s in graph.aget_state_history(CONFIG)]
        ends = sorted({tuple(m.id for m in s.values["messages"][::2]) for s in history
                       if s.values.get("messages") and not s.next}, key=len)
        assert ends[-1] == tuple(f"q{i}" for i in range(12))
        assert (*(f"q{i}" for i in range(5)), "q50") in ends


async def test_prune_and_delete_for_runs_leave_what_stays_readable(store_for: Callable[[], Checkpointer]) -> None:
    saver = KernelSaver(store_for())
    graph = chat(saver)
    await talk(graph, range(8))
    runs = [s.metadata.get("run_id") for s in [s async for s in graph.aget_state_history(CONFIG)]]
    await saver.adelete_for_runs([run for run in dict.fromkeys(runs) if run][2:5])  # three turns from the middle
    history = [s async for s in graph.aget_state_history(CONFIG)]
    assert all(len(s.values.get("messages", [])) % 2 == 0 or s.next for s in history)
    assert len((await graph.aget_state(CONFIG)).values["messages"]) == 16
    await saver.aprune(["chat"], strategy="keep_latest")
    [only] = [s async for s in graph.aget_state_history(CONFIG)]
    assert [m.id for m in only.values["messages"][::2]] == [f"q{i}" for i in range(8)]
    await talk(graph, range(8, 10))
    assert len((await graph.aget_state(CONFIG)).values["messages"]) == 20


async def test_records_of_the_earlier_encoding_read_and_serve_as_the_base_of_new_ones(
        store_for: Callable[[], Checkpointer]) -> None:
    """Checkpoints written whole (the encoding before this one: the serializer's typed bytes of
    the checkpoint and its metadata) read as they did, and what follows them is stored by what
    is new (after one copy of what they hold, into a stream)."""
    store = store_for()
    serde = JsonPlusSerializer()
    reference = chat(InMemorySaver())
    await talk(reference, range(5))
    for state in reversed([s async for s in reference.aget_state_history(CONFIG)]):
        saved = await reference.checkpointer.aget_tuple(state.config)
        kind, data = serde.dumps_typed({"checkpoint": saved.checkpoint, "metadata": saved.metadata})
        parent = saved.parent_config["configurable"]["checkpoint_id"] if saved.parent_config else None
        await store.put(Checkpoint("chat", "", saved.checkpoint["id"], kind.encode() + b"\x00" + data, parent,
                                   {"step": saved.metadata["step"]}))
    graph = chat(KernelSaver(store))
    assert len((await graph.aget_state(CONFIG)).values["messages"]) == 10
    await talk(graph, range(5, 7))
    before = await stored_bytes(store)
    await talk(graph, range(7, 10))
    assert [m.id for m in (await graph.aget_state(CONFIG)).values["messages"][::2]] == [f"q{i}" for i in range(10)]
    assert await stored_bytes(store) - before <= 3 * 3 * (USER + ANSWER)


async def test_a_list_item_changed_in_place_is_stored_as_changed() -> None:
    """A reducer that edits the list it was given and returns it: the parent's value (the same
    list object) is compared by its stored bytes, so the change is not taken for the old value."""

    graph_def = StateGraph(Counters)
    graph_def.add_node("bump", lambda state: {"items": [{"bump": 1}]})
    graph_def.add_edge(START, "bump")
    graph = graph_def.compile(checkpointer=KernelSaver(MemoryCheckpointer()))
    await graph.ainvoke({"items": [{"n": 0}]}, CONFIG)
    await graph.ainvoke({"items": []}, CONFIG)
    saver = KernelSaver(graph.checkpointer.checkpointer)  # nothing cached: a second saver reads the store
    values = (await saver.aget_tuple(CONFIG)).checkpoint["channel_values"]
    assert values["items"][0]["n"] == 2


async def test_a_growing_string_is_stored_by_what_is_new_and_reads_back_whole(
        store_for: Callable[[], Checkpointer]) -> None:
    """A string channel that grows at its end (a transcript): past the stream's bound it is
    kept as the pieces it grew by, and every checkpoint reads back its own text."""
    graph_def = StateGraph(Transcript)
    graph_def.add_node("say", lambda state: {"text": f" [{len(state['text'])}] " + prose(len(state["text"]), 500)})
    graph_def.add_edge(START, "say")
    store = store_for()
    graph = graph_def.compile(checkpointer=KernelSaver(store))
    for turn in range(40):
        await graph.ainvoke({"text": prose(turn, 500)}, CONFIG)
    texts = [s.values.get("text", "") async for s in graph.aget_state_history(CONFIG)]
    reference = graph_def.compile(checkpointer=InMemorySaver())
    for turn in range(40):
        await reference.ainvoke({"text": prose(turn, 500)}, CONFIG)
    assert texts == [s.values.get("text", "") async for s in reference.aget_state_history(CONFIG)]
    assert len(texts[0]) > 40_000 and await stored_bytes(store) < 6 * len(texts[0])  # whole at every step: 60x


@pytest.mark.slow
@pytest.mark.parametrize("invoke", ["ainvoke", "invoke"])
def test_a_kill_9_mid_conversation_resumes_with_every_message(tmp_path: Path, invoke: str) -> None:
    """A host talks turn after turn and is killed with SIGKILL at its tenth turn's step; a new
    process reads the thread, finds every message of the turns that finished in order, and
    talks on. With ``invoke`` (a sync graph), each step is appended from the graph's thread."""
    script = tmp_path / "host.py"
    talk_turn = ("await graph.ainvoke({\"messages\": [question(turn)]}, CONFIG)" if invoke == "ainvoke" else
                 "await asyncio.to_thread(graph.invoke, {\"messages\": [question(turn)]}, CONFIG)")
    script.write_text(textwrap.dedent(f"""
        import asyncio, sys
        sys.path.insert(0, {str(ROOT)!r})
        from ringzero.adapters.langgraph import KernelSaver
        from ringzero.checkpointers import SqliteCheckpointer
        from tests.test_langgraph_deltas import CONFIG, chat, question

        async def main():
            graph = chat(KernelSaver(SqliteCheckpointer(sys.argv[1])))
            for turn in range(1000):
                {talk_turn}
                print(turn, flush=True)

        asyncio.run(main())
    """))
    db = tmp_path / "chat.db"
    host = subprocess.Popen([sys.executable, str(script), str(db)], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert host.stdout is not None
    for line in host.stdout:
        if line.strip() == "9":
            break
    os.kill(host.pid, signal.SIGKILL)
    host.wait()
    host.stdout.close()

    async def resume() -> None:
        store = SqliteCheckpointer(db)
        graph = chat(KernelSaver(store))
        messages = (await graph.aget_state(CONFIG)).values["messages"]
        assert len(messages) >= 20 and [m.id for m in messages[::2]] == [f"q{i}" for i in range(len(messages[::2]))]
        await talk(graph, range(100, 102))
        after = (await graph.aget_state(CONFIG)).values["messages"]
        assert after[: len(messages)] == messages and [m.id for m in after[-4::2]] == ["q100", "q101"]
        await store.aclose()

    asyncio.run(resume())


async def test_a_graphs_input_is_stored_once_not_again_in_the_writes_of_the_task_that_reads_it(
        store_for: Callable[[], Checkpointer]) -> None:
    """LangGraph keeps a graph's input in its input checkpoint (``__start__``) and again in the
    pending writes of the task that reads it: the writes are deflated against the checkpoint
    they belong to, so the second copy costs a few bytes; a saver that never saw them (a new
    process) reads them back as LangGraph wrote them."""
    store = store_for()
    graph = chat(KernelSaver(store))
    reference = chat(InMemorySaver())
    for target in (graph, reference):
        await target.ainvoke({"messages": [HumanMessage(prose(7, 20_000), id="big")]}, CONFIG)
    input_state = [s async for s in graph.aget_state_history(CONFIG)][-1]
    assert input_state.metadata["source"] == "input"
    record = await store.get("chat", "", input_state.config["configurable"]["checkpoint_id"])
    assert record is not None and len(record.writes) == 2
    assert len(record.payload) > 5_000  # the input itself, deflated
    assert sum(len(w.value) for w in record.writes) < 500, [len(w.value) for w in record.writes]
    fresh = KernelSaver(store)
    theirs = [t async for t in reference.checkpointer.alist(CONFIG)]
    mine = [t async for t in fresh.alist(CONFIG)]
    assert [[(c, _plain(v)) for _, c, v in t.pending_writes] for t in mine] == \
        [[(c, _plain(v)) for _, c, v in t.pending_writes] for t in theirs]
    assert mine[-1].pending_writes[0][2][0].content == prose(7, 20_000)


def _plain(value: Any) -> Any:
    """A pending write's value with its messages as (type, content, id): the answer's id is a
    uuid ``add_messages`` drew in each run; the user's is given."""
    if isinstance(value, list):
        return [(m.type, m.content, m.id if isinstance(m, HumanMessage) else "") for m in value]
    return value


async def test_channel_versions_of_any_kind_read_back_as_they_were_put() -> None:
    """Versions as ``get_next_version`` makes them are stored as their numbers; any other
    (an int of a saver that counts, a float, a string of another form) is kept as it was."""
    from langgraph.checkpoint.base import empty_checkpoint

    saver = KernelSaver(MemoryCheckpointer())
    ours = saver.get_next_version(saver.get_next_version(None, None), None)
    versions = {"ours": ours, "count": 7, "float": 0.5, "odd": "00000000000000000000000000000002.1234567890123456",
                "short": "3", "zero": f"{0:032}.{0:016}"}
    checkpoint = {**empty_checkpoint(), "channel_versions": versions,
                  "versions_seen": {"node": {"ours": ours, "count": 6}, "other": {}},
                  "channel_values": {"ours": "a", "count": 1, "float": [1], "odd": None, "short": {}, "zero": 0}}
    config = await saver.aput({"configurable": {"thread_id": "t", "checkpoint_ns": ""}}, checkpoint, {}, versions)
    for reader in (saver, KernelSaver(saver.checkpointer)):
        read = (await reader.aget_tuple(config)).checkpoint  # type: ignore[union-attr]
        assert read["channel_versions"] == versions and type(read["channel_versions"]["count"]) is int
        assert read["versions_seen"] == checkpoint["versions_seen"]
        assert read["channel_values"] == checkpoint["channel_values"]


def test_a_sync_graph_appends_its_steps_from_its_own_thread(tmp_path: Path) -> None:
    """``graph.invoke`` on a SQLite store: each checkpoint and each task's writes are encoded and
    appended in the graph's threads (``append_here``: the caller's, and LangGraph's pool where it
    writes in the background), not handed to the saver's loop and waited for (but a checkpoint
    whose stream seals a segment, which deletes the pieces after); the thread reads back as an
    in-memory saver's does, in this saver and in a new one."""
    import threading

    class Watched(SqliteCheckpointer):
        def __init__(self, path: Path) -> None:
            super().__init__(path)
            self.threads: list[int] = []

        def append_here(self, checkpoint: Checkpoint) -> bool:
            taken = super().append_here(checkpoint)
            if taken:
                self.threads.append(threading.get_ident())
            return taken

        def append_many_here(self, checkpoints: Any) -> bool:
            taken = super().append_many_here(checkpoints)
            if taken:
                self.threads.append(threading.get_ident())
            return taken

        def append_writes_here(self, thread_id: str, namespace: str, checkpoint_id: str, writes: Any) -> bool:
            taken = super().append_writes_here(thread_id, namespace, checkpoint_id, writes)
            if taken:
                self.threads.append(threading.get_ident())
            return taken

    store = Watched(tmp_path / "chat.db")
    with KernelSaver(store) as saver:
        graph, reference = chat(saver), chat(InMemorySaver())
        for turn in range(12):
            graph.invoke({"messages": [question(turn)]}, CONFIG)
            reference.invoke({"messages": [question(turn)]}, CONFIG)
        loop = saver.home.loop
        assert loop is not None and not loop.is_closed()
        saver_thread = saver.home.run_sync(_thread_id(), "test")
        assert len(store.threads) >= 12 * 5 - 5 and saver_thread not in store.threads, len(store.threads)  # 5 a turn
        mine = [[m.content for m in s.values.get("messages", [])] for s in graph.get_state_history(CONFIG)]
        theirs = [[m.content for m in s.values.get("messages", [])] for s in reference.get_state_history(CONFIG)]
        assert mine == theirs and len(mine) == 36
    asyncio.run(store.aclose())
    again = SqliteCheckpointer(tmp_path / "chat.db")
    with KernelSaver(again) as saver:
        assert [m.id for m in chat(saver).get_state(CONFIG).values["messages"][::2]] == [f"q{i}" for i in range(12)]
    asyncio.run(again.aclose())


async def _thread_id() -> int:
    import threading

    return threading.get_ident()
