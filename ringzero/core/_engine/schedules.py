"""Schedules: a program spawned at each slot of a period or a cron expression, exactly once.

A schedule is a row of the store (``KernelStore.put_schedule``): what to spawn, when, and what
to do with slots missed while no kernel fired it. Any kernel that fires schedules
(``Kernel.fire_schedules``; ``ringzero serve`` does) looks at them at least once a second and,
when a slot is due, claims its firing row first (``KernelStore.claim_firing``: where several
kernels share the store, exactly one gets it), spawns the program as a top-level process, and
writes the pid into the row. A kernel that dies between the claim and the spawn leaves a
firing without a pid; ``REPAIR_AFTER`` seconds later another kernel (or the same one, back)
claims its repair, spawns it unless the store holds a process created for it, and writes its
pid, even if the schedule was removed since: a firing claimed is owed. That takes one thing
on trust: a kernel that claimed a firing spawns it within ``REPAIR_AFTER`` seconds or has died
(a lease, as a durable workflow engine's).

Missed slots (``missed``): ``"once"`` (the default) fires once for all the slots that passed while
nothing fired, then goes on from now; ``"all"`` fires each of them, oldest first; ``"skip"``
fires none of them. A slot counts as missed once it is ``GRACE`` seconds past.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import math
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

from ringzero.core._engine.runtime import Runtime
from ringzero.core.contract.errors import CheckpointerError, Closed, InvalidArgument, MissingExtra, RingzeroError
from ringzero.core.contract.types import JSON, Program, ensure_json
from ringzero.core.support.references import check_program, import_reference, program_reference
from ringzero.core.support.timeouts import cancel_and_wait

__all__ = ["GRACE", "MISSED", "REPAIR_AFTER", "Schedule", "ScheduleFirer", "ScheduleSpec", "schedule_spec"]

MISSED = ("once", "all", "skip")
GRACE = 1.0
"""Seconds after its time within which a slot is on time, not missed."""
REPAIR_AFTER = 5.0
"""Seconds after which a firing claimed but never spawned is taken as its kernel's death."""
RECENT_FIRINGS = 100
"""The latest firings of a schedule each look checks for one to repair."""
LOOK_EVERY = 1.0
"""Seconds between looks at the store's schedules (new, paused, removed ones)."""
_NAME = re.compile(r"[A-Za-z0-9_.-]{1,100}")
log = logging.getLogger("ringzero.schedules")


