"""Schedules: each slot of a period or a cron expression fires its program once, counted at the
program, with one kernel or several on the store; missed slots by policy; pause, resume, remove;
a firing whose kernel died as it fired is repaired. Kill -9 trials: ``tests/test_schedule_kills.py``."""

from __future__ import annotations

import asyncio
import datetime
import itertools
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from ringzero import Context, Kernel
from ringzero.checkpointers import SqliteCheckpointer
from ringzero.core._engine.schedules import LOOK_EVERY, REPAIR_AFTER, ScheduleSpec
from ringzero.core.contract.errors import InvalidArgument

FIRED: Counter[str] = Counter()
"""Runs of the scheduled program, by the argument it was given and the slot it ran in."""


async def tick(ctx: Context, label: str) -> str:
    FIRED[label] += 1
    return label


def kernel_on(db: Path) -> Kernel:
    return Kernel(checkpointer=SqliteCheckpointer(db))


async def settled(kernel: Kernel) -> None:
    """Every process the schedules spawned here has ended."""
    for _ in range(500):
        if not kernel.runtime.procs:
            return
        await asyncio.sleep(0.01)


async def quiet(*kernels: Kernel) -> None:
    """After a removal: every firer has looked again (one that read the schedule just before it
    was removed may fire one more slot), every firing claimed has its pid, every process ended."""
    await asyncio.sleep(LOOK_EVERY + 0.5)
    for kernel in kernels:
        assert kernel.schedule_firer is not None
        while await kernel.schedule_firer.unsettled():
            await asyncio.sleep(0.05)
        await settled(kernel)


async def test_each_slot_fires_once_counted_at_the_program(tmp_path: Path) -> None:
    FIRED.clear()
    async with kernel_on(tmp_path / "state.db") as kernel:
        schedule = await kernel.schedule(tick, "a", name="every-0.3", every=0.3)
        kernel.fire_schedules()
        await asyncio.sleep(2.0)
        await schedule.remove()
        await quiet(kernel)
        firings = await schedule.firings()
    slots = sorted(f["slot"] for f in firings)
    assert len(slots) >= 5 and all(f["pid"] is not None for f in firings)
    assert all(abs((b - a) - 0.3) < 1e-6 for a, b in itertools.pairwise(slots)), slots  # none skipped
    assert FIRED["a"] == len(slots)


async def test_two_kernels_on_one_store_fire_each_slot_once(tmp_path: Path) -> None:
    FIRED.clear()
    async with kernel_on(tmp_path / "state.db") as first, kernel_on(tmp_path / "state.db") as second:
        schedule = await first.schedule(tick, "b", name="shared", every=0.2)
        first.fire_schedules()
        second.fire_schedules()
        await asyncio.sleep(2.0)
        await schedule.remove()
        await quiet(first, second)
        firings = await schedule.firings()
    assert len(firings) >= 8 and FIRED["b"] == len(firings) == len({f["slot"] for f in firings})
    assert {f["host"] for f in firings} <= {first.monitor.id, second.monitor.id}  # type: ignore[union-attr]


@pytest.mark.parametrize(("missed", "fired"), [("once", 1), ("all", 10), ("skip", 0)])
async def test_slots_missed_while_nothing_fired_follow_the_policy(tmp_path: Path, missed: str, fired: int) -> None:
    FIRED.clear()
    start = datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(seconds=9.5)
    async with kernel_on(tmp_path / "state.db") as kernel:
        schedule = await kernel.schedule(tick, missed, name=f"missed-{missed}", every=1.0, missed=missed, start=start)
        await kernel.fire_schedules().fire_due(schedule.spec)
        await settled(kernel)
        firings = await schedule.firings()
    assert FIRED[missed] == fired
    assert len(firings) == max(fired, 1)  # a skip leaves its mark, so the next look starts after it


async def test_a_paused_schedule_fires_nothing_until_resumed_and_a_removed_one_never(tmp_path: Path) -> None:
    FIRED.clear()
    async with kernel_on(tmp_path / "state.db") as kernel:
        schedule = await kernel.schedule(tick, "p", name="pausing", every=0.2, missed="skip")
        await schedule.pause()
        kernel.fire_schedules()
        await asyncio.sleep(0.8)
        assert FIRED["p"] == 0 and schedule.next_firing is None
        await schedule.resume()
        await asyncio.sleep(1.0)
        assert FIRED["p"] >= 2
        await schedule.remove()
        await asyncio.sleep(0.3)
        count = FIRED["p"]
        await asyncio.sleep(0.8)
        assert FIRED["p"] == count and await kernel.schedules() == []


