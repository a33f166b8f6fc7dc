"""Two things a framework's code needs from inside a kernel process (docs/frameworks.md):

1. **Sync code on a worker thread** (CrewAI's agents, a sync LangChain call, your own
   ``asyncio.to_thread``): the thread finds its process with ``Context.current()`` and makes a
   journaled syscall with ``ctx.call_from_thread(ctx.llm(...), "what")``. After a crash the call
   is answered from the journal, as one made on the loop is.
2. **Egress for a framework's code tool**: a LangGraph ``code_tool`` (or CrewAI's
   ``CodeExecutionTool``) runs its code on the executor it is given; give it one whose default
   limits carry an ``Egress`` policy, and the code reaches what the policy allows and nothing
   else (here a host off the list is refused, offline).

Runs offline: ``.venv/bin/python examples/threads_and_egress.py``.
"""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path
from typing import Any

from ringzero import Context, Egress, ExecLimits, Kernel
from ringzero.adapters.langgraph import code_tool
from ringzero.checkpointers import SqliteCheckpointer
from ringzero.providers.executors import MontyExecutor
from ringzero.testing import ScriptedProvider


def summarize_on_a_worker_thread(text: str) -> str:
    """Sync code, as a framework runs it on a thread of its own."""
    ctx = Context.current()  # the process this thread works for (asyncio.to_thread carries it)
    assert ctx is not None, "called outside a kernel process"
    reply = ctx.call_from_thread(ctx.llm(f"summarize: {text}"), "the summary")
    return reply.content


async def research(ctx: Context) -> dict[str, Any]:
    summary = await asyncio.to_thread(summarize_on_a_worker_thread, "ringzero runs agents as processes")
    fetcher = code_tool([], executor=MontyExecutor(limits=ExecLimits(
        egress=Egress(allow=["api.example.com"]))))  # the code may reach this host, and no other
    # through ctx.tool, the call is journaled whole (a graph's KernelToolNode does the same)
    refused = await ctx.tool(fetcher.ainvoke, {"code": "http_request('GET', 'https://elsewhere.example.org/data')"})
    return {"summary": summary, "elsewhere": refused}


async def main(folder: Path) -> None:
    model = ScriptedProvider(lambda request: f"short: {request.messages[-1].content[len('summarize: '):]}")
    async with Kernel(checkpointer=SqliteCheckpointer(folder / "state.db"), llm=model) as kernel:
        handle = await kernel.spawn(research)
        result = await handle.wait()
        journal = await kernel.store.journal(handle.pid)
    print(f"summary: {result['summary']}")
    print(f"the code's request to a host off the list: {result['elsewhere'].splitlines()[-1]}")
    print(f"syscalls journaled: {', '.join(entry.kind for entry in journal)}")


if __name__ == "__main__":
    with tempfile.TemporaryDirectory(prefix="ringzero-example-") as folder:
        asyncio.run(main(Path(folder)))
