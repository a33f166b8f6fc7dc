"""One host per wake: where several kernels share a store (two ``ringzero serve``, or ``serve``
and an operator's ``ringzero resume``), a process whose timer comes due runs on one of them.

Each trial leaves processes asleep in the store (their host closed), starts two hosts on it at
once and counts, at the tool, the runs of the code after the sleep: each exactly once. Both
hosts let the process go or hold it; each claims the wake in the store first, and the one that
loses the claim leaves the process alone.
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections import Counter
from pathlib import Path

import pytest

from tests.postgres import fresh_database
from tests.wake_programs import make_kernel, stamp_after

ROOT = Path(__file__).resolve().parent.parent
KERNEL = "tests.wake_programs:make_kernel"
SLEEPERS = 4


async def asleep_in_store(store: str, seconds: float) -> None:
    """``SLEEPERS`` processes asleep on ``seconds`` timers, their host closed (as a shutdown)."""
    async with make_kernel(store) as kernel:
        handles = [await kernel.spawn(stamp_after, f"p{i}", seconds, name=f"sleeper-{i}") for i in range(SLEEPERS)]
        while any(h.wake_at is None for h in handles):
            await asyncio.sleep(0.01)


async def host(command: str, store: str, log: Path) -> str:
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "ringzero.cli", command, "--db", store, "--kernel", KERNEL, cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT), "RINGZERO_TEST_LOG": str(log)},
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    out, _ = await asyncio.wait_for(process.communicate(), 90)
    assert process.returncode == 0, out.decode()
    return out.decode()


async def trial(store: str, commands: tuple[str, str], log: Path) -> None:
    await asleep_in_store(store, 3.0)
    said = await asyncio.gather(*(host(command, store, log) for command in commands))
    text = await asyncio.to_thread(log.read_text)
    stamps = Counter(line.split()[0] for line in text.splitlines())
    assert stamps == Counter({f"p{i}": 1 for i in range(SLEEPERS)}), (stamps, said)


@pytest.mark.parametrize("commands", [("serve", "serve"), ("serve", "resume"), ("resume", "resume")])
async def test_two_hosts_on_one_sqlite_store_run_each_due_timer_once(tmp_path: Path,
                                                                    commands: tuple[str, str]) -> None:
    for attempt in range(2):
        await trial(str(tmp_path / f"state-{attempt}.db"), commands, tmp_path / f"stamps-{attempt}.log")


async def test_two_serve_hosts_on_one_postgresql_store_run_each_due_timer_once(tmp_path: Path,
                                                                               postgres_dsn: str) -> None:
    await trial(fresh_database(postgres_dsn), ("serve", "serve"), tmp_path / "stamps.log")

