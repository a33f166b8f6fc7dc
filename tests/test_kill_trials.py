"""Kill -9 at random points: 10 trials on SQLite and 10 on PostgreSQL in ``make test``
(``CHAOS_TRIALS=40`` for a longer run).

In each, a host (tests/chaos.py) runs 100 processes: model calls to a vendor-format server on
127.0.0.1, code in Monty that calls a host tool, memory, messages between processes, children.
It is killed with SIGKILL at a random moment, and a new kernel runs ``recover()``. Then every
process has the result an uninterrupted run gives, no model call or tool run recorded before
the kill was made again (counted at the server and at the tool), and every record written
before the kill is still there, unchanged.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ringzero.compat.vendor_servers import VendorServer, openai_answer
from tests import chaos
from tests.hosts import kill_host_when
from tests.postgres import fresh_database

ROOT = Path(__file__).resolve().parent.parent
TRIALS = int(os.environ.get("CHAOS_TRIALS", "10"))


def answer_prompt(body: dict[str, Any]) -> Any:
    return openai_answer(f"answer to {body['messages'][-1]['content']}")


class CountingServer(VendorServer):
    """An OpenAI-format server answering every prompt as ``answer to <prompt>``, keeping each."""

    def __init__(self) -> None:
        super().__init__("openai", [])

    def answer(self, path: str, headers: dict[str, str], body: dict[str, Any]) -> Any:
        self.script.append(answer_prompt)  # an endless script
        return super().answer(path, headers, body)

    def prompts(self) -> Counter[str]:
        return Counter(seen.body["messages"][-1]["content"] for seen in self.requests)


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[dict[str, Any], float]]:
    """The results of an uninterrupted run, and how long a host on SQLite takes from spawning
    its processes to its exit (the window the SQLite kills are drawn from)."""
    folder = tmp_path_factory.mktemp("reference")
    server = CountingServer()
    with server.running(), _environment(server.url, folder / "tools.log"):
        got = asyncio.run(_uninterrupted())
    yield got, host_run_seconds(str(folder / "state.db"), folder)


def host_run_seconds(store: str, folder: Path) -> float:
    """How long an uninterrupted host on ``store`` takes from spawning its processes to its
    exit. Each store's kills are drawn from its own window: what a host has done by the time
    it says ``spawned`` differs between stores (a spawn that waits for a PostgreSQL claim lets
    the processes spawned before it run meanwhile; one appended to SQLite's log does not)."""
    server = CountingServer()
    with server.running(), _environment(server.url, folder / "tools.log"):
        host = subprocess.Popen([sys.executable, "-m", "tests.chaos", store, server.url, str(folder / "tools.log")],
                                cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.PIPE,
                                text=True)
        assert host.stdout is not None
        assert host.stdout.readline().strip() == "spawned"
        started = time.monotonic()
        assert host.wait(120) == 0
        host.stdout.close()
        return time.monotonic() - started


async def _uninterrupted() -> dict[str, Any]:
    from ringzero.checkpointers import MemoryCheckpointer

    kernel = chaos.make_kernel(":memory:")
    assert isinstance(kernel.checkpointer, MemoryCheckpointer)
    async with kernel:
        return await chaos.run_all(kernel)


class _environment:
    """CHAOS_LLM_URL and CHAOS_TOOL_LOG for kernels made in this process."""

    def __init__(self, url: str, tool_log: Path) -> None:
        self.values = {"CHAOS_LLM_URL": url, "CHAOS_TOOL_LOG": str(tool_log)}

    def __enter__(self) -> None:
        self.saved = {k: os.environ.get(k) for k in self.values}
        os.environ.update(self.values)

    def __exit__(self, *exc: object) -> None:
        for key, value in self.saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def run_host_and_kill(store: str, url: str, tool_log: Path, kill_after: float) -> bool:
    """Start the host; SIGKILL it ``kill_after`` s after it has spawned its processes. True if
    it was killed before it finished."""
    host = subprocess.Popen([sys.executable, "-m", "tests.chaos", store, url, str(tool_log)], cwd=ROOT,
                            env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.PIPE, text=True)
    assert host.stdout is not None
    assert host.stdout.readline().strip() == "spawned"
    kill_at = time.monotonic() + kill_after
    return kill_host_when(host, lambda: time.monotonic() >= kill_at) == -signal.SIGKILL


async def snapshot(store: str) -> dict[int, list[tuple[int, str, str, Any]]]:
    """Every journal in the store: (seq, kind, fingerprint, outcome) by pid."""
    from ringzero.checkpointers import open_checkpointer
    from ringzero.core.contract.store import KernelStore

    checkpointer = open_checkpointer(store)
    try:
        kernel_store = KernelStore(checkpointer)
        return {r.pid: [(e.seq, e.kind, e.fingerprint, e.outcome.to_json()) for e in await kernel_store.journal(r.pid)]
                for r in await kernel_store.load_processes()}
    finally:
        await checkpointer.aclose()


def recorded_effects(journals: dict[int, list[tuple[int, str, str, Any]]],
                     names: dict[int, str]) -> tuple[set[str], set[str]]:
    """The model prompts and tool runs the journals hold as done."""
    prompts: set[str] = set()
    tools: set[str] = set()
    for pid, entries in journals.items():
        i = int(names[pid].split("-")[1])
        for _, kind, _, outcome in entries:
            if kind == "llm" and "value" in outcome:
                prompts.add(outcome["value"]["message"]["content"].removeprefix("answer to "))
            elif kind == "exec":
                tools.add(f"tool {i}")
            elif kind == "tool":
                tools.add(f"tool {1000 + i}")
    return prompts, tools


async def names_by_pid(store: str) -> dict[int, str]:
    from ringzero.checkpointers import open_checkpointer
    from ringzero.core.contract.store import KernelStore

    checkpointer = open_checkpointer(store)
    try:
        return {r.pid: r.name for r in await KernelStore(checkpointer).load_processes()}
    finally:
        await checkpointer.aclose()


async def one_trial(store: str, tmp: Path, seed: int, expected: dict[str, Any], span: float) -> str:
    """Kill, recover, check; returns how the trial went, for the report."""
    server = CountingServer()
    tool_log = tmp / "tools.log"
    tool_log.write_text("")
    with server.running(), _environment(server.url, tool_log):
        kill_after = random.Random(seed).uniform(0.0, span)
        killed = await asyncio.to_thread(run_host_and_kill, store, server.url, tool_log, kill_after)
        before = await snapshot(store)
        names = await names_by_pid(store)
        done_prompts, done_tools = recorded_effects(before, names)
        kernel = chaos.make_kernel(store)
        async with kernel:
            handles = await kernel.recover()
            for handle in handles:
                await handle.wait(timeout=60)
            got = await chaos.results(kernel)
        after = await snapshot(store)
    assert got == expected, f"seed {seed}: results differ from an uninterrupted run"
    prompts = server.prompts()
    again = sorted(p for p in done_prompts if prompts[p] != 1)
    assert not again, f"seed {seed}: recorded model calls made again or lost: {again[:5]}"
    tool_runs = Counter(tool_log.read_text().splitlines())
    repeated = sorted(t for t in done_tools if tool_runs[t] != 1)
    assert not repeated, f"seed {seed}: recorded tool runs made again: {repeated[:5]}"
    for pid, entries in before.items():
        assert after[pid][: len(entries)] == entries, f"seed {seed}: pid {pid} lost or changed a record"
    return f"killed after {kill_after:.2f} s" if killed else "finished before the kill"


async def run_trials(make_store: Any, tmp_path: Path, reference: tuple[dict[str, Any], float]) -> list[str]:
    expected, duration = reference
    assert len(expected) == 2 * chaos.PARENTS
    outcomes = []
    for seed in range(TRIALS):
        trial = tmp_path / f"trial-{seed}"
        trial.mkdir()
        outcomes.append(await one_trial(make_store(trial), trial, seed, expected, span=duration * 0.9))
    return outcomes


@pytest.mark.slow
@pytest.mark.timeout(600)
async def test_kills_on_sqlite(tmp_path: Path, reference: tuple[dict[str, Any], float]) -> None:
    outcomes = await run_trials(lambda trial: str(trial / "state.db"), tmp_path, reference)
    assert sum(o.startswith("killed") for o in outcomes) >= TRIALS // 2, outcomes


@pytest.mark.slow
@pytest.mark.timeout(600)
async def test_kills_on_postgres(tmp_path: Path, reference: tuple[dict[str, Any], float],
                                        postgres_dsn: str) -> None:
    expected, _ = reference
    window = await asyncio.to_thread(host_run_seconds, fresh_database(postgres_dsn), tmp_path)
    outcomes = await run_trials(lambda trial: fresh_database(postgres_dsn), tmp_path, (expected, window))
    assert sum(o.startswith("killed") for o in outcomes) >= TRIALS // 2, outcomes
