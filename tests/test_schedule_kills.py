"""Kill -9 trials of schedules: a schedule firing every second is fired by ``ringzero serve``,
killed with SIGKILL at random points and started again, for ``SCHEDULE_SECONDS`` (12 s in
``make test``); then every slot from the first to the last has exactly one firing, each
firing's process ran its program to its end, and the program's tool ran under one key per
firing (counted in the tool's own log). On SQLite and on PostgreSQL; and two serve hosts on one
PostgreSQL store, never both firing a slot."""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import itertools
import os
import random
import signal
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from ringzero import Kernel
from ringzero.checkpointers import open_checkpointer
from tests import schedule_programs
from tests.postgres import fresh_database

ROOT = Path(__file__).resolve().parent.parent
SECONDS = float(os.environ.get("SCHEDULE_SECONDS", "12"))
KERNEL = "tests.schedule_programs:make_kernel"


@contextlib.asynccontextmanager
async def serving(store: str, log: Path) -> AsyncIterator[asyncio.subprocess.Process]:
    host = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "ringzero.cli", "serve", "--db", store, "--kernel", KERNEL, cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT), "RINGZERO_TEST_LOG": str(log)},
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL)
    try:
        yield host
    finally:
        if host.returncode is None:
            host.kill()
        await host.wait()


async def schedule_every_second(store: str) -> float:
    """The schedule, from two seconds on; returns its first slot."""
    async with schedule_programs.make_kernel(store) as kernel:
        start = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(seconds=2)
        schedule = await kernel.schedule(schedule_programs.stamp, name="stamps", every=1.0, missed="all",
                                         start=start)
        return schedule.spec.start


async def removed_and_finished(store: str, log: Path) -> None:
    """Remove the schedule, and serve until every firing's process has ended."""
    async with schedule_programs.make_kernel(store) as kernel:
        [schedule] = await kernel.schedules()
        await schedule.remove()
    async with serving(store, log) as host:
        assert await asyncio.wait_for(host.wait(), 60) == 0


async def check(store: str, log: Path, first: float) -> int:
    """Every slot from the first to the last fired once, ran to its end, stamped once."""
    checkpointer = open_checkpointer(store)
    try:
        async with Kernel(checkpointer=checkpointer) as kernel:
            firings = await kernel.store.firings("stamps")
            records = {r.pid: r for r in await kernel.store.load_processes()}
    finally:
        await checkpointer.aclose()
    slots = sorted(f["slot"] for f in firings)
    assert slots and slots[0] == first, (slots[:3], first)
    assert all(abs(b - a - 1.0) < 1e-6 for a, b in itertools.pairwise(slots)), slots  # no slot missed
    pids = [f["pid"] for f in firings]
    assert None not in pids and len(set(pids)) == len(pids), firings
    spawned = Counter(r.spawn_id for r in records.values() if (r.spawn_id or "").startswith("schedule:"))
    assert len(spawned) == len(slots) and set(spawned.values()) == {1}, spawned  # one process per slot
    assert all(records[pid].status.value == "exited" for pid in pids), [records[p] for p in pids]
    keys = Counter((await asyncio.to_thread(log.read_text)).split())
    # Each firing's tool ran under its process's one key; a run in doubt at a kill may run again,
    # under the same key (the tool is idempotent by its key).
    by_pid = Counter(key.split("-")[1] for key in keys)
    assert set(by_pid) == {str(pid) for pid in pids} and set(by_pid.values()) == {1}, keys
    return len(slots)


async def kill_trial(store: str, log: Path, seconds: float) -> tuple[int, int]:
    first = await schedule_every_second(store)
    rng = random.Random()
    kills = 0
    until = time.monotonic() + seconds
    while time.monotonic() < until:
        async with serving(store, log) as host:
            await asyncio.sleep(rng.uniform(0.5, 3.0))
            host.send_signal(signal.SIGKILL)
            kills += 1
    await removed_and_finished(store, log)
    return kills, await check(store, log, first)


@pytest.mark.slow
@pytest.mark.timeout(120 + 3 * SECONDS)
async def test_a_schedule_fires_each_slot_once_through_kills_on_sqlite_and_postgres(tmp_path: Path,
                                                                                  postgres_dsn: str) -> None:
    # The two stores' trials at once: each host is mostly asleep between its kills.
    (tmp_path / "pg").mkdir()
    results = await asyncio.gather(kill_trial(str(tmp_path / "state.db"), tmp_path / "stamps.log", SECONDS),
                                   kill_trial(fresh_database(postgres_dsn), tmp_path / "pg" / "stamps.log", SECONDS))
    for store, (kills, slots) in zip(("SQLite", "PostgreSQL"), results, strict=True):
        print(f"{store}: {kills} kills, {slots} slots each fired once")


@pytest.mark.slow
@pytest.mark.timeout(120)
async def test_two_serve_hosts_on_one_postgresql_store_never_both_fire_a_slot(tmp_path: Path,
                                                                             postgres_dsn: str) -> None:
    store, log = fresh_database(postgres_dsn), tmp_path / "stamps.log"
    first = await schedule_every_second(store)
    async with serving(store, log), serving(store, log):
        await asyncio.sleep(6)
    await removed_and_finished(store, log)
    assert await check(store, log, first) >= 5
