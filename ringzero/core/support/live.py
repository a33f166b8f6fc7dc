"""What runs live in this context: the process whose syscall runs (a syscall made from inside
it, such as an LLM call inside a tool, is part of the enclosing one), and that effect's journal
slot (what its idempotency key and its nested calls are named by); and the signal that stops a
replay check where a syscall would run live (``ReplayEnded``)."""

from __future__ import annotations

import contextvars

__all__ = ["NESTED_COST", "RUNNING_LIVE", "SLOT", "ReplayEnded", "current_slot", "running_live"]

RUNNING_LIVE: contextvars.ContextVar[object | None] = contextvars.ContextVar("ringzero_running_live", default=None)
"""The process whose syscall is running live in this context (the engine's ``Process``): a
syscall it makes from there (an LLM call inside a tool) is part of the enclosing one, whose
record holds its effect; a tool pool shares its threads out by it."""
SLOT: contextvars.ContextVar[int | str] = contextvars.ContextVar("ringzero_slot", default="")
"""The journal slot of the syscall running live in this context (``ringzero.core._engine.effect.perform``):
what its idempotency key (``ctx.idempotency_key()``) and its exec's tool calls are named by."""


def running_live() -> bool:
    """Whether the code running here runs inside a live syscall (a tool a journaled call runs):
    its effects belong to that call's record."""
    return RUNNING_LIVE.get() is not None


def current_slot() -> str:
    """The slot of the effect syscall running live here ("" outside one)."""
    return str(SLOT.get())


NESTED_COST: contextvars.ContextVar[dict[str, float] | None] = contextvars.ContextVar("ringzero_nested", default=None)
"""What nested LLM calls made during the running exec cost, so that its record can carry it."""


class ReplayEnded(BaseException):
    """A replay check (``ringzero replay --check``) reached a syscall past the journal: the
    program replayed what was recorded, and stops here without making the call. A
    BaseException, like a cancellation, so that a program's ``except Exception`` lets it by."""

    def __init__(self, pid: int, slot: int, kind: str) -> None:
        super().__init__(f"pid {pid}: replayed up to syscall #{slot} ({kind}), the first past its journal")
        self.pid, self.slot, self.kind = pid, slot, kind
