"""A LangGraph chat stored turn by turn: bytes on disk and the time to read the latest state.

The graph is one node on a ``messages`` channel with ``add_messages``; each turn sends 2,000
bytes of new user text and the node answers 200 bytes, so a turn adds about 2.2 KB of content
(``new content`` below: the messages' text). The text is words of a 2,000-word vocabulary, the
common ones most often (Zipf): zlib packs it about 2x, as it packs English prose (this
repository's README: 1.9x), where text of one repeated letter would flatter any store that
compresses (PostgreSQL does, past 2 KB). A saver that writes the whole channel at every
checkpoint stores O(turns^2) bytes. Measured per saver, in one run: the bytes its store holds
after 100, 200 and 1,000 turns (SQLite: the database file and every file beside it, after the
saver is closed; PostgreSQL: the saver's tables, ``pg_total_relation_size``), that divided by
the new content, and the median time of ``graph.aget_state`` on the thread's latest checkpoint.
On PostgreSQL also the live rows: the tables' bytes after ``VACUUM FULL``, without the dead
tuples MVCC keeps of deleted rows until a VACUUM makes their space reusable.

Peers in the same run: LangGraph's ``AsyncSqliteSaver`` and ``AsyncPostgresSaver``, run up to
``--peer-turns`` turns (their bytes grow with the square of the turns: 1,000 turns of them is
gigabytes). PostgreSQL rows run where ``RINGZERO_BENCH_POSTGRES_DSN`` names a server, or where
this machine has PostgreSQL's server programs (a server of the run's own is started then).

    .venv/bin/python benchmarks/chat_history.py [--turns 100 200 1000] [--peer-turns 200] [--reads 20]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import string
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager, contextmanager
from pathlib import Path
from typing import Annotated, Any

from _progress import step
from langchain_core.messages import AIMessage, AnyMessage, HumanMessage
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.graph import START, StateGraph
from langgraph.graph.message import add_messages
from rich.console import Console
from rich.table import Table
from typing_extensions import TypedDict

from ringzero.adapters.langgraph import KernelSaver
from ringzero.checkpointers import SqliteCheckpointer
from ringzero.core.contract.protocols import Checkpointer

USER_BYTES = 2000
ANSWER_BYTES = 200
VOCABULARY = ["".join(random.Random(i).choices(string.ascii_lowercase, k=2 + i % 8)) for i in range(2000)]
ZIPF = [1 / (rank + 1) for rank in range(2000)]


def prose(seed: int, size: int) -> str:
    return " ".join(random.Random(seed).choices(VOCABULARY, weights=ZIPF, k=size // 3))[:size]


class Chat(TypedDict):
    messages: Annotated[list[AnyMessage], add_messages]


def answer(state: Chat) -> dict[str, Any]:
    turn = len(state["messages"]) // 2
    return {"messages": [AIMessage(f"answer {turn:05d} " + prose(-turn - 1, ANSWER_BYTES - 13))]}


def chat_graph(saver: BaseCheckpointSaver[Any]) -> Any:
    graph = StateGraph(Chat)
    graph.add_node("model", answer)
    graph.add_edge(START, "model")
    return graph.compile(checkpointer=saver)


def user_text(turn: int) -> str:
    return f"question {turn:05d} " + prose(turn, USER_BYTES - 15)


Sized = tuple[AbstractAsyncContextManager[BaseCheckpointSaver[Any]], Callable[[], int], Callable[[], int] | None]
"""A saver to open, how many bytes its store holds (called after the saver is closed), and
(PostgreSQL) how many after ``VACUUM FULL``: its live rows, without the dead tuples MVCC keeps."""


def folder_bytes(folder: Path) -> int:
    return sum(path.stat().st_size for path in folder.iterdir() if path.is_file())


@asynccontextmanager
async def kernel_saver(store: Checkpointer) -> AsyncIterator[BaseCheckpointSaver[Any]]:
    """A KernelSaver over ``store``, both closed after."""
    saver = KernelSaver(store)
    try:
        yield saver
    finally:
        await store.aclose()
        await saver.aclose()


def kernel_sqlite(folder: Path) -> Sized:
    return kernel_saver(SqliteCheckpointer(folder / "chat.db")), lambda: folder_bytes(folder), None


def async_sqlite(folder: Path) -> Sized:
    from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver
    return AsyncSqliteSaver.from_conn_string(str(folder / "chat.db")), lambda: folder_bytes(folder), None


def table_bytes(dsn: str) -> int:
    import psycopg

    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0) FROM pg_class c "
                           "JOIN pg_namespace n ON n.oid = c.relnamespace "
                           "WHERE n.nspname = 'public' AND c.relkind = 'r'").fetchone()
    return int(row[0]) if row else 0


def live_bytes(dsn: str) -> int:
    """The tables' bytes after ``VACUUM FULL`` (which rewrites them without their dead tuples)."""
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("VACUUM FULL")
    return table_bytes(dsn)


