"""Kill -9 trials of timers: a program waiting on ``ctx.sleep(8)`` or ``ctx.recv(timeout=8)``
is killed with SIGKILL at a random moment of the wait, and ``ringzero resume`` (started at
once) wakes it within a second of the deadline it set before the kill, not 8 s after the
resume. ``ringzero resume`` with a process asleep for an hour returns at once and says when it
wakes; ``ringzero serve`` lets a sleeper go and wakes it at its deadline.

3 kills per program on SQLite and 1 on PostgreSQL in ``make test``; ``TIMER_TRIALS=20`` for
the longer run. Kills land between 0.3 s and 6 s into the wait, so that the resume has started
before the deadline (a deadline that passes during the outage fires at once on resume:
``tests/test_timers.py``).
"""

from __future__ import annotations

import asyncio
import os
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.hosts import kill_host_when, stop_host
from tests.postgres import fresh_database

ROOT = Path(__file__).resolve().parent.parent
TRIALS = int(os.environ.get("TIMER_TRIALS", "3"))
KERNEL = "tests.timer_programs:make_kernel"
WAIT = 8.0


def env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT)}


def start_host(store: str, program: str, seconds: float) -> tuple[subprocess.Popen[str], float]:
    """A host running ``program``, and the deadline its timer was set to (printed once set)."""
    host = subprocess.Popen([sys.executable, "-m", "tests.timer_programs", store, program, str(seconds)], cwd=ROOT,
                            text=True, env=env(), stdout=subprocess.PIPE)
    assert host.stdout is not None
    word, deadline = host.stdout.readline().split()
    assert word == "waiting"
    return host, float(deadline)


async def journaled_deadline(store: str) -> float:
    """The deadline of the one timer the store holds."""
    from ringzero.checkpointers import open_checkpointer
    from ringzero.core.contract.store import KernelStore

    checkpointer = open_checkpointer(store)
    try:
        kernel_store = KernelStore(checkpointer)
        [record] = await kernel_store.load_processes()
        [timer] = (await kernel_store.effects(record.pid)).timers.values()
        assert isinstance(timer.outcome.value, float)
        return timer.outcome.value
    finally:
        await checkpointer.aclose()


async def one_trial(store: str, program: str, rng: random.Random) -> str:
    host, deadline = start_host(store, program, WAIT)
    into = rng.uniform(0.3, 6.0)
    kill_at = time.monotonic() + into
    await asyncio.to_thread(kill_host_when, host, lambda: time.monotonic() >= kill_at)
    assert abs(await journaled_deadline(store) - deadline) < 1e-5  # the handle shows it to the microsecond
    resume = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "ringzero.cli", "resume", "--db", store, "--kernel", KERNEL, cwd=ROOT, env=env(),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    out, _ = await asyncio.wait_for(resume.communicate(), 60)
    assert resume.returncode == 0, out.decode()
    woke = await woke_at(store)
    late = woke - deadline
    assert 0 <= late < 1.0, f"{program} woke {late:.2f} s after its first deadline\n{out.decode()}"
    return f"{program}: killed {into:.1f} s into its {WAIT:g} s wait, woke {late:.2f} s after its first deadline"


async def woke_at(store: str) -> float:
    from ringzero.checkpointers import open_checkpointer
    from ringzero.core.contract.store import KernelStore

    checkpointer = open_checkpointer(store)
    try:
        [record] = await KernelStore(checkpointer).load_processes()
        assert record.status.value == "exited", record
        result: Any = record.result
        return float(result if not isinstance(result, list) else result[1])
    finally:
        await checkpointer.aclose()


@pytest.mark.slow
@pytest.mark.timeout(120 + 10 * TRIALS)
async def test_timers_survive_kills_on_sqlite(tmp_path: Path) -> None:
    rng = random.Random()
    said = await asyncio.gather(*(one_trial(str(tmp_path / f"{program}{i}.db"), program, rng)
                                  for i in range(TRIALS) for program in ("sleeper", "receiver")))
    print("\n".join(said))


@pytest.mark.slow
@pytest.mark.timeout(180)
async def test_timers_survive_kills_on_postgres(postgres_dsn: str) -> None:
    rng = random.Random()
    said = await asyncio.gather(*(one_trial(fresh_database(postgres_dsn), program, rng)
                                  for program in ("sleeper", "receiver")))
    print("\n".join(said))


async def test_resume_leaves_a_sleeper_of_an_hour_and_says_when_it_wakes(tmp_path: Path) -> None:
    store = str(tmp_path / "state.db")
    host, deadline = start_host(store, "sleeper", 3600)
    stop_host(host)
    started = time.monotonic()
    resume = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "ringzero.cli", "resume", "--db", store, "--kernel", KERNEL, cwd=ROOT, env=env(),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    out, _ = await asyncio.wait_for(resume.communicate(), 60)
    took = time.monotonic() - started
    assert resume.returncode == 0, out.decode()
    text = " ".join(out.decode().split())
    assert "1 asleep" in text and "sleeps until" in text, text
    assert took < 15, f"resume took {took:.1f} s: it waited on the sleeper"
    import datetime

    wakes = datetime.datetime.fromtimestamp(deadline).astimezone().isoformat(timespec="seconds")
    assert wakes in text, (wakes, text)
    ps = await asyncio.create_subprocess_exec(sys.executable, "-m", "ringzero.cli", "ps", "--db", store, cwd=ROOT,
                                              env={**env(), "COLUMNS": "200"}, stdout=asyncio.subprocess.PIPE)
    listed, _ = await asyncio.wait_for(ps.communicate(), 60)
    assert "wakes" in listed.decode() and wakes in listed.decode(), listed.decode()  # the sleeper's wake time


@pytest.mark.slow
@pytest.mark.timeout(120)
async def test_serve_lets_a_sleeper_go_and_wakes_it_at_its_deadline(tmp_path: Path) -> None:
    store = str(tmp_path / "state.db")
    host, deadline = start_host(store, "sleeper", 11)  # past the resume's horizon: it is let go
    stop_host(host)
    serve = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "ringzero.cli", "serve", "--db", store, "--kernel", KERNEL, cwd=ROOT, env=env(),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    out, _ = await asyncio.wait_for(serve.communicate(), 60)
    text = out.decode()
    assert serve.returncode == 0, text
    assert "1 waiting in the store for a message or a timer (let go, not replayed)" in " ".join(text.split()), text
    late = await woke_at(store) - deadline
    assert 0 <= late < 1.0, f"woke {late:.2f} s after its deadline\n{text}"
