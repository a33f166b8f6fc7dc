"""The replay rule, with programs written the way users write them.

A resumed program runs again from the top; ``ctx.state`` starts as it was at spawn and is
rebuilt by the replay; every recorded effect (a model call, a tool, a tool called from code)
is served from the journal; a tool call that was in flight at the crash is in doubt and runs
again only where that is safe.

Each crash here is a kernel shut down while one call hangs: it leaves the store as a kill -9
at that moment would (the hanging call's intent recorded, its result not). The kill -9 trials
(``tests/test_kill_trials.py``) do the same with real SIGKILLs.
"""

from __future__ import annotations

import asyncio
import datetime
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

import ringzero
from ringzero import Context, Kernel, NonDeterminismError, ProcessFailed, ToolInDoubt
from ringzero.checkpointers import SqliteCheckpointer
from ringzero.core.contract.types import LLMRequest
from ringzero.testing import ScriptedProvider
from tests.executors import full_cpython_only

CALLS: Counter[str] = Counter()
"""Every call that reached a provider or a tool, as ``llm <prompt>`` or ``<tool> <args>``."""
HANG_AT: set[str] = set()
"""Calls that hang (the host "dies" in them): what the first kernel of a test sees."""
KEYS: list[str] = []


@pytest.fixture(autouse=True)
def fresh_counts() -> None:
    CALLS.clear()
    HANG_AT.clear()
    KEYS.clear()


async def _reach(call: str) -> None:
    """Count ``call``; hang if the host is to die in it."""
    CALLS[call] += 1
    if call in HANG_AT:
        await asyncio.Event().wait()


async def answer(request: LLMRequest) -> str:
    prompt = request.messages[-1].content
    await _reach(f"llm {prompt}")
    return f"answer to {prompt}"


async def pay(i: int) -> int:
    await _reach(f"pay {i}")
    return i * 10


@ringzero.idempotent
async def read_balance(i: int) -> int:
    await _reach(f"read_balance {i}")
    return 100 + i


async def charge(i: int, idempotency_key: str = "") -> int:
    KEYS.append(idempotency_key)
    await _reach(f"charge {i}")
    return i


TOOLS = {"pay": pay, "read_balance": read_balance, "charge": charge}


# ----------------------------------------------------------------- the programs
async def skip_done_work(ctx: Context, n: int) -> list[str]:
    notes = ctx.state.setdefault("notes", [])
    for step in range(len(notes), n):
        reply = await ctx.llm(f"step {step}")
        notes.append(reply.content)
        await ctx.checkpoint()
    return notes


async def append_to_state(ctx: Context, n: int) -> list[int]:
    for step in range(n):
        await ctx.llm(f"log {step}")
        ctx.state.setdefault("log", []).append(step)
        await ctx.checkpoint()
    return ctx.state["log"]  # type: ignore[return-value]


PAY_FIVE = "total = 0\nfor i in range(5):\n    total = total + pay(i)\ntotal"


async def pays_from_code(ctx: Context) -> Any:
    try:
        out = await ctx.exec(PAY_FIVE, tools={"pay": pay})
    except ToolInDoubt as exc:
        return {"in doubt": exc.tool, "slot": exc.slot}
    return out.value


async def charges_from_code(ctx: Context) -> Any:
    code = "total = 0\nfor i in range(5):\n    total = total + charge(i) + read_balance(i)\ntotal"
    out = await ctx.exec(code, tools={"charge": charge, "read_balance": read_balance})
    return out.value


async def pays_with_ctx_tool(ctx: Context) -> Any:
    total = 0
    for i in range(3):
        try:
            total += await ctx.tool("pay", i)  # type: ignore[operator]
        except ToolInDoubt:
            total += 1000
    return total


async def idempotent_ctx_tools(ctx: Context) -> Any:
    return [await ctx.tool("read_balance", 1), await ctx.tool("charge", 2)]


async def clock_and_dice(ctx: Context) -> Any:
    when, draw, ident = await ctx.now(), await ctx.random(), await ctx.uuid()
    await ctx.llm(f"hang {draw}")
    return [when.isoformat(), draw, str(ident)]