def fresh_database(admin_dsn: str) -> str:
    import psycopg
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    name = f"chat_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    return make_conninfo(**{**conninfo_to_dict(admin_dsn), "dbname": name})


def kernel_postgres(admin_dsn: str) -> Sized:
    from ringzero.checkpointers import PostgresCheckpointer

    dsn = fresh_database(admin_dsn)
    return kernel_saver(PostgresCheckpointer(dsn)), lambda: table_bytes(dsn), lambda: live_bytes(dsn)


def async_postgres(admin_dsn: str) -> Sized:
    from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver

    dsn = fresh_database(admin_dsn)

    @asynccontextmanager
    async def opened() -> AsyncIterator[BaseCheckpointSaver[Any]]:
        async with AsyncPostgresSaver.from_conn_string(dsn) as saver:
            await saver.setup()
            yield saver
    return opened(), lambda: table_bytes(dsn), lambda: live_bytes(dsn)


@contextmanager
def postgres_server() -> Iterator[str | None]:
    """A DSN: the environment's, or a server of this run's own; None where neither can be had."""
    if os.environ.get("RINGZERO_BENCH_POSTGRES_DSN"):
        yield os.environ["RINGZERO_BENCH_POSTGRES_DSN"]
        return
    from ringzero.local_postgres import LocalPostgres, server_programs

    if server_programs() is None:
        yield None
        return
    with tempfile.TemporaryDirectory(prefix="chat-pg-") as folder:
        os.chmod(folder, 0o711)  # as root, the server runs as the postgres user, who must pass through
        server = LocalPostgres(Path(folder) / "pg")
        dsn = server.start()
        try:
            yield dsn
        finally:
            server.stop()


async def measure(sized: Sized, turns: int, reads: int) -> tuple[int, int | None, float]:
    """Bytes stored after ``turns`` turns (as the run leaves them, and live: None where the store
    keeps no dead rows), and the median seconds of reading the latest state."""
    opened, size, live = sized
    config = {"configurable": {"thread_id": "chat"}}
    async with opened as saver:
        graph = chat_graph(saver)
        for turn in range(turns):
            await graph.ainvoke({"messages": [HumanMessage(user_text(turn))]}, config)
        times = []
        for _ in range(reads):
            started = time.perf_counter()
            state = await graph.aget_state(config)
            times.append(time.perf_counter() - started)
        assert len(state.values["messages"]) == 2 * turns
    stored = size()
    return stored, None if live is None else live(), statistics.median(times)


async def main(turn_counts: list[int], peer_turns: int, reads: int) -> None:
    content = {n: n * (USER_BYTES + ANSWER_BYTES) for n in turn_counts}
    rows: list[tuple[str, int, int, int | None, float]] = []
    with postgres_server() as dsn:
        cases: list[tuple[str, Callable[[Path], Sized], int]] = [
            ("KernelSaver(SqliteCheckpointer)", kernel_sqlite, max(turn_counts)),
            ("AsyncSqliteSaver (LangGraph)", async_sqlite, peer_turns)]
        if dsn is not None:
            cases += [("KernelSaver(PostgresCheckpointer)", lambda _: kernel_postgres(dsn), max(turn_counts)),
                      ("AsyncPostgresSaver (LangGraph)", lambda _: async_postgres(dsn), peer_turns)]
        for name, make, most in cases:
            for turns in turn_counts:
                if turns > most:
                    continue
                with tempfile.TemporaryDirectory(prefix="chat-") as folder:
                    step(f"{name}: {turns} turns")
                    stored, live, read = await measure(make(Path(folder)), turns, reads)
                rows.append((name, turns, stored, live, read))
    table = Table(title=f"A chat of {USER_BYTES:,} + {ANSWER_BYTES} bytes a turn: what the store holds")
    for column in ("saver", "turns", "stored", "stored / new content", "x of half the turns", "live rows / new content",
                   "read latest (ms)"):
        table.add_column(column, justify="left" if column == "saver" else "right")
    by = {(name, turns): stored for name, turns, stored, _, _ in rows}
    for name, turns, stored, live, read in rows:
        half = by.get((name, turns // 2))
        table.add_row(name, f"{turns:,}", f"{stored / 1e6:,.2f} MB", f"{stored / content[turns]:,.1f}x",
                      f"{stored / half:.2f}x" if half else "",
                      "" if live is None else f"{live / content[turns]:,.1f}x", f"{read * 1000:.2f}")
    Console().print(table)
    if dsn is None:
        Console().print("PostgreSQL rows not run: no RINGZERO_BENCH_POSTGRES_DSN, no PostgreSQL server programs here")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, nargs="+", default=[100, 200, 1000])
    parser.add_argument("--peer-turns", type=int, default=200, help="the most turns LangGraph's savers run")
    parser.add_argument("--reads", type=int, default=20)
    options = parser.parse_args()
    asyncio.run(main(sorted(options.turns), options.peer_turns, options.reads))
