"""LLM calls made from inside sandboxed code (``ctx.nested_llm``): budgets count them, also after a resume."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from ringzero import Kernel
from ringzero.checkpointers import SqliteCheckpointer
from ringzero.core.contract.protocols import Executor
from ringzero.core.contract.types import LLMRequest
from ringzero.testing import ScriptedProvider
from tests.programs import asks_inside_code


def echo(request: LLMRequest) -> str:
    return f"heard {request.messages[-1].content}"


async def test_nested_calls_are_charged_live_and_again_after_a_resume(sandbox: Executor, tmp_path: Path) -> None:
    clean_model = ScriptedProvider(echo)
    async with Kernel(checkpointer=SqliteCheckpointer(tmp_path / "clean.db"), executor=sandbox,
                      llm=clean_model) as kernel:
        clean = await kernel.spawn(asks_inside_code)
        expected = await clean.wait()
        spent = clean.info()
    assert expected == [["heard one two three", "heard four five"], "heard and finally"]
    assert (spent.llm_calls, clean_model.calls) == (3, 3)

    async def hangs_on_the_last(request: LLMRequest) -> str:
        if request.messages[-1].content == "and finally":
            await asyncio.sleep(60)  # the host goes down after the exec was recorded
        return echo(request)

    first_model, db = ScriptedProvider(hangs_on_the_last), tmp_path / "k.db"
    host = Kernel(checkpointer=SqliteCheckpointer(db), executor=sandbox, llm=first_model)
    await host.spawn(asks_inside_code)
    while first_model.calls < 3:
        await asyncio.sleep(0.01)
    await host.aclose()
    second_model = ScriptedProvider(echo)
    async with Kernel(checkpointer=SqliteCheckpointer(db), executor=sandbox, llm=second_model) as kernel:
        [resumed] = await kernel.recover()
        result: Any = await asyncio.wait_for(resumed.wait(), 30)
        after = resumed.info()
    assert result == expected and second_model.calls == 1  # the nested calls were not made again...
    assert (after.llm_calls, after.tokens) == (spent.llm_calls, spent.tokens)  # ...but still count
