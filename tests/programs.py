"""Programs the tests spawn. They live at module level so that recover() can import them again."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ringzero import Context
from ringzero.core.types import LLMRequest


def log_line(line: str) -> None:
    """Append to the file named by RINGZERO_TEST_LOG: the record of real (not replayed) calls."""
    with Path(os.environ["RINGZERO_TEST_LOG"]).open("a") as f:
        f.write(line + "\n")
        f.flush()
        os.fsync(f.fileno())


def logging_llm(request: LLMRequest) -> str:
    prompt = request.messages[-1].content
    log_line(f"llm {prompt}")
    return f"answer to {prompt}"


def record_tool(i: int) -> int:
    log_line(f"tool {i}")
    return i * i


async def durable_worker(ctx: Context, n: int) -> list[Any]:
    """n rounds of one LLM call and one tool call: what a crash must not repeat."""
    out: list[Any] = []
    for i in range(n):
        reply = await ctx.llm(f"step {i}")
        square = await ctx.tool("record", i)
        ctx.state["done"] = i + 1
        out.append([reply.content, square])
    return out


async def echo_twice(ctx: Context, text: str) -> str:
    first = await ctx.llm(text)
    second = await ctx.llm(first.content)
    return second.content


async def prompt_from_env(ctx: Context) -> str:
    """Asks whatever RINGZERO_TEST_PROMPT says: a program that changes between runs."""
    reply = await ctx.llm(os.environ.get("RINGZERO_TEST_PROMPT", "first"))
    return reply.content


async def receiver(ctx: Context, count: int) -> list[Any]:
    return [await ctx.recv() for _ in range(count)]


def make_kernel(db: Path) -> Any:
    """What a user hands ``ringzero resume --kernel``: their kernel, configured."""
    from ringzero import Kernel
    from ringzero.checkpointers import SqliteCheckpointer
    from ringzero.testing import ScriptedProvider

    return Kernel(checkpointer=SqliteCheckpointer(db), llm=ScriptedProvider(logging_llm), tools={"record": record_tool})


async def child_naps(ctx: Context, n: int, seconds: float) -> int:
    await ctx.sleep(seconds)
    return n * 10


async def parent_waits_for_child(ctx: Context, n: int, child_seconds: float, after_seconds: float) -> int:
    child = await ctx.spawn(child_naps, n, child_seconds, name="child")
    value = int(await ctx.wait(child))  # type: ignore[arg-type]
    await ctx.sleep(after_seconds)
    return value + 1
