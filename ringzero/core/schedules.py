"""Schedules: what ``Kernel.schedule`` returns and the store holds.

The public face of ``ringzero.core._engine.schedules`` (the engine's modules are private)."""

from ringzero.core._engine.schedules import MISSED, Schedule, ScheduleSpec

__all__ = ["MISSED", "Schedule", "ScheduleSpec"]
