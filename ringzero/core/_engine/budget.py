"""Budget accounting for one process: what it spent, what it lent its children, what is left.

A child's limits are carved out of its parent's remaining budget when it is spawned
(reserved); when the child ends, the reservation is released and what the child really
spent is charged to the parent, so whatever the child left unspent returns to the parent.
This runs at every syscall, so it works on plain dicts of the limited resources only.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from ringzero.core.contract.errors import InvalidArgument
from ringzero.core.contract.types import JSON, Limits, StopReason

__all__ = ["Meter", "Spend"]

CONSUMABLE = ("tokens", "cost", "llm_calls", "steps", "exec_seconds")
_WHOLE = ("tokens", "llm_calls", "steps")
_NONE_WARNED: frozenset[str] = frozenset()
"""What no meter has warned of yet: one object for every process, not a set each."""
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
    """Amounts of each consumable budget: a snapshot of what a process consumed."""

    tokens: int = 0
    cost: float = 0.0
    llm_calls: int = 0
    steps: int = 0
    exec_seconds: float = 0.0

    def to_dict(self) -> dict[str, JSON]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> Spend:
        return cls(**{k: v for k, v in (data or {}).items() if k in CONSUMABLE})


class Meter:
    """Tracks one process's spending against its Limits."""

    def __init__(self, limits: Limits, wall_before: float = 0.0) -> None:
        self.limits = limits
        self.wall_before = wall_before
        self._spent: dict[str, float] = dict.fromkeys(CONSUMABLE, 0)
        self._reserved: dict[str, float] = dict.fromkeys(CONSUMABLE, 0)
        self._limit = {r: float(getattr(limits, r)) for r in CONSUMABLE if getattr(limits, r) is not None}
        self._warned: frozenset[str] = _NONE_WARNED  # a new set per meter only once one warns

    @property
    def spent(self) -> Spend:
        spent = self._spent
        return Spend(tokens=int(spent["tokens"]), cost=spent["cost"], llm_calls=int(spent["llm_calls"]),
                     steps=int(spent["steps"]), exec_seconds=spent["exec_seconds"])

    def spent_dict(self) -> dict[str, JSON]:
        """``spent.to_dict()`` without the dataclass on the way (it is saved at every transition)."""
        return {r: (int(v) if r in _WHOLE else v) for r, v in self._spent.items()}

    def charge(self, **amounts: float) -> None:
        for resource, amount in amounts.items():
            self._spent[resource] += amount

    def charge_one(self, resource: str, amount: float) -> None:
        """``charge`` of one resource, without building a dict (it runs at every syscall)."""
        self._spent[resource] += amount

    def charge_llm(self, tokens: int, cost: float) -> None:
        """One LLM call's charge (at every ``ctx.llm``)."""
        spent = self._spent
        spent["tokens"] += tokens
        spent["llm_calls"] += 1
        spent["cost"] += cost

    def remaining(self, resource: str) -> float | None:
        """What is left of ``resource``; None when it is unlimited."""
        if resource == "wall_seconds":
            wall = self.limits.wall_seconds
            return None if wall is None else wall - self.wall_before
        limit = self._limit.get(resource)
        if limit is None:
            return None
        return limit - self._spent[resource] - self._reserved[resource]

    def crossed(self, resource: str, *, about_to_add: float = 0.0) -> StopReason | None:
        """The stop reason if ``resource`` is (or, with ``about_to_add``, would be) over its limit."""
        if resource not in self._limit and resource != "wall_seconds":
            return None  # unlimited: the common case, asked at every syscall
        left = self.remaining(resource)
        return None if left is None or left - about_to_add >= 0 else _REASON[resource]

    @property
    def limited(self) -> bool:
        """Whether any consumable budget has a limit (if not, no syscall can cross one)."""
        return bool(self._limit)

    def first_crossed(self) -> StopReason | None:
        for resource in self._limit:
            if self._spent[resource] + self._reserved[resource] > self._limit[resource]:
                return _REASON[resource]
        return None

    def new_warnings(self, fraction: float = 0.9) -> list[tuple[str, float, float]]:
        """Resources that passed ``fraction`` of their limit since the last call: (name, used, limit)."""
        out = []
        for resource, limit in self._limit.items():
            used = self._spent[resource] + self._reserved[resource]
            if resource not in self._warned and used >= fraction * limit:
                self._warned = self._warned | {resource}
                out.append((resource, used, limit))
        return out

    def carve(self, requested: Limits | None) -> Limits:
        """The limits a new child gets, reserved from this meter.

        Unspecified budgets default to half of what is left; a request larger than what is
        left is refused. Wall time is not shared out: a child may not outlive its parent's.
        """
        if requested is not None and not isinstance(requested, Limits):
            raise InvalidArgument(f"limits must be a ringzero.Limits, not {type(requested).__name__} {requested!r:.60}")
        values: dict[str, Any] = {}
        for resource in CONSUMABLE:
            left = self.remaining(resource)
            asked = None if requested is None else getattr(requested, resource)
            if left is not None:
                left = max(0.0, left)
                if asked is None:
                    asked = int(left / 2) if resource in _WHOLE else left / 2
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
        for resource in CONSUMABLE:
            self._reserved[resource] += getattr(child, resource) or 0
        return child

    def settle(self, child_limits: Limits, child_spent: Spend) -> None:
        """Release a finished child's reservation and charge what it really spent."""
        for resource in CONSUMABLE:
            self._reserved[resource] -= getattr(child_limits, resource) or 0
            self._spent[resource] += getattr(child_spent, resource)
