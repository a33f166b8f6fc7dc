"""``ringzero demo``: several agents sharing one rate-limited model, shown live.

Everything runs offline: the "model" is a ScriptedProvider behind a server-side rate
limit that answers 429 with Retry-After, as a real API does. Watch one agent get paused
and resumed, one killed, one crash, one run out of budget, while the rest finish with
zero failed LLM calls.
"""

from __future__ import annotations

import asyncio
import datetime
import time
from collections.abc import Mapping
from pathlib import Path

from rich.console import Console, Group, JustifyMethod
from rich.live import Live
from rich.table import Table
from rich.text import Text

from ringzero import Context, Kernel, Limits, LLMGate, ProcessInfo, RateLimit, RetryPolicy
from ringzero.checkpointers import SqliteCheckpointer
from ringzero.core.contract.errors import RateLimited, RingzeroError
from ringzero.core.contract.outcomes import number
from ringzero.core.contract.types import LLMRequest
from ringzero.core.schedules import ScheduleSpec
from ringzero.testing import ScriptedProvider

__all__ = ["process_table", "run_demo"]

MODEL_RATE = 10.0  # requests per second the "server" accepts
STATUS_STYLE = {
    "running": "bold green", "ready": "cyan", "waiting": "blue", "paused": "yellow",
    "exited": "dim green", "failed": "bold red", "killed": "red", "created": "dim",
}


class DemoModel:
    """A canned model with a server-side token bucket: past MODEL_RATE it answers 429."""

    def __init__(self) -> None:
        self.level, self.stamp = 1.0, time.monotonic()
        self.provider = ScriptedProvider(self.answer, latency=0.12)

    def answer(self, request: LLMRequest) -> str:
        now = time.monotonic()
        self.level = min(1.0, self.level + (now - self.stamp) * MODEL_RATE)
        self.stamp = now
        if self.level < 1.0:
            raise RateLimited("429 Too Many Requests", retry_after=(1.0 - self.level) / MODEL_RATE)
        self.level -= 1.0
        return f"notes on {request.messages[-1].content}"


async def researcher(ctx: Context, topics: list[str], writer_pid: int) -> int:
    for topic in topics:
        reply = await ctx.llm(f"research {topic}")
        await ctx.send(writer_pid, {"topic": topic, "notes": reply.content})
    await ctx.send(writer_pid, {"done": True})  # same priority as the notes: it arrives after them
    return len(topics)


async def writer(ctx: Context) -> str:
    sections = []
    while True:
        message = await ctx.recv()
        if isinstance(message, dict) and message.get("done"):
            break
        draft = await ctx.llm(f"write a section from {message}")
        sections.append(draft.content)
        ctx.state["sections"] = len(sections)
        await ctx.checkpoint()
    return f"report with {len(sections)} sections"


async def analyst(ctx: Context, rows: int) -> float:
    plan = await ctx.llm(f"plan an analysis of {rows} rows")
    result = await ctx.exec("data = load(rows)\nsum(data) / len(data)", inputs={"rows": rows},
                            tools={"load": lambda n: list(range(n))})
    await ctx.llm(f"explain mean {result.value} given {plan.content}")
    return number(result.value)


async def batch_job(ctx: Context, items: int) -> int:
    for i in range(items):
        await ctx.llm(f"label item {i}")
    return items


async def runaway(ctx: Context) -> None:
    i = 0
    while True:
        i += 1
        await ctx.llm(f"think harder, attempt {i}")


async def flaky(ctx: Context) -> None:
    await ctx.llm("fetch the quarterly numbers")
    raise ConnectionError("the upstream data source went away")


def process_table(rows: list[ProcessInfo], title: str = "ringzero processes",
                  nodes: Mapping[int, str] | None = None) -> Table:
    """The ``ps`` view: one row per process (with the node that runs it, for a cluster's store)."""
    table = Table(title=title, title_justify="left", expand=False)
    columns: list[tuple[str, JustifyMethod]] = [
        ("pid", "right"), ("name", "left"), ("prio", "right"), ("parent", "right"), ("status", "left"),
        ("stop reason", "left"), ("llm", "right"), ("tokens", "right"), ("steps", "right"), ("wall s", "right")]
    if nodes is not None:
        columns.insert(2, ("node", "left"))
    timers = any(r.wake_at is not None for r in rows)
    if timers:
        columns.append(("wakes", "left"))
    for column, justify in columns:
        table.add_column(column, justify=justify)
    for r in rows:
        cells: list[str | Text] = [
            str(r.pid), r.name, str(r.priority), "" if r.parent is None else str(r.parent),
            Text(r.status.value, style=STATUS_STYLE.get(r.status.value, "")),
            "" if r.stop_reason is None else r.stop_reason.value,
            str(r.llm_calls), str(r.tokens), str(r.steps), f"{r.wall_seconds:.1f}",
        ]
        if nodes is not None:
            cells.insert(2, nodes.get(r.pid, ""))
        if timers:
            cells.append("" if r.wake_at is None else
                         datetime.datetime.fromtimestamp(r.wake_at).astimezone().isoformat(timespec="seconds"))
        table.add_row(*cells)
    return table


