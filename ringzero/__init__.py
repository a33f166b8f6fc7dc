"""ringzero: an agent kernel for Python.

Agents run as processes with a pid, a lifecycle, budgets and a mailbox; their LLM calls,
code runs and tool calls are syscalls that pass one rate-limited gate and are journaled,
so a crashed host resumes every process without repeating a recorded call.
"""

from __future__ import annotations

from ringzero.core.context import Context
from ringzero.core.errors import RingzeroError
from ringzero.core.gate import LLMGate, Pricing, RateLimit, RetryPolicy
from ringzero.core.kernel import Event, Kernel, ProcessHandle, ProcessInfo
from ringzero.core.types import (
    ExecLimits,
    ExecResult,
    Limits,
    LLMRequest,
    LLMResponse,
    Message,
    ProcessStatus,
    StopReason,
)

__version__ = "0.1.0"

__all__ = [
    "Context",
    "Event",
    "ExecLimits",
    "ExecResult",
    "Kernel",
    "LLMGate",
    "LLMRequest",
    "LLMResponse",
    "Limits",
    "Message",
    "Pricing",
    "ProcessHandle",
    "ProcessInfo",
    "ProcessStatus",
    "RateLimit",
    "RetryPolicy",
    "RingzeroError",
    "StopReason",
    "__version__",
]
