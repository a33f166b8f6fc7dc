"""Syscalls through ctx: llm, exec, tool, send/recv, spawn, checkpoint, sleep, state."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from ringzero import Context, Kernel, Limits, Message, ProcessStatus
from ringzero.core.contract.errors import NoProvider, ProcessFailed, ProcessStateError, ToolFailed, ToolNotFound
from ringzero.testing import MemoryCheckpointer, ScriptedProvider
from tests.programs import receiver


async def test_llm_accepts_plain_dicts_and_typed_messages() -> None:
    provider = ScriptedProvider(["one", "two"])

    async def program(ctx: Context) -> list[str]:
        a = await ctx.llm([{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}])
        b = await ctx.llm([Message("user", "again")], model="m-1", max_tokens=5)
        return [a.content, b.content]

    async with Kernel(checkpointer=MemoryCheckpointer(), llm=provider) as kernel:
        assert await (await kernel.spawn(program)).wait() == ["one", "two"]
    assert [m.role for m in provider.requests[0].messages] == ["system", "user"]
    assert provider.requests[1].model == "m-1" and provider.requests[1].max_tokens == 5


async def test_llm_without_a_provider_names_the_problem() -> None:
    async def program(ctx: Context) -> None:
        await ctx.llm("hello")

    async with Kernel(checkpointer=MemoryCheckpointer()) as kernel:
        p = await kernel.spawn(program)
        with pytest.raises(Exception, match="no LLM provider named 'default'"):
            await p.wait()
        assert p.error is not None and p.error["type"] == NoProvider.__name__


async def test_exec_runs_code_with_inputs_and_host_tools(kernel: Kernel) -> None:
    seen: list[str] = []

    async def fetch(url: str) -> list[int]:
        seen.append(url)
        return [1, 2, 3]

    async def program(ctx: Context) -> Any:
        out = await ctx.exec("rows = fetch(url)\nprint('got', len(rows))\nsum(rows)",
                             inputs={"url": "u"}, tools={"fetch": fetch})
        return [out.value, out.stdout, [c.name for c in out.tool_calls]]

    assert await (await kernel.spawn(program)).wait() == [6, "got 3\n", ["fetch"]]
    assert seen == ["u"]


async def test_an_exception_in_exec_code_is_data_not_a_host_error(kernel: Kernel) -> None:
    async def program(ctx: Context) -> Any:
        out = await ctx.exec("1 / 0")
        return [out.ok, out.error.type if out.error else None]

    assert await (await kernel.spawn(program)).wait() == [False, "ZeroDivisionError"]


async def test_tool_by_name_and_by_callable_and_a_raising_tool_gives_its_own_exception() -> None:
    """A tool's KeyError reaches the program as a KeyError; one of a class defined in a function
    (it cannot be rebuilt from the journal) as ToolFailed naming it."""
    class Local(Exception):
        pass

    def add(a: int, b: int) -> int:
        return a + b

    def broken() -> None:
        raise KeyError("missing")

    def local() -> None:
        raise Local("here only")

    async def program(ctx: Context) -> Any:
        x = await ctx.tool("add", 2, b=3)
        y = await ctx.tool(add, 10, 1)
        seen: list[Any] = [x, y]
        try:
            await ctx.tool("broken")
        except KeyError as exc:
            seen.append(exc.args[0])
        try:
            await ctx.tool(local)
        except ToolFailed as exc:
            seen.append(exc.error_type)
        return seen

    async with Kernel(checkpointer=MemoryCheckpointer(), tools={"add": add, "broken": broken}) as kernel:
        assert await (await kernel.spawn(program)).wait() == [5, 11, "missing", "Local"]

        async def unknown(ctx: Context) -> None:
            await ctx.tool("nope")

        p = await kernel.spawn(unknown)
        with pytest.raises(Exception, match="no tool named 'nope'"):
            await p.wait()
        assert p.error is not None and p.error["type"] == ToolNotFound.__name__


async def test_priority_0_message_is_received_before_queued_priority_10_messages(kernel: Kernel) -> None:
    async def late_receiver(ctx: Context) -> list[Any]:
        while ctx.state.get("queued") is None:  # the test says when every message is queued
            await ctx.sleep(0.005)
        return [await ctx.recv() for _ in range(4)]

    p = await kernel.spawn(late_receiver)
    for i in range(3):
        await p.send({"debug": i}, priority=10)
    await p.send({"signal": "stop"}, priority=0)
    p.state["queued"] = True
    assert await p.wait() == [{"signal": "stop"}, {"debug": 0}, {"debug": 1}, {"debug": 2}]


async def test_processes_talk_to_each_other_by_pid(kernel: Kernel) -> None:
    inbox = await kernel.spawn(receiver, 2)

    async def sender(ctx: Context, to: int) -> None:
        await ctx.send(to, {"from": ctx.pid, "n": 1})
        await ctx.send(to, {"from": ctx.pid, "n": 2}, priority=1)

    s = await kernel.spawn(sender, inbox.pid)
    await s.wait()
    got = await inbox.wait()
    assert sorted(got, key=lambda m: m["n"]) == [{"from": s.pid, "n": 1}, {"from": s.pid, "n": 2}]
    with pytest.raises(ProcessStateError, match="receives no messages"):
        await inbox.send("too late")


async def test_recv_with_timeout_returns_none(kernel: Kernel) -> None:
    async def program(ctx: Context) -> Any:
        return await ctx.recv(timeout=0.01)

    assert await (await kernel.spawn(program)).wait() is None


async def test_receives_at_once_each_get_their_own_message_and_a_cancelled_one_takes_none(kernel: Kernel) -> None:
    # The first receive waiting forever has a future of its own; the others wait on an event.
    async def program(ctx: Context) -> dict[str, Any]:
        forever = asyncio.create_task(ctx.recv())
        await asyncio.sleep(0)
        cancelled = asyncio.create_task(ctx.recv())
        second = asyncio.create_task(ctx.recv())
        timed_out = await ctx.recv(timeout=0.05)  # nobody has sent anything yet
        cancelled.cancel()
        ctx.state["waiting"] = True
        got = await asyncio.gather(forever, second)
        with pytest.raises(asyncio.CancelledError):
            await cancelled
        return {"timed_out": timed_out, "got": sorted(got), "after": await ctx.recv()}

    p = await kernel.spawn(program)
    while not p.state.get("waiting"):
        await asyncio.sleep(0.005)
    for n in (1, 2, 3):
        await p.send(n)
    assert await p.wait(10) == {"timed_out": None, "got": [1, 2], "after": 3}


async def test_child_gets_a_slice_of_the_budget_and_unspent_budget_is_refunded(kernel: Kernel) -> None:
    async def child(ctx: Context) -> float | None:
        await ctx.recv()  # until its parent has looked at its own budget
        return ctx.remaining("steps")

    async def parent(ctx: Context) -> list[Any]:
        before = ctx.remaining("steps")
        handle = await ctx.spawn(child, limits=Limits(steps=40))
        during = ctx.remaining("steps")
        await ctx.send(handle.pid, "go")
        child_left = await ctx.wait(handle)
        return [before, during, child_left, ctx.remaining("steps")]

    p = await kernel.spawn(parent, limits=Limits(steps=100))
    before, during, child_left, after = await p.wait()
    assert before == 100
    assert during == 100 - 1 - 40  # one step for the spawn syscall, 40 lent to the child
    assert child_left == 39  # the child spent one step
    assert after == 100 - 1 - 1 - 1 - 1  # spawn, send, wait, and the child's one step: its other 39 came back


async def test_a_child_cannot_ask_for_more_than_its_parent_has(kernel: Kernel) -> None:
    async def child(ctx: Context) -> None:
        return None

    async def parent(ctx: Context) -> None:
        await ctx.spawn(child, limits=Limits(tokens=1000))

    p = await kernel.spawn(parent, limits=Limits(tokens=100))
    with pytest.raises(Exception, match="asks for 1000 tokens but its parent has only 100 left"):
        await p.wait()


async def test_checkpoint_saves_working_state(kernel: Kernel) -> None:
    async def program(ctx: Context) -> None:
        ctx.state["progress"] = {"rows": 10}
        await ctx.checkpoint()
        await ctx.sleep(3600)

    p = await kernel.spawn(program)
    while p.status is not ProcessStatus.WAITING:
        await asyncio.sleep(0.005)
    stored = await kernel.store.load_process(p.pid)
    assert stored is not None and stored.state == {"progress": {"rows": 10}}
    await p.kill()


async def test_a_sleeping_process_gives_its_run_slot_to_another() -> None:
    async def sleeper(ctx: Context) -> str:
        await ctx.sleep(0.2)
        return "slept"

    async def quick(ctx: Context) -> str:
        await ctx.sleep(0)
        return "quick"

    async with Kernel(checkpointer=MemoryCheckpointer(), max_running=1) as kernel:
        s = await kernel.spawn(sleeper)
        await asyncio.sleep(0.05)
        q = await kernel.spawn(quick)
        assert await asyncio.wait_for(q.wait(), 0.15) == "quick"
        assert await s.wait() == "slept"


async def test_a_parent_waiting_for_its_child_gives_up_its_slot_and_sees_its_failure() -> None:
    async def child(ctx: Context, fail: bool) -> str:
        await ctx.checkpoint()
        if fail:
            raise RuntimeError("child broke")
        return "child done"

    async def parent(ctx: Context) -> list[str]:
        ok = await ctx.wait(await ctx.spawn(child, False))
        try:
            await ctx.wait(await ctx.spawn(child, True))
        except ProcessFailed as exc:
            return [str(ok), exc.status]
        return [str(ok)]

    async with Kernel(checkpointer=MemoryCheckpointer(), max_running=1) as kernel:  # one slot: no deadlock
        assert await asyncio.wait_for((await kernel.spawn(parent)).wait(), 5) == ["child done", "failed"]