@dataclass(frozen=True)
class ScheduleSpec:
    """A schedule as the store holds it."""

    name: str
    program: str
    """``module:qualname`` of the program each firing spawns."""
    args: Sequence[JSON]
    every: float | None
    """Seconds between slots, from ``start``; or None, for ``cron``."""
    cron: str | None
    """A cron expression (UTC), read by croniter; or None, for ``every``."""
    missed: str
    start: float
    """Wall-clock time of the first slot of ``every``; for ``cron``, no slot comes before it."""
    paused: bool = False
    removed: bool = False
    problem: str | None = None
    """Why the firers cannot fire it now (its slots cannot be computed, its program does not
    import), as the last firer to look wrote it; None while all is well. ``ps`` and ``top`` show it."""

    def to_json(self) -> dict[str, JSON]:
        return {**asdict(self), "args": list(self.args)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ScheduleSpec:
        return cls(name=str(data["name"]), program=str(data["program"]), args=tuple(data.get("args") or ()),
                   every=None if data.get("every") is None else float(data["every"]), cron=data.get("cron"),
                   missed=str(data.get("missed", "once")), start=float(data["start"]),
                   paused=bool(data.get("paused")), removed=bool(data.get("removed")),
                   problem=None if data.get("problem") is None else str(data["problem"]))

    def first_slot(self) -> float:
        """Its first slot: ``start`` for ``every``; for ``cron``, the expression's first slot at
        or after ``start`` (a schedule registered between two slots waits for the next one)."""
        return self.next_after(self.start - 1e-3)

    def next_after(self, t: float) -> float:
        """The first slot strictly after ``t``."""
        if self.every is not None:
            if t < self.start:
                return self.start
            return self.start + (self._periods(t) + 1) * self.every
        slot: float = _cron(self.cron).get_next(float, start_time=_utc(max(t, self.start - 1e-3)))
        return max(slot, self.start)

    def _periods(self, t: float) -> int:
        """Whole periods from ``start`` to ``t``: a slot's own time counts as its, whatever the
        rounding of ``start + k * every``."""
        assert self.every is not None
        return math.floor((t - self.start) / self.every + 1e-6)

    def last_at_or_before(self, t: float) -> float | None:
        """The last slot at or before ``t`` (None: none yet)."""
        if t < self.start:
            return None
        if self.every is not None:
            return self.start + self._periods(t) * self.every
        slot: float = _cron(self.cron).get_prev(float, start_time=_utc(t + 1e-3))
        return slot if slot >= self.start else None


def schedule_spec(program: Program, args: Sequence[JSON], *, name: str, every: datetime.timedelta | float | None,
                  cron: str | None, missed: str, start: datetime.datetime | None) -> ScheduleSpec:
    """The spec of a new schedule, every argument checked (InvalidArgument naming what is wrong)."""
    check_program(program, args)
    reference, importable = program_reference(program)
    if not importable:
        raise InvalidArgument(f"a scheduled program is spawned by reference, and {reference!r} does not import back "
                              "to it: define it at the top level of an importable module")
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise InvalidArgument(f"a schedule's name is 1-100 letters, digits, '_', '.' or '-', not {name!r}")
    if (every is None) == (cron is None):
        raise InvalidArgument("a schedule takes one of every= (a timedelta or seconds) and cron= (a cron expression)")
    seconds = every.total_seconds() if isinstance(every, datetime.timedelta) else every
    if seconds is not None and (isinstance(seconds, bool) or not isinstance(seconds, (int, float))
                                or not seconds >= 0.1):
        raise InvalidArgument(f"every= is a timedelta or a number of seconds of at least 0.1, not {every!r}")
    if cron is not None:
        if not isinstance(cron, str):
            raise InvalidArgument(f"cron= is a cron expression (a string such as '0 7 * * *'), not {cron!r}")
        _cron(cron)
    if missed not in MISSED:
        raise InvalidArgument(f"missed= is one of {', '.join(map(repr, MISSED))}, not {missed!r}")
    if start is not None and (not isinstance(start, datetime.datetime) or start.utcoffset() is None):
        raise InvalidArgument(f"start= is an aware datetime (with a time zone), not {start!r}")
    ensure_json(list(args), f"the arguments of schedule {name!r}")
    first = time.time() if start is None else start.timestamp()
    return ScheduleSpec(name, reference, tuple(args), None if seconds is None else float(seconds), cron, missed,
                        first)


class Schedule:
    """A schedule in the store: what ``Kernel.schedule`` returns and ``Kernel.schedules`` lists."""

    def __init__(self, runtime: Runtime, spec: ScheduleSpec) -> None:
        self._runtime = runtime
        self.spec = spec

    def __repr__(self) -> str:
        return f"<Schedule {self.name!r} {self.spec.program} next {self.next_firing}>"

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def next_firing(self) -> datetime.datetime | None:
        """When its next slot comes (UTC); None while it is paused or once it is removed."""
        if self.spec.paused or self.spec.removed:
            return None
        return datetime.datetime.fromtimestamp(self.spec.next_after(time.time() - GRACE), datetime.timezone.utc)

    async def firings(self, limit: int | None = None) -> list[dict[str, Any]]:
        """Its firings, newest first: ``{"slot", "pid"}`` (``pid`` None for one being made, or
        a missed slot skipped: ``"skipped": True``)."""
        return await self._runtime.store.firings(self.name, limit)

    async def pause(self) -> None:
        """Fire nothing until ``resume``; slots that pass meanwhile count as missed."""
        await self._set(paused=True)

    async def resume(self) -> None:
        await self._set(paused=False)

    async def remove(self) -> None:
        """Fire no more (the processes it spawned go on; its firings stay in the store)."""
        await self._set(removed=True)

    async def _set(self, *, paused: bool | None = None, removed: bool | None = None) -> None:
        current = await self._runtime.store.schedule(self.name)
        spec = ScheduleSpec.from_json(current) if current is not None else self.spec
        self.spec = replace(spec, paused=spec.paused if paused is None else paused,
                            removed=spec.removed if removed is None else removed)
        await self._runtime.store.put_schedule(self.name, self.spec.to_json())


class ScheduleFirer:
    """What fires a kernel's store's schedules: one task, looking at them once a second."""

    def __init__(self, runtime: Runtime, host: str, programs: Mapping[str, Program] | None = None) -> None:
        self.runtime = runtime
        self.host = host
        """Who claims the firings (the kernel's monitor id, or its host and OS pid)."""
        self.programs: Mapping[str, Program] = programs or {}
        self.failures = 0
        """Looks at a schedule that failed (its slots or its program): each is logged too."""
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run(), name="ringzero-schedules")

    async def aclose(self) -> None:
        if self._task is not None:
            await cancel_and_wait((self._task,))

    async def _run(self) -> None:
        while True:
            wake = time.time() + LOOK_EVERY
            try:
                for data in await self.runtime.store.schedules():
                    wake = min(wake, await self._look(data))
            except (RingzeroError, OSError):  # the store failed: looked at again a moment later
                pass
            await asyncio.sleep(max(0.01, wake - time.time()))

    async def _look(self, data: Mapping[str, Any]) -> float:
        """Settle and fire one schedule; when to look at it again. One that fails (its slots or
        its program) is logged, counted and its row says why; the others go on firing."""
        try:
            spec = ScheduleSpec.from_json(data)
            recent = await self.runtime.store.firings(spec.name, limit=RECENT_FIRINGS)  # one read for both
            await self.settle(spec, recent)  # a firing claimed is owed, whatever became of its schedule
            wake = math.inf
            if not spec.paused and not spec.removed:
                wake = await self.fire_due(spec, recent[:1])
        except (CheckpointerError, Closed, OSError):
            raise  # the store's: every schedule waits for it alike
        except Exception as exc:
            await self._failing(data, f"{type(exc).__name__}: {exc}")
            return math.inf
        if spec.problem is not None:
            await self._failing(data, None)
        return wake

    async def _failing(self, data: Mapping[str, Any], problem: str | None) -> None:
        """Keep what is wrong with a schedule in its row (None: it fires again), logged once
        per change; each failed look is counted."""
        name = str(data.get("name"))
        if problem is not None:
            self.failures += 1
        if data.get("problem") == problem:
            return
        if problem is None:
            log.warning("schedule %r fires again", name)
        else:
            log.error("schedule %r cannot fire: %s", name, problem)
        current = await self.runtime.store.schedule(name)
        if current is not None:
            await self.runtime.store.put_schedule(name, {**current, "problem": problem})

    async def fire_due(self, spec: ScheduleSpec, newest: Sequence[Mapping[str, Any]] | None = None) -> float:
        """Fire what of ``spec`` is due now (``newest``: its latest firing, where read already);
        returns when its next slot comes."""
        store = self.runtime.store
        now = time.time()
        if newest is None:
            newest = await store.firings(spec.name, limit=1)
        done = float(newest[0]["slot"]) if newest else None
        due = spec.next_after(done) if done is not None else spec.first_slot()
        while due <= now:
            if now - due <= GRACE or spec.missed == "all":
                await self._fire(spec, due)
            else:  # missed while nothing fired: ``due`` is a slot at or before now, so there is a last one
                last = spec.last_at_or_before(now) or due
                if spec.missed == "once":
                    await self._fire(spec, last)
                else:
                    await store.claim_firing(spec.name, last, "firings", {"slot": last, "pid": None,
                                                                         "skipped": True, "at": now})
                due = spec.next_after(last)
                break
            due = spec.next_after(due)
        return due

    async def settle(self, spec: ScheduleSpec, recent: Sequence[Mapping[str, Any]] | None = None) -> bool:
        """Repair each of the latest ``RECENT_FIRINGS`` firings of ``spec`` whose kernel died
        between its claim and its spawn (``REPAIR_AFTER`` seconds ago): a later slot may have
        fired since, from a kernel started after it (``recent``: those firings, where read
        already). Whether one of them is still unsettled."""
        if recent is None:
            recent = await self.runtime.store.firings(spec.name, limit=RECENT_FIRINGS)
        unsettled = False
        for firing in recent:
            if firing.get("pid") is not None or firing.get("skipped"):
                continue
            if time.time() - float(firing.get("at", 0)) > REPAIR_AFTER:
                await self._repair(spec, float(firing["slot"]))
            else:
                unsettled = True
        return unsettled

    async def unsettled(self) -> bool:
        """Whether a firing of any schedule, removed ones included, is claimed without its pid:
        one in flight, or one to repair (``ringzero serve`` stays until it is settled)."""
        return any([await self.settle(ScheduleSpec.from_json(data)) for data in await self.runtime.store.schedules()])

    async def _fire(self, spec: ScheduleSpec, slot: float) -> None:
        store = self.runtime.store
        body: dict[str, JSON] = {"slot": slot, "pid": None, "host": self.host, "at": time.time()}
        if not await store.claim_firing(spec.name, slot, "firings", body):
            return  # another kernel fires it
        pid = await self._spawn(spec, slot)
        await store.put_firing(spec.name, slot, {**body, "pid": pid})

    async def _repair(self, spec: ScheduleSpec, slot: float) -> None:
        """The firing at ``slot`` was claimed by a kernel that died before it wrote the pid."""
        store = self.runtime.store
        if not await store.claim_firing(spec.name, slot, "repairs", {"host": self.host, "at": time.time()}):
            return
        pid = await store.spawned_as(_spawn_id(spec, slot))
        if pid is None:
            pid = await self._spawn(spec, slot)
        await store.put_firing(spec.name, slot, {"slot": slot, "pid": pid, "host": self.host, "at": time.time(),
                                                 "repaired": True})

    async def _spawn(self, spec: ScheduleSpec, slot: float) -> int:
        program = self.programs.get(spec.program) or import_reference(spec.program, "a scheduled program")
        process = await self.runtime.spawn_process(program, spec.args, name=spec.name, priority=10, limits=None,
                                                   parent=None, spawn_id=_spawn_id(spec, slot))
        return process.pid


def _spawn_id(spec: ScheduleSpec, slot: float) -> str:
    return f"schedule:{spec.name}:{round(slot * 1000)}"


def _utc(t: float) -> datetime.datetime:
    return datetime.datetime.fromtimestamp(t, datetime.timezone.utc)


def _cron(expression: str | None) -> Any:
    """A croniter over ``expression`` (InvalidArgument where it is none; MissingExtra where
    croniter is not installed)."""
    try:
        from croniter import croniter
    except ImportError as exc:  # pragma: no cover - the extra is installed with ringzero[cron]
        raise MissingExtra("a cron= schedule", "cron") from exc
    if not isinstance(expression, str) or not croniter.is_valid(expression):
        raise InvalidArgument(f"{expression!r} is not a cron expression croniter reads (e.g. '0 7 * * *')")
    return croniter(expression, _utc(time.time()))