async def wall_clock_in_state(ctx: Context) -> Any:
    ctx.state["started"] = time.time()  # not journaled: a replay rebuilds another value
    await ctx.checkpoint()
    await ctx.llm("after the checkpoint")
    return ctx.state["started"]


async def prompt_from_wall_clock(ctx: Context) -> Any:
    await ctx.llm(f"what happened at {time.time()}?")
    await ctx.llm("second")
    return None


# ------------------------------------------------------------------- helpers
def kernel_on(db: Path, executor: Any = None) -> Kernel:
    return Kernel(checkpointer=SqliteCheckpointer(db), llm=ScriptedProvider(answer), tools=TOOLS, executor=executor)


async def crash_in(db: Path, hang_at: str, program: Any, *args: Any, executor: Any = None) -> int:
    """Run ``program`` until it hangs in ``hang_at``, then shut its kernel down as a crash would."""
    HANG_AT.add(hang_at)
    async with kernel_on(db, executor) as kernel:
        handle = await kernel.spawn(program, *args)
        for _ in range(500):
            if CALLS[hang_at]:
                break
            await asyncio.sleep(0.01)
        assert CALLS[hang_at] == 1, f"the program never reached {hang_at!r}"
        pid = handle.pid
    HANG_AT.clear()
    return pid


async def resume(db: Path, executor: Any = None) -> Any:
    async with kernel_on(db, executor) as kernel:
        [handle] = await kernel.recover()
        return await handle.wait(timeout=30)


async def uninterrupted(db: Path, program: Any, *args: Any) -> Any:
    async with kernel_on(db) as kernel:
        handle = await kernel.spawn(program, *args)
        return await handle.wait(timeout=30)


# --------------------------------------------------------------------- tests
async def test_a_loop_that_skips_work_already_in_the_state_resumes_with_the_uninterrupted_result(
        tmp_path: Path) -> None:
    expected = await uninterrupted(tmp_path / "reference.db", skip_done_work, 5)
    CALLS.clear()
    await crash_in(tmp_path / "state.db", "llm step 3", skip_done_work, 5)
    assert await resume(tmp_path / "state.db") == expected
    assert all(CALLS[f"llm step {i}"] == 1 for i in range(3)), CALLS  # journaled: never asked again
    assert CALLS["llm step 4"] == 1


async def test_a_loop_that_appends_to_the_state_resumes_without_repeating_entries(tmp_path: Path) -> None:
    await crash_in(tmp_path / "state.db", "llm log 3", append_to_state, 6)
    assert await resume(tmp_path / "state.db") == [0, 1, 2, 3, 4, 5]
    assert [CALLS[f"llm log {i}"] for i in range(6)] == [1, 1, 1, 2, 1, 1]  # only the call in flight again


async def test_tools_called_from_code_are_served_from_the_journal_and_the_one_in_flight_is_in_doubt(
        tmp_path: Path) -> None:
    await crash_in(tmp_path / "state.db", "pay 2", pays_from_code)
    got = await resume(tmp_path / "state.db")
    assert got == {"in doubt": "pay", "slot": "1.3"}
    assert [CALLS[f"pay {i}"] for i in range(5)] == [1, 1, 1, 0, 0]  # none ran twice
    # Decided once, the same way on every later replay: the in-doubt outcome is journaled.
    async with kernel_on(tmp_path / "state.db") as kernel:
        journal = await kernel.store.journal(1)
    assert [e.kind for e in journal] == ["exec"] and "in_doubt" in journal[0].outcome.to_json()


async def test_tools_safe_to_repeat_run_again_with_the_same_idempotency_key(tmp_path: Path) -> None:
    expected = await uninterrupted(tmp_path / "reference.db", charges_from_code)
    first_keys = list(KEYS)
    CALLS.clear()
    KEYS.clear()
    await crash_in(tmp_path / "state.db", "charge 2", charges_from_code)
    assert await resume(tmp_path / "state.db") == expected == sum(i + 100 + i for i in range(5))
    assert [CALLS[f"charge {i}"] for i in range(5)] == [1, 1, 2, 1, 1]  # the in-doubt one again, by its key
    assert [CALLS[f"read_balance {i}"] for i in range(5)] == [1, 1, 1, 1, 1]
    assert KEYS[2] == KEYS[3], "the retry of charge(2) carries the key of its first attempt"
    assert len(set(KEYS)) == 5 and len(set(first_keys) | set(KEYS)) == 10, "one key per call, per process"


