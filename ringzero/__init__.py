"""ringzero: an agent kernel for Python.

Agents run as processes with a pid, a lifecycle, budgets and a mailbox; their LLM calls,
code runs and tool calls are syscalls that pass one rate-limited gate and are journaled,
so a crashed host resumes every process without repeating a recorded call.

``__all__`` is what a user needs (``Kernel``, ``Context``, handles, limits, the gate, the
errors to catch) and what a backend author needs (the four protocols, their capabilities,
the records they take and give, and the outcomes ``ctx.journaled_tool`` records).
"""

from __future__ import annotations

from ringzero.core.context import Context
from ringzero.core.contract.egress import Egress, EgressRecord, Secret
from ringzero.core.contract.errors import (
    AuthenticationFailed,
    BadRequest,
    BudgetExceeded,
    CheckpointerError,
    Closed,
    ContextTooLong,
    EgressFailed,
    EgressRefused,
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
from ringzero.core.contract.outcomes import Failure, InDoubt, Outcome, Stopped, Value, failure
from ringzero.core.contract.protocols import (
    Checkpointer,
    CheckpointerCapabilities,
    Executor,
    ExecutorCapabilities,
    LLMProvider,
    ProviderCapabilities,
    Scheduler,
    SchedulerCapabilities,
    Tool,
    ToolCallJournal,
)
from ringzero.core.contract.types import (
    Checkpoint,
    ExecError,
    ExecLimits,
    ExecResult,
    Limits,
    LLMRequest,
    LLMResponse,
    Message,
    ProcessStatus,
    StopReason,
    ToolCall,
    ToolSchema,
    Usage,
)
from ringzero.core.kernel import Event, Kernel, ProcessHandle, ProcessInfo
from ringzero.core.schedules import Schedule
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
    "Checkpoint",
    "Checkpointer",
    "CheckpointerCapabilities",
    "CheckpointerError",
    "Closed",
    "Context",
    "ContextTooLong",
    "Egress",
    "EgressFailed",
    "EgressRecord",
    "EgressRefused",
    "Event",
    "ExecError",
    "ExecLimits",
    "ExecResult",
    "Executor",
    "ExecutorCapabilities",
    "ExecutorError",
    "Failure",
    "Fenced",
    "InDoubt",
    "InvalidArgument",
    "InvalidLimits",
    "Kernel",
    "LLMGate",
    "LLMProvider",
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
    "Outcome",
    "Pricing",
    "ProcessFailed",
    "ProcessHandle",
    "ProcessInfo",
    "ProcessNotFound",
    "ProcessStateError",
    "ProcessStatus",
    "ProgramNotFound",
    "ProviderCapabilities",
    "ProviderError",
    "ProviderUnavailable",
    "RateLimit",
    "RateLimited",
    "ResultRefused",
    "RetryPolicy",
    "RingzeroError",
    "Schedule",
    "Scheduler",
    "SchedulerCapabilities",
    "Secret",
    "StopReason",
    "Stopped",
    "Tool",
    "ToolCall",
    "ToolCallJournal",
    "ToolCrashed",
    "ToolError",
    "ToolFailed",
    "ToolInDoubt",
    "ToolNotFound",
    "ToolSchema",
    "Usage",
    "Value",
    "WrongEventLoop",
    "__version__",
    "code_may_set",
    "cpu_bound",
    "failure",
    "idempotent",
]
