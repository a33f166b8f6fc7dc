"""One side of a human-in-the-loop graph whose two halves run in separate Python processes.

    python -m tests.interrupt_host start DB    # runs until the graph asks for approval (sync API)
    python -m tests.interrupt_host resume DB ANSWER   # resumes it with Command(resume=ANSWER) (async API,
                                                      # sync before Python 3.11, where LangGraph needs it)

Each prints one JSON line: what the graph returned and the number of checkpoints it can see.
The graph's draft step runs in a sandbox; every node records the pid of the process it ran in.
"""

from __future__ import annotations

import asyncio
import json
import operator
import os
import sys
from typing import Annotated, Any

from langgraph.graph import END, START, StateGraph
from langgraph.types import Command, interrupt
from typing_extensions import TypedDict

from ringzero.adapters.langgraph import KernelSaver, sandboxed
from ringzero.checkpointers import SqliteCheckpointer
from tests.tool_bodies import word_stats

CONFIG: Any = {"configurable": {"thread_id": "review-1"}}


class Review(TypedDict):
    text: str
    log: Annotated[list[str], operator.add]
    ran_in: Annotated[list[int], operator.add]


def build(saver: KernelSaver) -> Any:
    stats = sandboxed(word_stats)

    def draft(state: Review) -> dict[str, Any]:
        summary = stats.invoke({"text": state["text"], "top": 1})
        return {"log": [f"draft: {summary['words']} words, mostly {summary['top'][0]!r}"], "ran_in": [os.getpid()]}

    def approve(state: Review) -> dict[str, Any]:
        answer = interrupt("publish the draft?")
        return {"log": [f"approved: {answer}"], "ran_in": [os.getpid()]}

    def publish(state: Review) -> dict[str, Any]:
        return {"log": ["published"], "ran_in": [os.getpid()]}

    graph = StateGraph(Review)
    graph.add_node("draft", draft)
    graph.add_node("approve", approve)
    graph.add_node("publish", publish)
    graph.add_edge(START, "draft")
    graph.add_edge("draft", "approve")
    graph.add_edge("approve", "publish")
    graph.add_edge("publish", END)
    return graph.compile(checkpointer=saver)


def start(db: str) -> dict[str, Any]:
    saver = KernelSaver(SqliteCheckpointer(db))
    app = build(saver)
    result = app.invoke({"text": "ship it ship it now", "log": [], "ran_in": []}, CONFIG)
    return {"interrupt": [i.value for i in result["__interrupt__"]], "log": result["log"],
            "ran_in": result["ran_in"], "next": list(app.get_state(CONFIG).next),
            "checkpoints": len(list(app.get_state_history(CONFIG)))}


async def resume(db: str, answer: str) -> dict[str, Any]:
    store = SqliteCheckpointer(db)
    app = build(KernelSaver(store))
    if sys.version_info >= (3, 11):
        result = await app.ainvoke(Command(resume=answer), CONFIG)
    else:  # LangGraph's interrupt() cannot find its config under ainvoke before Python 3.11 (any saver)
        result = await asyncio.to_thread(app.invoke, Command(resume=answer), CONFIG)
    history = [s async for s in app.aget_state_history(CONFIG)]
    await store.aclose()
    return {"log": result["log"], "ran_in": result["ran_in"], "checkpoints": len(history)}


if __name__ == "__main__":
    outcome = start(sys.argv[2]) if sys.argv[1] == "start" else asyncio.run(resume(sys.argv[2], sys.argv[3]))
    print(json.dumps(outcome), flush=True)