async def test_asking_again_returns_the_schedule_and_other_arguments_replace_it(tmp_path: Path) -> None:
    async with kernel_on(tmp_path / "state.db") as kernel:
        first = await kernel.schedule(tick, "x", name="daily", cron="0 7 * * *")
        again = await kernel.schedule(tick, "x", name="daily", cron="0 7 * * *")
        assert again.spec == first.spec
        other = await kernel.schedule(tick, "y", name="daily", cron="30 6 * * *")
        [listed] = await kernel.schedules()
        assert listed.spec == other.spec and listed.spec.args == ("y",)
        wakes = listed.next_firing
        assert wakes is not None and (wakes.hour, wakes.minute) == (6, 30)
        assert 0 < (wakes - datetime.datetime.now(datetime.timezone.utc)).total_seconds() <= 86400


async def test_a_firing_whose_kernel_died_as_it_fired_is_repaired_once(tmp_path: Path) -> None:
    FIRED.clear()
    async with kernel_on(tmp_path / "state.db") as kernel:
        schedule = await kernel.schedule(tick, "r", name="repaired", every=3600)
        slot = schedule.spec.start
        # The firing claimed by a kernel that died before it spawned (and another that spawned, then died).
        dead = {"slot": slot, "pid": None, "host": "dead", "at": time.time() - REPAIR_AFTER - 1}
        assert await kernel.store.claim_firing("repaired", slot, "firings", dead)
        firer = kernel.fire_schedules()
        await firer.settle(schedule.spec)
        await firer.settle(schedule.spec)
        await settled(kernel)
        [firing] = await schedule.firings()
    assert FIRED["r"] == 1 and firing["pid"] is not None and firing["repaired"]


@pytest.mark.parametrize(("options", "says"), [
    ({}, "one of every="),
    ({"every": 1, "cron": "* * * * *"}, "one of every="),
    ({"every": 0.01}, "at least 0.1"),
    ({"cron": "every morning"}, "not a cron expression"),
    ({"every": 1, "missed": "later"}, "missed= is one of"),
    ({"every": 1, "start": datetime.datetime(2030, 1, 1)}, "aware datetime"),
    ({"every": 1, "name": "a/b"}, "a schedule's name"),
])
async def test_bad_arguments_are_refused_naming_what_is_wrong(tmp_path: Path, options: dict[str, Any],
                                                             says: str) -> None:
    async with kernel_on(tmp_path / "state.db") as kernel:
        with pytest.raises(InvalidArgument, match=says):
            await kernel.schedule(tick, "z", **{"name": "bad", **options})
        assert await kernel.schedules() == []


async def test_a_program_that_does_not_import_back_is_refused(tmp_path: Path) -> None:
    async def local(ctx: Context) -> None:
        return None

    async with kernel_on(tmp_path / "state.db") as kernel:
        with pytest.raises(InvalidArgument, match="does not import back"):
            await kernel.schedule(local, name="local", every=1)


def test_slots_of_a_period_and_of_a_cron_expression() -> None:
    spec = ScheduleSpec("s", "m:f", (), 10.0, None, "once", 1000.0)
    assert spec.next_after(0) == 1000 and spec.next_after(1000) == 1010 and spec.next_after(1015) == 1020
    assert spec.last_at_or_before(999) is None and spec.last_at_or_before(1019.9) == 1010
    daily = ScheduleSpec("d", "m:f", (), None, "0 7 * * *", "once", 0.0)
    seven = datetime.datetime(2026, 11, 28, 7, tzinfo=datetime.timezone.utc).timestamp()
    assert daily.next_after(seven - 1) == seven and daily.next_after(seven) == seven + 86400
    assert daily.last_at_or_before(seven + 5) == seven


