"""Issue 52, row 4: what one run adds to the store is bounded by its ``run_tool_bytes``,
whatever the code does. Each attack runs in a kernel process on a SQLite store; the store's
files (database, WAL, append logs) are measured after the kernel closed, against the same
program with a run that calls no tool. The target: at most twice the run's byte budget."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from ringzero import Kernel
from ringzero.checkpointers import SqliteCheckpointer
from ringzero.core.contract.protocols import Executor
from ringzero.core.contract.types import ExecLimits

BUDGET = 256 * 1024
LIMITS = ExecLimits(wall_seconds=60.0, run_tool_bytes=BUDGET)


def fails() -> None:
    raise ValueError("x" * 12_000_000)  # an HTTP client's error carrying a whole response body


def nop() -> None:
    return None


def take(data: object) -> int:
    return 1


def give() -> str:
    return "\N{GRINNING FACE}" * 5000  # 20 KB of UTF-8; 60 KB as the journal stores it (escaped)


def fetch(path: str, api_key: str = "sk-host-secret") -> str:
    return path


TOOLS: dict[str, Callable[..., Any]] = {"fails": fails, "nop": nop, "take": take, "give": give, "fetch": fetch}
EACH = "for _ in range({n}):\n    try:\n        {call}\n    except Exception:\n        pass\n'done'"


def store_size(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.iterdir() if f.name.startswith("state.db"))


async def grown(tmp_path: Path, executor: Executor, code: str) -> tuple[int, object]:
    """What a run of ``code`` adds to a fresh store, beyond a run that calls no tool; and the
    run's value."""
    sizes, values = [], []
    for name, run in (("quiet", "'done'"), ("loud", code)):
        folder = tmp_path / name
        folder.mkdir()

        async def program(ctx: Any, source: str = run) -> object:
            result = await ctx.exec(source, tools=TOOLS, limits=LIMITS)
            return result.error.type if result.error else result.value

        async with Kernel(checkpointer=SqliteCheckpointer(folder / "state.db"), executor=executor) as kernel:
            values.append(await (await kernel.spawn(program)).wait())
        sizes.append(store_size(folder))
    return sizes[1] - sizes[0], values[1]


@pytest.mark.parametrize(("calls", "call"), [
    (20, "fails()"), (21_845, "nop()"), (200, "take('\\N{GRINNING FACE}' * 10_000)"), (200, "give()"),
    (5_000, "fetch('/x', api_key='mine')"),
], ids=["20 calls whose errors carry 12 MB of text each", "21,845 empty calls",
        "arguments 3 times longer escaped", "results kept twice and 3 times longer escaped", "5,000 refused calls"])
@pytest.mark.parametrize("sandbox", ["monty", "process"], indirect=True)
async def test_4_a_run_adds_at_most_twice_its_byte_budget_to_the_store(sandbox: Executor, tmp_path: Path, calls: int,
                                                                       call: str) -> None:
    added, value = await grown(tmp_path, sandbox, EACH.format(n=calls, call=call))
    monty_stops = sandbox.capabilities.isolation == "interpreter" and calls > 1000  # Monty's own cap: 1,000 a run
    assert value == ("RuntimeError" if monty_stops else "done"), value
    assert added <= 2 * BUDGET, f"the run added {added} bytes to the store, over 2 x {BUDGET}"


async def test_4_ctx_tool_keeps_a_clipped_error_text(tmp_path: Path) -> None:
    """``ctx.tool`` journaled the whole ``str(exc)``: 12 MB for one failed call."""
    async def program(ctx: Any) -> list[int]:
        seen = []
        for _ in range(5):
            try:
                await ctx.tool(fails)
            except ValueError as exc:  # the tool's own class, its text clipped as the journal keeps it
                seen.append(len(str(exc)))
        return seen

    store = SqliteCheckpointer(tmp_path / "state.db")
    async with Kernel(checkpointer=store) as kernel:
        handle = await kernel.spawn(program)
        lengths = await handle.wait()
        rows = [cp async for cp in store.list(f"ringzero/process/{handle.pid}", "journal")]
    assert all(n < 2100 for n in lengths), lengths
    assert rows and max(len(cp.payload) for cp in rows) < 3000, [len(cp.payload) for cp in rows]
    assert json.loads(rows[0].payload)["outcome"]["error"]["type"] == "ValueError"
