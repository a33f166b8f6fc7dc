"""Code a tool runs inside a kernel process journals its nested calls under the tool call's
slot: a LangGraph ``code_tool`` run by ``KernelToolNode`` whose code makes three keyed charges,
stopped during the second. The run_python call is in doubt; an operator settles it with
``run_again`` and retries the process: the finished charge is answered from the journal, the
one in flight runs again under its own key, and the third runs once."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import HumanMessage
from langchain_core.tools import tool

from ringzero import Context, Kernel, ProcessFailed
from ringzero.adapters.langgraph import KernelToolNode, code_tool
from ringzero.checkpointers import SqliteCheckpointer
from ringzero.core._engine.operating import settle
from ringzero.core.contract.outcomes import InDoubt
from tests.test_kernel_tool_node import graph_with, summary

CHARGED: list[tuple[int, str]] = []
HANG_AT: set[int] = set()


@tool
async def charge(amount: int, idempotency_key: str = "") -> str:
    """Charge a card once per idempotency key."""
    CHARGED.append((amount, idempotency_key))
    if amount in HANG_AT:
        await asyncio.sleep(3600)  # the host dies while this charge runs
    return f"charged {amount}"


async def pays_from_code(ctx: Context) -> list[str]:
    node = KernelToolNode([code_tool([charge])])
    calls = [{"name": "run_python", "args": {"code": "[charge(1), charge(2), charge(3)]"}}]
    return summary(await graph_with(node, calls).ainvoke({"messages": [HumanMessage("go")]}))


async def test_a_code_tool_s_finished_calls_are_answered_from_the_journal_when_it_runs_again(
        tmp_path: Path) -> None:
    CHARGED.clear()
    db = tmp_path / "state.db"
    HANG_AT.add(2)
    try:
        async with Kernel(checkpointer=SqliteCheckpointer(db)) as kernel:
            handle = await kernel.spawn(pays_from_code, name="pays")
            while len(CHARGED) < 2:
                await asyncio.sleep(0.005)
            pid = handle.pid
    finally:
        HANG_AT.clear()
    programs = {"pays": pays_from_code}
    async with Kernel(checkpointer=SqliteCheckpointer(db)) as kernel:
        [handle] = await kernel.recover(programs=programs)
        with pytest.raises(ProcessFailed, match=r"ToolInDoubt.*run_python"):
            await handle.wait(timeout=30)
        intents = await kernel.store.intents(pid)
        assert {"1.1", "1.2"} <= set(intents), intents  # the code's charges, under the tool call's slot (1)
        [slot] = [str(e.seq) for e in await kernel.store.journal(pid) if isinstance(e.outcome, InDoubt)]
        assert slot == "1"
        await settle(kernel.store, pid, slot, run_again=True)
        retried = await kernel.retry(pid, programs=programs)
        got: Any = await retried.wait(timeout=30)
    assert got == ["run_python:success:Result: ['charged 1', 'charged 2', 'charged 3']"], got
    amounts = [amount for amount, _ in CHARGED]
    assert amounts == [1, 2, 2, 3], CHARGED  # the finished charge once; the one in flight again, under its key
    assert CHARGED[1][1] == CHARGED[2][1] != CHARGED[0][1]


async def pays_from_a_crew(ctx: Context) -> str:
    from crewai import Agent, Crew, Task

    from ringzero.adapters.crewai import CodeExecutionTool, KernelLLM, kickoff
    from tests import crew_programs

    payer = Agent(role="payer", goal="pay bills", backstory="You pay from code.", llm=KernelLLM(),
                  tools=[CodeExecutionTool([crew_programs.charge])], max_iter=3)
    bill = Task(description="use run_python with code=<<[charge('1'), charge('2')]>>", expected_output="receipts",
                agent=payer)
    return str((await kickoff(Crew(agents=[payer], tasks=[bill]))).raw)


async def test_a_crewai_code_tool_under_kickoff_journals_the_code_s_calls_under_its_run(tmp_path: Path) -> None:
    """Behind ``kickoff``, the crew's ``CodeExecutionTool`` is an exec of the process, and each
    charge its code makes a keyed call under that exec's slot."""
    from ringzero.testing import ScriptedProvider
    from tests import crew_programs

    crew_programs.CHARGE_KEYS.clear()
    async with Kernel(checkpointer=SqliteCheckpointer(tmp_path / "state.db"),
                      llm=ScriptedProvider(crew_programs.react_script)) as kernel:
        handle = await kernel.spawn(pays_from_a_crew)
        assert "charged 2" in await handle.wait(timeout=60)
        kinds = {entry.seq: entry.kind for entry in await kernel.store.journal(handle.pid)}
        nested = sorted(key for key in await kernel.store.intents(handle.pid) if "." in key)
    [run] = [seq for seq, kind in kinds.items() if kind == "exec"]
    assert nested == [f"{run}.1", f"{run}.2"], (kinds, nested)
    assert [key.rsplit("-", 1)[1] for key in crew_programs.CHARGE_KEYS] == nested  # each under its own key
