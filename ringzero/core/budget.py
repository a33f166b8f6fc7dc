"""Budget accounting for one process: what it spent, what it lent its children, what is left.

A child's limits are carved out of its parent's remaining budget when it is spawned
(reserved); when the child ends, the reservation is released and what the child really
spent is charged to the parent, so whatever the child left unspent returns to the parent.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from ringzero.core.errors import InvalidArgument
from ringzero.core.types import JSON, Limits, StopReason

__all__ = ["Meter", "Spend"]

_CONSUMABLE = ("tokens", "cost", "llm_calls", "steps", "exec_seconds")
_REASON = {
    "tokens": StopReason.TOKENS,
    "cost": StopReason.COST,
    "llm_calls": StopReason.LLM_CALLS,
    "steps": StopReason.STEPS,
    "exec_seconds": StopReason.EXEC_SECONDS,
    "wall_seconds": StopReason.WALL_SECONDS,
}


@dataclass(frozen=True)
class Spend:
    """Amounts of each consumable budget."""

    tokens: int = 0
    cost: float = 0.0
    llm_calls: int = 0
    steps: int = 0
    exec_seconds: float = 0.0

    def __add__(self, other: Spend) -> Spend:
        return Spend(**{f.name: getattr(self, f.name) + getattr(other, f.name) for f in fields(self)})

    def __sub__(self, other: Spend) -> Spend:
        return Spend(**{f.name: getattr(self, f.name) - getattr(other, f.name) for f in fields(self)})

    def to_dict(self) -> dict[str, JSON]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> Spend:
        return cls(**(data or {}))


class Meter:
    """Tracks one process's spending against its Limits."""

    def __init__(self, limits: Limits, wall_before: float = 0.0) -> None:
        self.limits = limits
        self.spent = Spend()
        self.reserved = Spend()
        self.wall_before = wall_before
        self.warned: set[str] = set()

    def charge(self, **amounts: float) -> None:
        self.spent = self.spent + Spend(**amounts)  # type: ignore[arg-type]

    def remaining(self, resource: str) -> float | None:
        """What is left of ``resource``; None when it is unlimited."""
        limit = getattr(self.limits, resource)
        if limit is None:
            return None
        if resource == "wall_seconds":
            return float(limit) - self.wall_before
        return float(limit) - float(getattr(self.spent, resource)) - float(getattr(self.reserved, resource))

    def crossed(self, resource: str, *, about_to_add: float = 0.0) -> StopReason | None:
        """The stop reason if ``resource`` is (or, with ``about_to_add``, would be) over its limit."""
        left = self.remaining(resource)
        if left is None:
            return None
        return _REASON[resource] if left - about_to_add < 0 else None

    def first_crossed(self) -> StopReason | None:
        for resource in _CONSUMABLE:
            reason = self.crossed(resource)
            if reason is not None:
                return reason
        return None

    def new_warnings(self, fraction: float = 0.9) -> list[tuple[str, float, float]]:
        """Resources that passed ``fraction`` of their limit since the last call: (name, used, limit)."""
        out = []
        for resource in _CONSUMABLE:
            limit = getattr(self.limits, resource)
            if limit is None or resource in self.warned:
                continue
            used = float(getattr(self.spent, resource) + getattr(self.reserved, resource))
            if used >= fraction * limit:
                self.warned.add(resource)
                out.append((resource, used, float(limit)))
        return out

    def carve(self, requested: Limits | None) -> Limits:
        """The limits a new child gets, reserved from this meter.

        Unspecified budgets default to half of what is left; a request larger than what is
        left is refused. Wall time is not shared out: a child may not outlive its parent's.
        """
        values: dict[str, Any] = {}
        for resource in _CONSUMABLE:
            left = self.remaining(resource)
            asked = None if requested is None else getattr(requested, resource)
            if left is None:
                values[resource] = asked
                continue
            left = max(0.0, left)
            if asked is None:
                asked = left / 2
                if resource in ("tokens", "llm_calls", "steps"):
                    asked = int(asked)
            elif asked > left:
                raise InvalidArgument(
                    f"the child asks for {asked} {resource} but its parent has only {left:g} left"
                )
            values[resource] = asked
        wall_left = self.remaining("wall_seconds")
        asked_wall = None if requested is None else requested.wall_seconds
        if wall_left is not None:
            asked_wall = wall_left if asked_wall is None else min(asked_wall, wall_left)
        child = Limits(**values, wall_seconds=asked_wall)
        self.reserved = self.reserved + _as_spend(child)
        return child

    def settle(self, child_limits: Limits, child_spent: Spend) -> None:
        """Release a finished child's reservation and charge what it really spent."""
        self.reserved = self.reserved - _as_spend(child_limits)
        self.spent = self.spent + child_spent


def _as_spend(limits: Limits) -> Spend:
    return Spend(**{r: getattr(limits, r) or 0 for r in _CONSUMABLE})
