"""The crash part of ``ringzero demo``: a host killed with SIGKILL mid-run, resumed, and an
approval sent from another OS process.

A host process runs three agents on a SQLite store: a reporter (a loop that skips the work
already in its state), a payer (code in the sandbox that calls a payment tool five times, the
tool taking an idempotency key) and an approver (drafts, then waits for a person). The demo
kills the host with SIGKILL while they work, resumes them with ``ringzero.resuming`` (as
``ringzero resume`` does), sends the approval with ``ringzero send`` from another OS process,
resumes again, and counts at the model and the tools, not in the kernel, how many calls that
were recorded before the kill were made again.

Run the host alone: ``python -m ringzero.demo_crash DB LOG``.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from rich.console import Console

from ringzero import Context, Kernel
from ringzero.checkpointers import SqliteCheckpointer
from ringzero.core.contract.fingerprints import llm_fingerprint
from ringzero.core.contract.outcomes import Value
from ringzero.core.contract.store import KernelStore
from ringzero.core.contract.types import LLMRequest
from ringzero.core.support.owner_only import owner_only_file, owner_only_folder
from ringzero.testing import ScriptedProvider

__all__ = ["make_kernel", "run_crash_demo"]

LOG_VARIABLE = "RINGZERO_DEMO_LOG"
"""The file where the model and the tools write a line for each call they really get."""


def _log(line: str) -> None:
    with Path(os.environ[LOG_VARIABLE]).open("a") as f:
        f.write(line + "\n")
        f.flush()
        os.fsync(f.fileno())


def _model(request: LLMRequest) -> str:
    _log(f"llm {llm_fingerprint('default', request)}")  # what the journal records the call by
    return f"notes on {request.messages[-1].content}"


def charge(amount: int, idempotency_key: str = "") -> str:
    """A payment API: it charges once per idempotency key and answers a repeated key with the
    first receipt."""
    seen = Path(os.environ[LOG_VARIABLE]).read_text().splitlines()
    if any(line.endswith(f" {idempotency_key}") and line.startswith("charge ") for line in seen):
        return f"receipt for {amount} (again)"
    time.sleep(0.05)
    _log(f"charge {amount} {idempotency_key}")
    return f"receipt for {amount}"


def publish(text: str, idempotency_key: str = "") -> str:
    _log(f"publish {idempotency_key}")
    return f"published {len(text)} characters"


async def reporter(ctx: Context) -> int:
    notes = ctx.state.setdefault("notes", [])
    assert isinstance(notes, list)
    for step in range(len(notes), 8):  # skips the work already in its state
        notes.append((await ctx.llm(f"section {step}")).content)
        await ctx.checkpoint()
    return len(notes)


async def payer(ctx: Context) -> Any:
    await ctx.llm("plan the payments")
    code = "receipts = []\nfor amount in [10, 20, 30, 40, 50]:\n    receipts.append(charge(amount))\nreceipts"
    return (await ctx.exec(code, tools={"charge": charge})).value


async def approver(ctx: Context) -> str:
    draft = await ctx.llm("draft the announcement")
    verdict = await ctx.recv()  # a person answers, any time later
    if verdict != {"approved": True}:
        return "not approved"
    return str(await ctx.tool("publish", draft.content))


def make_kernel(db: Any) -> Kernel:
    """What ``ringzero resume --kernel ringzero.demo_crash:make_kernel`` builds."""
    return Kernel(checkpointer=SqliteCheckpointer(db), llm=ScriptedProvider(_model, latency=0.05),
                  tools={"publish": publish})


async def _host(db: str) -> None:
    async with make_kernel(db) as kernel:
        for program in (reporter, payer, approver):
            await kernel.spawn(program, name=program.__name__)
        print("spawned", flush=True)
        await asyncio.sleep(3600)  # until the demo kills us


def _run_host_and_kill(db: Path, log: Path, environment: dict[str, str]) -> None:
    """Start the host; SIGKILL it once its agents have made 8 real calls."""
    host = subprocess.Popen([sys.executable, "-m", "ringzero.demo_crash", str(db)], env=environment,
                            stdout=subprocess.PIPE, text=True)
    assert host.stdout is not None
    host.stdout.readline()  # spawned
    while len(log.read_text().splitlines()) < 8:  # the agents are working: model calls, payments
        time.sleep(0.01)
    host.kill()  # SIGKILL: no shutdown of any kind
    host.wait()
    host.stdout.close()


async def _recorded(db: Path) -> tuple[set[str], dict[str, int]]:
    """The effects the store holds as done: model calls by fingerprint, and tool-call keys."""
    store = SqliteCheckpointer(db)
    try:
        kernel_store = KernelStore(store)
        prompts: set[str] = set()
        tools: dict[str, int] = {}
        for record in await kernel_store.load_processes():
            for entry in await kernel_store.journal(record.pid):
                if entry.kind == "llm" and isinstance(entry.outcome, Value):
                    prompts.add(entry.fingerprint)
                elif entry.kind == "tool":
                    tools[f"{record.pid}:{entry.seq}"] = 1
            for key in (await kernel_store.effects(record.pid)).calls:
                tools[f"{record.pid}:{key}"] = 1
        return prompts, tools
    finally:
        await store.aclose()


async def run_crash_demo(state_dir: Path, console: Console) -> int:
    """Kill, resume, approve, resume; returns 1 if a recorded call was made again or an agent
    did not finish, else 0."""
    from ringzero.resuming import resume

    console.rule("[bold]kill -9 mid-run, resume, and an approval from another OS process")
    folder = owner_only_folder(state_dir / "crash")
    db, log = folder / "state.db", folder / "calls.log"
    for stale in (db, log, *folder.glob("state.db*")):
        stale.unlink(missing_ok=True)
    owner_only_file(log)
    os.environ[LOG_VARIABLE] = str(log)
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    await asyncio.to_thread(_run_host_and_kill, db, log, environment)
    prompts, tools = await _recorded(db)
    console.print(f"  host killed with SIGKILL after {len(log.read_text().splitlines())} real calls; the store "
                  f"holds {len(prompts)} model calls and {len(tools)} tool calls as done")

    spec = "ringzero.demo_crash:make_kernel"
    code, first = await resume(make_kernel(db), console, db=str(db), kernel_spec=spec)
    doubts = [ends.done for ends in (first,) if ends.done is not None]
    for pid in sorted(pid for pid, why in first.waiting.items() if why == "message"):
        console.print(f"  the approval, from another OS process: ringzero send --db {db} {pid} "
                      "'{\"approved\": true}'")
        sent = await asyncio.to_thread(subprocess.run, [sys.executable, "-m", "ringzero.cli", "send", "--db",
                                                        str(db), str(pid), '{"approved": true}'],
                                       env=environment, capture_output=True, text=True)
        code |= sent.returncode
        last, ends = await resume(make_kernel(db), console, db=str(db), kernel_spec=spec)
        code |= last
        doubts += [ends.done] if ends.done is not None else []

    real = Counter(log.read_text().splitlines())
    again = sum(real[f"llm {fp}"] - 1 for fp in prompts)
    charged = Counter(line.split()[1] for line in real if line.startswith("charge "))
    twice = sum(n - 1 for n in charged.values() if n > 1)
    store = SqliteCheckpointer(db)
    try:
        records = await KernelStore(store).load_processes()
    finally:
        await store.aclose()
    finished = all(r.status.value == "exited" for r in records)
    rerun = sum(d.in_doubt_rerun for d in doubts)
    raised = sum(d.in_doubt_raised for d in doubts)
    console.print(f"  [bold]{again} recorded model call(s) made again[/], {twice} payment(s) charged twice "
                  f"({sum(charged.values())} payments of 5); {rerun + raised} call(s) in doubt: {rerun} run again "
                  f"under their idempotency key, {raised} raised to the program; every agent finished: {finished}")
    return 1 if code or again or twice or not finished or sum(charged.values()) != 5 else 0


if __name__ == "__main__":
    asyncio.run(_host(sys.argv[1]))
