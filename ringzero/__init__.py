"""ringzero: an agent kernel for Python.

Agents run as processes with a pid, a lifecycle, budgets and a mailbox; their LLM calls,
code runs and tool calls are syscalls that pass one rate-limited gate and are journaled,
so a crashed host resumes every process without repeating a recorded call.
"""

from __future__ import annotations

from ringzero.core.context import Context
from ringzero.core.contract.errors import (
    AuthenticationFailed,
    BadRequest,
    BudgetExceeded,
    CheckpointerError,
    Closed,
    ContextTooLong,
    ExecutorError,
    Fenced,
    InvalidArgument,
    InvalidLimits,
    MissingExtra,
    NonDeterminismError,
    NoProvider,
    NotAProgram,
    NotResumed,
    NotSerializable,
    ProcessFailed,
    ProcessNotFound,
    ProcessStateError,
    ProgramNotFound,
    ProviderError,
    ProviderUnavailable,
    RateLimited,
    ResultRefused,
    RingzeroError,
    ToolCrashed,
    ToolError,
    ToolFailed,
    ToolInDoubt,
    ToolNotFound,
    WrongEventLoop,
)
from ringzero.core.contract.types import (
    ExecLimits,
    ExecResult,
    Limits,
    LLMRequest,
    LLMResponse,
    Message,
    ProcessStatus,
    StopReason,
)
from ringzero.core.kernel import Event, Kernel, ProcessHandle, ProcessInfo
from ringzero.core.support.backends import install as _install_backends
from ringzero.core.support.effects import idempotent
from ringzero.core.support.gate import LLMGate, Pricing, RateLimit, RetryPolicy
from ringzero.core.support.tool_parameters import code_may_set
from ringzero.core.support.tool_pool import cpu_bound
from ringzero.defaults import BuiltInBackends as _BuiltInBackends

_install_backends(_BuiltInBackends())  # before any Kernel: core itself imports no backend

__version__ = "0.1.0"

__all__ = [
    "AuthenticationFailed",
    "BadRequest",
    "BudgetExceeded",
    "CheckpointerError",
    "Closed",
    "Context",
    "ContextTooLong",
    "Event",
    "ExecLimits",
    "ExecResult",
    "ExecutorError",
    "Fenced",
    "InvalidArgument",
    "InvalidLimits",
    "Kernel",
    "LLMGate",
    "LLMRequest",
    "LLMResponse",
    "Limits",
    "Message",
    "MissingExtra",
    "NoProvider",
    "NonDeterminismError",
    "NotAProgram",
    "NotResumed",
    "NotSerializable",
    "Pricing",
    "ProcessFailed",
    "ProcessHandle",
    "ProcessInfo",
    "ProcessNotFound",
    "ProcessStateError",
    "ProcessStatus",
    "ProgramNotFound",
    "ProviderError",
    "ProviderUnavailable",
    "RateLimit",
    "RateLimited",
    "ResultRefused",
    "RetryPolicy",
    "RingzeroError",
    "StopReason",
    "ToolCrashed",
    "ToolError",
    "ToolFailed",
    "ToolInDoubt",
    "ToolNotFound",
    "WrongEventLoop",
    "__version__",
    "code_may_set",
    "cpu_bound",
    "idempotent",
]