async def test_an_in_doubt_ctx_tool_raises_tool_in_doubt_in_the_program(tmp_path: Path) -> None:
    await crash_in(tmp_path / "state.db", "pay 1", pays_with_ctx_tool)
    assert await resume(tmp_path / "state.db") == 0 + 1000 + 20
    assert [CALLS[f"pay {i}"] for i in range(3)] == [1, 1, 1]


async def test_an_in_doubt_ctx_tool_that_is_safe_to_repeat_runs_again_with_its_key(tmp_path: Path) -> None:
    await crash_in(tmp_path / "state.db", "charge 2", idempotent_ctx_tools)
    assert await resume(tmp_path / "state.db") == [101, 2]
    assert CALLS["read_balance 1"] == 1 and CALLS["charge 2"] == 2
    assert KEYS[0] == KEYS[1] and KEYS[0].startswith("rz-1-")


async def test_time_and_chance_are_the_same_when_replayed(tmp_path: Path) -> None:
    db = tmp_path / "state.db"
    async with Kernel(checkpointer=SqliteCheckpointer(db), llm=ScriptedProvider(_hang_always)) as kernel:
        await kernel.spawn(clock_and_dice)
        while not CALLS:
            await asyncio.sleep(0.01)
    got = await resume(db)
    async with kernel_on(db) as kernel:
        journal = await kernel.store.journal(1)
    when, draw, ident = (e.outcome.to_json()["value"] for e in journal[:3])
    assert isinstance(when, float) and abs(when - time.time()) < 60
    assert isinstance(draw, float) and 0 <= draw < 1 and uuid.UUID(str(ident)).version == 4
    assert got == [datetime.datetime.fromtimestamp(when, datetime.timezone.utc).isoformat(), draw, ident]


async def _hang_always(request: LLMRequest) -> str:
    CALLS[f"llm {request.messages[-1].content}"] += 1
    await asyncio.Event().wait()
    raise AssertionError("unreachable")


async def test_a_replayed_checkpoint_names_the_state_keys_the_replay_rebuilt_differently(tmp_path: Path) -> None:
    await crash_in(tmp_path / "state.db", "llm after the checkpoint", wall_clock_in_state)
    with pytest.raises(ProcessFailed) as failed:
        await resume(tmp_path / "state.db")
    assert failed.value.error is not None
    assert failed.value.error["type"] == "NonDeterminismError"
    assert "ctx.state differs from the state recorded there in 'started'" in failed.value.error["message"]


async def test_non_determinism_shows_both_prompts(tmp_path: Path) -> None:
    HANG_AT.add("llm second")
    async with kernel_on(tmp_path / "state.db") as kernel:
        await kernel.spawn(prompt_from_wall_clock)
        while not CALLS["llm second"]:
            await asyncio.sleep(0.01)
    HANG_AT.clear()
    with pytest.raises(ProcessFailed) as failed:
        await resume(tmp_path / "state.db")
    assert failed.value.error is not None
    message = failed.value.error["message"]
    assert failed.value.error["type"] == "NonDeterminismError"
    recorded, _, asked = message.partition(" but the resumed program now asks for ")
    assert "syscall #1 was recorded as llm(1 messages to default, last user 'what happened at" in recorded
    assert asked.startswith("llm(1 messages to default, last user 'what happened at")
    assert recorded.split("what happened at")[1].split("?")[0] != asked.split("what happened at")[1].split("?")[0]


