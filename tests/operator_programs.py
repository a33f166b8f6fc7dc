"""Programs for the operator tools' tests (``show``, ``settle``, ``retry``, ``fork``, ``replay
--check`` and ``ctx.patched``), importable by module so that the command line resumes them.

``VERSION`` stands for the code deployed now: each number is an edit of ``agent`` a team might
ship while processes of it are in flight (see ``agent``). ``HANG`` names the tools whose next
run hangs, where a test stops the host as a crash would; ``RUNS`` counts the model calls and
tool runs that really happened.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path
from typing import Any

from ringzero import Context, Kernel, idempotent
from ringzero.checkpointers import SqliteCheckpointer
from ringzero.core.contract.types import LLMRequest
from ringzero.testing import ScriptedProvider

VERSION = 1
HANG: set[str] = set()
RUNS: Counter[str] = Counter()


def answer(request: LLMRequest) -> str:
    prompt = request.messages[-1].content
    RUNS[f"llm {prompt}"] += 1
    return f"re: {prompt}"


async def _maybe_hang(name: str) -> None:
    if name in HANG:
        await asyncio.sleep(3600)  # the host dies while the call runs


@idempotent
async def charge(amount: int) -> str:
    RUNS[f"charge {amount}"] += 1
    await _maybe_hang(f"charge {amount}")
    return f"charged {amount}"


async def pay(amount: int) -> str:
    """A payment without a key: in doubt after a crash, for an operator to settle."""
    RUNS[f"pay {amount}"] += 1
    await _maybe_hang(f"pay {amount}")
    return f"paid {amount}"


async def agent(ctx: Context) -> list[Any]:
    """Version 1, and the edits of it: 2 asks the model once more between its calls (breaking),
    3 does so under ``ctx.patched`` (safe), 4 changes its first prompt (breaking), 5 drops its
    second call (breaking), 6 adds a step after its last (harmless), 7 renames a local and adds
    a comment (harmless)."""
    first = await ctx.llm("A!" if VERSION == 4 else "a")
    if VERSION == 2:
        await ctx.llm("x")
    if VERSION == 3 and await ctx.patched("ask-x"):
        await ctx.llm("x")
    if VERSION == 7:
        # the second question, asked as before
        renamed = await ctx.llm("b")
        second = renamed
    elif VERSION != 5:
        second = await ctx.llm("b")
    receipt = await ctx.tool("charge", 5)
    if VERSION == 6:
        await ctx.llm("extra")
    return [first.content, second.content if VERSION != 5 else None, receipt]


async def pays(ctx: Context) -> str:
    """Pays; a payment in doubt is not caught: the process fails of it (settle, then retry)."""
    await ctx.llm("plan")
    return str(await ctx.tool("pay", 7))


async def pays_from_code(ctx: Context) -> Any:
    out = await ctx.exec("receipts = [pay(1), pay(2), pay(3)]\nreceipts", tools={"pay": pay})
    return out.value if out.ok else out.for_model()


async def approves(ctx: Context) -> str:
    """Drafts, waits for a person's approval, then pays."""
    draft = await ctx.llm("draft")
    if await ctx.recv() != "yes":
        return "not approved"
    return f"{draft.content}: {await ctx.tool('pay', 1)}"


async def waiting_in(db: Path, program: Any) -> int:
    """Run ``program`` until it waits for a message, then stop the host as a crash would."""
    async with make_kernel(db) as kernel:
        handle = await kernel.spawn(program)
        while handle.status.value != "waiting":
            await asyncio.sleep(0.005)
        return handle.pid


class CardDeclined(Exception):
    """A payment API's own error, raised by a tool, caught by the program by its class."""

    def __init__(self, reason: str, code: int) -> None:
        super().__init__(reason, code)
        self.reason, self.code = reason, code


class ModelRetry(Exception):
    """What an agent framework raises to make the model try again (pydantic-ai's name)."""


class Refusal(Exception):
    """An error whose constructor takes keywords only: it cannot be rebuilt from a record."""

    def __init__(self, *, why: str) -> None:
        super().__init__(f"refused: {why}")


def charge_card(amount: int) -> str:
    RUNS[f"charge_card {amount}"] += 1
    raise CardDeclined("insufficient funds", 51)


def refuse(amount: int) -> str:
    RUNS[f"refuse {amount}"] += 1
    raise Refusal(why="over the limit")


def make_kernel(db: Any) -> Kernel:
    return Kernel(checkpointer=SqliteCheckpointer(Path(db)), llm=ScriptedProvider(answer),
                  tools={"charge": charge, "pay": pay, "charge_card": charge_card, "refuse": refuse})


async def crash_in(db: Path, program: Any, hang: str) -> int:
    """Run ``program`` until the tool run ``hang`` names has started, then stop the host as a
    crash would (the run never ends); the pid."""
    HANG.add(hang)
    ran = RUNS[hang]
    try:
        async with make_kernel(db) as kernel:
            handle = await kernel.spawn(program)
            while RUNS[hang] == ran:
                await asyncio.sleep(0.005)
            return handle.pid
    finally:
        HANG.discard(hang)


async def run_to_end(db: Path, program: Any) -> int:
    async with make_kernel(db) as kernel:
        handle = await kernel.spawn(program)
        await handle.wait(timeout=30)
        return handle.pid


async def pays_like_a_framework(ctx: Context) -> str:
    """Pays inside the loop an agent framework runs around a tool (smolagents' ``CodeAgent``
    does this): any ``Exception`` becomes an observation for the model, which calls the tool
    again. An in-doubt payment must not become a second payment."""
    observation = ""
    for _attempt in range(3):
        try:
            return str(await ctx.tool("pay", 7))
        except Exception as exc:
            observation = f"Error: {exc}. Try again."
    return observation


async def declined_then_charges(ctx: Context) -> list[Any]:
    """A card declined (caught by its class), then an idempotent charge a crash interrupts."""
    seen: list[Any] = []
    try:
        await ctx.tool("charge_card", 5)
    except CardDeclined as exc:
        seen.append(["declined", exc.reason, exc.code])
    try:
        await ctx.tool("refuse", 5)
    except Exception as exc:
        seen.append([type(exc).__name__, str(exc)])
    seen.append(await ctx.tool("charge", 9))
    return seen


async def retried_by_a_framework(ctx: Context) -> list[Any]:
    """An adapter's journaled call whose live run raised a framework's ``ModelRetry``: the
    recorded failure raised again (``served``) is a ModelRetry live and on replay."""
    from ringzero import failure
    from ringzero.core.support.effects import served

    async def live() -> Any:
        RUNS["validate"] += 1
        return failure(ModelRetry("the answer had no date: ask again"))

    seen: list[Any] = []
    try:
        served(await ctx.journaled_tool("validate", {"answer": "soon"}, live))
    except ModelRetry as exc:
        seen.append(["retry", str(exc)])
    seen.append(await ctx.tool("charge", 10))
    return seen