async def test_ps_shows_each_schedule_with_its_next_firing(tmp_path: Path) -> None:
    import os
    import sys

    async with kernel_on(tmp_path / "state.db") as kernel:
        await kernel.schedule(tick, "ps", name="hourly-digest", every=3600,
                              start=datetime.datetime(2026, 1, 1, tzinfo=datetime.timezone.utc))
        paused = await kernel.schedule(tick, "ps", name="morning", cron="0 7 * * *")
        await paused.pause()
    ps = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "ringzero.cli", "ps", "--db", str(tmp_path / "state.db"),
        env={**os.environ, "COLUMNS": "200"}, stdout=asyncio.subprocess.PIPE)
    out = (await asyncio.wait_for(ps.communicate(), 60))[0].decode()
    assert "schedules" in out and "hourly-digest" in out and "tests.test_schedules:tick" in out, out
    next_hour = datetime.datetime.fromtimestamp((time.time() // 3600 + 1) * 3600).astimezone()
    assert next_hour.isoformat(timespec="seconds") in out, out
    assert "morning" in out and "cron 0 7 * * *" in out and "paused" in out, out


async def test_a_cron_schedule_registered_between_its_slots_fires_at_its_next_slot_not_at_once(
        tmp_path: Path) -> None:
    """Every 2 seconds by cron (croniter's sixth field is seconds), registered half-way between
    two slots: each firing is at one of its slots, the first the next one after registration."""
    FIRED.clear()
    while time.time() % 2 < 0.7 or time.time() % 2 > 1.3:  # half-way between two even seconds
        await asyncio.sleep(0.05)
    async with kernel_on(tmp_path / "state.db") as kernel:
        registered = time.time()
        schedule = await kernel.schedule(tick, "c", name="cron-2s", cron="* * * * * */2")
        firer = kernel.fire_schedules()
        await asyncio.sleep(0.5)
        assert FIRED["c"] == 0  # nothing at registration: its first slot is still to come
        await asyncio.sleep(3.0)
        await schedule.remove()
        await quiet(kernel)
        firings = await schedule.firings()
    slots = sorted(f["slot"] for f in firings)
    assert slots and all(slot % 2 == 0 for slot in slots), slots
    assert registered < slots[0] < registered + 2, (registered, slots)
    assert FIRED["c"] == len(slots) and firer.failures == 0


async def test_the_readme_cron_registered_at_any_time_leaves_the_schedules_after_it_firing(
        tmp_path: Path) -> None:
    """``cron="0 7 * * *"`` registered now (between two of its slots) and looked at later than
    ``GRACE`` after: it waits for 07:00 UTC, and a schedule listed after it fires as it should."""
    FIRED.clear()
    async with kernel_on(tmp_path / "state.db") as kernel:
        morning = await kernel.schedule(tick, "m", name="a-morning", cron="0 7 * * *")
        often = await kernel.schedule(tick, "o", name="b-often", every=0.3, missed="skip")
        await asyncio.sleep(1.5)  # past GRACE: the registration time is long gone when the firer looks
        firer = kernel.fire_schedules()
        await asyncio.sleep(2.0)
        await often.remove()
        await quiet(kernel)
        assert firer.failures == 0 and await morning.firings() == []
        assert morning.next_firing is not None and (morning.next_firing.hour, morning.next_firing.minute) == (7, 0)
    now = datetime.datetime.now(datetime.timezone.utc)
    assert FIRED["o"] >= 4 and FIRED["m"] == (1 if (now.hour, now.minute) == (7, 0) else 0)


async def test_a_schedule_that_cannot_fire_is_reported_and_the_others_keep_firing(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A schedule row whose slots cannot be computed (a cron expression that no longer reads)
    is logged once, counted, and named by ``ps`` and ``top``; the schedule after it fires."""
    import os
    import sys

    from ringzero.top import read_snapshot

    FIRED.clear()
    async with kernel_on(tmp_path / "state.db") as kernel:
        broken = ScheduleSpec("a-broken", "tests.test_schedules:tick", ("x",), None, "61 * * * *", "once", time.time())
        await kernel.store.put_schedule(broken.name, broken.to_json())
        often = await kernel.schedule(tick, "k", name="b-often", every=0.3, missed="skip")
        firer = kernel.fire_schedules()
        await asyncio.sleep(2.5)
        await often.remove()
        await quiet(kernel)
        snapshot = await read_snapshot(kernel.checkpointer)
    assert FIRED["k"] >= 5 and firer.failures >= 2
    assert list(snapshot.failing_schedules) == ["a-broken"]
    assert "not a cron expression" in snapshot.failing_schedules["a-broken"]
    logged = [r for r in caplog.records if r.name == "ringzero.schedules" and "a-broken" in r.getMessage()]
    assert len(logged) == 1, logged  # once per change, not once per look
    ps = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "ringzero.cli", "ps", "--db", str(tmp_path / "state.db"),
        env={**os.environ, "COLUMNS": "250"}, stdout=asyncio.subprocess.PIPE)
    out = (await asyncio.wait_for(ps.communicate(), 60))[0].decode()
    assert "a-broken" in out and "cannot fire" in out, out
