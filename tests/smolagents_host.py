"""A host for ``tests/test_smolagents_adapter.py``: one kernel process on a SQLite store runs a
smolagents ``CodeAgent`` (the adapter's executor on Monty, or the process sandbox where
``AGENT_EXECUTOR`` says ``process``; a scripted model through the gate) whose three actions
define a function, pay three times with it, and answer with what the second step computed.
``AGENT_KILL=during`` makes the host kill itself with SIGKILL inside the second payment, once
(a marker file beside the log). Started again, it resumes what the store holds.

    python -m tests.smolagents_host <db> <log>
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path
from typing import Any

from smolagents import CodeAgent, tool

from ringzero import Context, Kernel
from ringzero.adapters.smolagents import KernelExecutor, KernelModel
from ringzero.checkpointers import SqliteCheckpointer
from ringzero.core.contract.types import LLMRequest
from ringzero.providers.executors import MontyExecutor, ProcessExecutor
from ringzero.testing import ScriptedProvider
from tests.hosts import logged_effect

ACTIONS = [
    "Thought: a helper first.\n<code>\ndef fee(amount):\n    return amount // 10\nprint(fee(100))\n</code>",
    "Thought: pay three times.\n<code>\npaid = [pay(n * 100 + fee(n * 100)) for n in (1, 2, 3)]\nprint(paid)\n</code>",
    "Thought: done.\n<code>\nfinal_answer(sum(int(p.split()[1]) for p in paid))\n</code>",
]


@tool
def pay(amount: int, idempotency_key: str = "") -> str:
    """Pays an amount: an effect, logged as it starts and ends with the key the kernel gave it.

    Args:
        amount: what to pay.
        idempotency_key: set by the host, never by the model.
    """
    logged_effect(Path(os.environ["AGENT_LOG"]), amount, idempotency_key,
                  die_inside=os.environ.get("AGENT_KILL") == "during" and amount == 220)
    return f"paid {amount}"


def script(request: LLMRequest) -> str:
    """The next action: by how many the model has written already (smolagents adds the calls
    it made as assistant turns of its own). A resumed agent's model is served its answers from
    the journal: this is asked only for the ones not recorded."""
    written = sum(m.role == "assistant" and m.content.startswith("Thought:") for m in request.messages)
    return ACTIONS[min(written, len(ACTIONS) - 1)]


def executor() -> Any:
    return ProcessExecutor() if os.environ.get("AGENT_EXECUTOR") == "process" else MontyExecutor()


async def program(ctx: Context) -> Any:
    agent = CodeAgent(tools=[pay], model=KernelModel(), executor=KernelExecutor(), verbosity_level=-1)
    return await asyncio.to_thread(agent.run, "Pay 110, 220 and 330, then say what was paid in all.")


async def main(db: str) -> None:
    async with Kernel(llm=ScriptedProvider(script), checkpointer=SqliteCheckpointer(db), executor=executor(),
                      monitor_interval=None) as kernel:
        handles = await kernel.recover({"program": program})
        if not handles:
            handles = [await kernel.spawn(program, name="program")]
        for handle in handles:
            print("answer", await handle.wait(timeout=120), flush=True)


if __name__ == "__main__":
    os.environ["AGENT_LOG"] = sys.argv[2]
    asyncio.run(main(sys.argv[1]))
