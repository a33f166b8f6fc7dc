"""Where a process is in its life, and why it stopped: two enums everything else names (the
records, the errors), in a module that imports nothing."""

from __future__ import annotations

import enum

__all__ = ["ProcessStatus", "StopReason"]


class ProcessStatus(str, enum.Enum):
    """A process's place in its lifecycle."""

    CREATED = "created"
    READY = "ready"
    RUNNING = "running"
    WAITING = "waiting"
    PAUSED = "paused"
    EXITED = "exited"
    FAILED = "failed"
    KILLED = "killed"

    @property
    def terminal(self) -> bool:
        """Whether the process has ended (exited, failed or was killed). A set lookup: the
        kernel asks at every transition, send and wait, and the tuple of three members this
        was looked each up on the class first (0.4 µs)."""
        return self in _TERMINAL


_TERMINAL = frozenset({ProcessStatus.EXITED, ProcessStatus.FAILED, ProcessStatus.KILLED})


class StopReason(str, enum.Enum):
    """Why a process stopped."""

    RETURNED = "returned"
    RAISED = "raised"
    KILLED = "killed"
    NON_DETERMINISM = "non_determinism"
    PROGRAM_NOT_FOUND = "program_not_found"
    TOKENS = "budget_tokens"
    COST = "budget_cost"
    LLM_CALLS = "budget_llm_calls"
    STEPS = "budget_steps"
    WALL_SECONDS = "budget_wall_seconds"
    EXEC_SECONDS = "budget_exec_seconds"