def next_firing_text(spec: ScheduleSpec, now: float) -> str:
    """When ``spec`` fires next, in local time, or why it cannot (its row's problem, or its
    slots failing to compute here)."""
    if spec.problem is not None:
        return f"cannot fire: {spec.problem}"
    try:
        return datetime.datetime.fromtimestamp(spec.next_after(now)).astimezone().isoformat(timespec="seconds")
    except Exception as exc:
        return f"cannot fire: {type(exc).__name__}: {exc}"


def schedule_table(specs: list[ScheduleSpec]) -> Table:
    """The schedules of ``ps``: each with its program, when it fires and its next firing."""
    table = Table(title="schedules", title_justify="left", expand=False)
    for column in ("name", "program", "every", "missed", "next firing"):
        table.add_column(column)
    now = time.time()
    for spec in specs:
        when = "paused" if spec.paused else next_firing_text(spec, now)
        table.add_row(spec.name, spec.program, f"{spec.every:g} s" if spec.every is not None else f"cron {spec.cron}",
                      spec.missed, when)
    return table


async def run_demo(state_dir: Path, console: Console) -> int:
    """Run the demo; returns the number of LLM calls that failed (zero when all is well)."""
    model = DemoModel()
    limit = RateLimit(requests_per_minute=MODEL_RATE * 60, burst_requests=1, max_concurrency=4)
    gate = LLMGate(model.provider, limit,
                   RetryPolicy(max_retries=20, base_delay=0.05))
    events: list[str] = []
    async with Kernel(llm=gate, checkpointer=SqliteCheckpointer(state_dir / "state.db", create_folder=True)) as kernel:

        def frame() -> Group:
            stats = gate.stats
            line = Text.assemble(
                ("model: ", "bold"), f"{MODEL_RATE:g} req/s limit · calls {stats.calls} · ",
                f"429s absorbed by the gate {stats.rate_limited} · ", ("failed calls ", "bold"),
                (str(stats.failures), "bold green" if stats.failures == 0 else "bold red"),
            )
            if not console.is_terminal:  # a log got each event as it happened (below): not again here
                return Group(process_table(rows), line)
            return Group(process_table(rows), line, Text("\n".join(events[-6:]), style="dim"))

        writer_p = await kernel.spawn(writer, name="writer", priority=3)
        procs = {
            "researcher": await kernel.spawn(researcher, ["kernels", "schedulers", "journals", "budgets"],
                                             writer_p.pid, name="researcher", priority=1),
            "analyst": await kernel.spawn(analyst, 1000, name="analyst", priority=5),
            "batch": await kernel.spawn(batch_job, 8, name="batch-labeler", priority=9),
            "runaway": await kernel.spawn(runaway, name="runaway", priority=9),
            "flaky": await kernel.spawn(flaky, name="flaky", priority=5),
            "budget": await kernel.spawn(batch_job, 50, name="capped", priority=7, limits=Limits(llm_calls=3)),
        }
        rows = await kernel.ps()
        script = [(0.6, "pause", "batch"), (1.4, "kill", "runaway"), (2.2, "resume", "batch")]
        started = time.monotonic()
        with Live(frame(), console=console, refresh_per_second=8, transient=False) as live:
            while not all(p.status.terminal for p in [writer_p, *procs.values()]):
                now = time.monotonic() - started
                while script and script[0][0] <= now:
                    _, action, key = script.pop(0)
                    await getattr(procs[key], action)()
                    events.append(f"t={now:4.1f}s  {action} pid {procs[key].pid} ({procs[key].name})")
                    if not console.is_terminal:  # a log gets each event as it happens, not only the last table
                        console.print(events[-1])
                rows = await kernel.ps()
                live.update(frame())
                await asyncio.sleep(0.1)
            rows = await kernel.ps()
            live.update(frame())
        console.print()
        for name, handle in [("writer", writer_p), *procs.items()]:
            try:
                outcome = repr(await handle.wait())
            except RingzeroError as exc:
                outcome = str(exc).splitlines()[0]
            console.print(f"  {name:<11} {outcome}")
    console.print(f"\nState is in {state_dir / 'state.db'}: `ringzero ps --db {state_dir / 'state.db'}` lists it.")
    return gate.stats.failures