def test_a_divergence_whose_summaries_read_the_same_names_the_fingerprints() -> None:
    from ringzero.core._engine.journal import diverged

    error = diverged(3, "4", ("llm", "aaaa", "2 messages to default"), ("llm", "bbbb", "2 messages to default"))
    assert isinstance(error, NonDeterminismError)
    assert "fingerprint aaaa was recorded, bbbb is asked" in str(error)


# ------------------------------------------------------------------ continue-as-new
async def mail_loop(ctx: Context, runs: int = 0) -> Any:
    """Handles three messages a run, then starts a new run: a journal that never grows past one run."""
    for _ in range(3):
        message = await ctx.recv()
        if message == "stop":
            return {"seen": ctx.state.get("seen", []), "runs": runs}
        reply = await ctx.llm(f"handle {message}")
        ctx.state.setdefault("seen", []).append(reply.content)
        await ctx.checkpoint()
    await ctx.continue_as_new(runs + 1)


async def test_continue_as_new_starts_a_fresh_run_with_the_state_and_an_empty_journal(tmp_path: Path) -> None:
    async with kernel_on(tmp_path / "state.db") as kernel:
        handle = await kernel.spawn(mail_loop)
        for i in range(7):
            await handle.send(f"m{i}")
        await handle.send("stop")
        got = await handle.wait(timeout=30)
        journal = await kernel.store.journal(handle.pid)
    assert got == {"seen": [f"answer to handle m{i}" for i in range(7)], "runs": 2}
    assert [e.seq for e in journal] == list(range(19, 19 + len(journal))), "only the last run's journal is kept"
    assert all(CALLS[f"llm handle m{i}"] == 1 for i in range(7))


async def test_a_resume_replays_only_the_current_run_and_receives_no_mail_twice(tmp_path: Path) -> None:
    db = tmp_path / "state.db"
    HANG_AT.add("llm handle m4")
    async with kernel_on(db) as kernel:
        handle = await kernel.spawn(mail_loop)
        for i in range(6):
            await handle.send(f"m{i}")
        while not CALLS["llm handle m4"]:
            await asyncio.sleep(0.01)
    HANG_AT.clear()
    async with kernel_on(db) as kernel:
        [handle] = await kernel.recover()
        await handle.send("stop")
        got = await handle.wait(timeout=30)
        assert handle.replayed_syscalls == 4  # the second run's: recv m3, its llm and checkpoint, recv m4
    assert got == {"seen": [f"answer to handle m{i}" for i in range(6)], "runs": 2}
    assert [CALLS[f"llm handle m{i}"] for i in range(6)] == [1, 1, 1, 1, 2, 1]  # only the call in flight again


async def test_every_sandbox_serves_recorded_tool_calls_and_repeats_only_the_keyed_one_in_flight(
        tmp_path: Path, sandbox: Any) -> None:
    await crash_in(tmp_path / "state.db", "charge 2", charges_from_code, executor=sandbox)
    assert await resume(tmp_path / "state.db", sandbox) == sum(i + 100 + i for i in range(5))
    assert [CALLS[f"charge {i}"] for i in range(5)] == [1, 1, 2, 1, 1]
    assert [CALLS[f"read_balance {i}"] for i in range(5)] == [1, 1, 1, 1, 1]
    assert KEYS[2] == KEYS[3]


async def code_with_chance(ctx: Context) -> Any:
    code = "import random\npay(random.randrange(10**9))\npay(2)\n'paid'"
    return (await ctx.exec(code, tools={"pay": pay})).value


@full_cpython_only
async def test_code_whose_tool_calls_differ_when_run_again_fails_with_both_calls_shown(
        tmp_path: Path, sandbox: Any) -> None:
    await crash_in(tmp_path / "state.db", "pay 2", code_with_chance, executor=sandbox)
    with pytest.raises(ProcessFailed) as failed:
        await resume(tmp_path / "state.db", sandbox)
    assert failed.value.error is not None and failed.value.error["type"] == "NonDeterminismError"
    message = failed.value.error["message"]
    assert "syscall #1.1 was recorded as tool(pay(" in message and "now asks for tool(pay(" in message, message
    assert CALLS["pay 2"] == 1, "the run stopped at the divergence: no tool after it ran"
