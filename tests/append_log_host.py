"""A host process for the append log's kill -9 tests.

``python -m tests.append_log_host appends DB N``: a SqliteCheckpointer on DB appends N records
(thread ``t``), prints the log's path and its fold count, and kills itself with SIGKILL at once.
``python -m tests.append_log_host kernel DB N``: a kernel on DB runs ``asks_then_dies`` with N
LLM calls, which kills this host the moment its last call returns; it prints the pid first.
``python -m tests.append_log_host graph DB N``: a LangGraph graph of N nodes on
``KernelSaver(SqliteCheckpointer(DB))`` runs once on thread ``g``, with no fold on a timer;
this host prints the final state's number of steps and kills itself the moment ``ainvoke`` returns.
``python -m tests.append_log_host idle DB N``: a kernel on DB spawns N processes waiting in
``ctx.recv()``, with no fold on a timer, prints their pids and kills itself once all are waiting.
"""

from __future__ import annotations

import asyncio
import operator
import os
import signal
import sys
from typing import Annotated

from langgraph.graph import END, START, StateGraph
from typing_extensions import TypedDict

from ringzero import Kernel
from ringzero.adapters.langgraph import KernelSaver
from ringzero.checkpointers import SqliteCheckpointer
from ringzero.checkpointers.sqlite import folds as sqlite
from ringzero.core.contract.types import Checkpoint
from ringzero.testing import ScriptedProvider
from tests.programs import asks_then_dies, receiver


async def appends(db: str, n: int) -> None:
    store = SqliteCheckpointer(db)
    await store.get("nothing")  # opened
    for i in range(n):
        await store.append(Checkpoint("t", "", f"{i:04d}", f"record {i}".encode(), metadata={"i": i}))
    assert store.appends.log is not None
    print(store.appends.log.path, store.folds, flush=True)
    os.kill(os.getpid(), signal.SIGKILL)


async def kernel(db: str, n: int) -> None:
    os.environ["RINGZERO_TEST_DIE_AFTER_CALLS"] = "1"
    async with Kernel(checkpointer=SqliteCheckpointer(db), llm=ScriptedProvider(lambda r: "answer")) as k:
        process = await k.spawn(asks_then_dies, n, name="asker")
        print(process.pid, flush=True)
        await process.wait()


class Steps(TypedDict):
    steps: Annotated[list[str], operator.add]


async def graph(db: str, n: int) -> None:
    builder = StateGraph(Steps)
    names = [f"step{i}" for i in range(n)]
    for name in names:
        builder.add_node(name, lambda state, name=name: {"steps": [name]})
    for a, b in zip([START, *names], [*names, END], strict=True):
        builder.add_edge(a, b)
    sqlite.FOLD_AFTER = 3600.0  # no fold on a timer: this machine may take longer than FOLD_AFTER for a graph
    saver = KernelSaver(SqliteCheckpointer(db))
    app = builder.compile(checkpointer=saver)
    config = {"configurable": {"thread_id": "g"}}
    done = await app.ainvoke({"steps": []}, config)  # type: ignore[arg-type]
    print(len(done["steps"]), flush=True)  # no read of the thread before the kill: a read would fold its log
    os.kill(os.getpid(), signal.SIGKILL)


async def idle(db: str, n: int) -> None:
    sqlite.FOLD_AFTER = 3600.0
    async with Kernel(checkpointer=SqliteCheckpointer(db)) as k:
        handles = [await k.spawn(receiver, 1, name=f"idle-{i}") for i in range(n)]
        await k.flush()  # every process's way to waiting is written
        print(" ".join(str(h.pid) for h in handles), flush=True)
        os.kill(os.getpid(), signal.SIGKILL)


if __name__ == "__main__":
    hosts = {"appends": appends, "kernel": kernel, "graph": graph, "idle": idle}
    asyncio.run(hosts[sys.argv[1]](sys.argv[2], int(sys.argv[3])))
