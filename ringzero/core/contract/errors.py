"""Every error ringzero raises, under one root.

The tree::

    RingzeroError
    ├── InvalidArgument              bad input from a caller (also a ValueError)
    │   ├── InvalidLimits            a negative or non-numeric budget
    │   ├── NotSerializable          a value that must be stored is not JSON-compatible
    │   └── NotAProgram              spawn() was given something other than an async function
    ├── ProcessNotFound              no process with that pid (also a LookupError)
    ├── ProcessStateError            the operation does not fit the process's state
    ├── Fenced                       another kernel took the process over (a cluster node's failover)
    ├── ProcessFailed                wait() on a process that failed or was killed
    │   └── BudgetExceeded           ... because it crossed one of its Limits
    ├── ProgramNotFound              recover() cannot import a journaled program
    ├── NotResumed                   recover() left a process unfinished: it needs what this kernel lacks
    ├── NoProvider                   ctx.llm() on a kernel that has no LLM provider
    ├── ToolNotFound                 ctx.tool() named a tool the kernel does not have
    ├── ToolFailed                   a host tool called through ctx.tool() raised
    ├── ToolError                    raised by a host tool on purpose: its message reaches sandboxed code
    │   ├── ToolCrashed              the worker process running a cpu_bound tool died (a segfault, an OOM kill)
    │   ├── EgressRefused            a run's egress policy refused a request (ExecLimits.egress)
    │   ├── EgressFailed             an allowed request failed on its way (unreachable, TLS, budget, timeout)
    │   └── ResultRefused            a cpu_bound tool's result may not cross (too large, not JSON; also a ValueError)
    ├── ProviderError                an LLM provider failed; what the gate retries or raises
    │   ├── RateLimited              429 / quota; carries retry_after in seconds, when known
    │   ├── ProviderUnavailable      5xx, connection failure or timeout: worth retrying
    │   ├── ContextTooLong           the request does not fit the model's context window
    │   ├── BadRequest               the provider rejected the request as malformed
    │   └── AuthenticationFailed     missing or wrong credentials
    ├── ExecutorError                the executor itself failed (not the user's code)
    ├── CheckpointerError            the store failed, or holds something it cannot read
    ├── Closed                       an object was used after its close()/aclose()
    ├── WrongEventLoop               a call cannot reach the event loop its object lives on
    └── MissingExtra                 an optional dependency is not installed (also ImportError)

    KernelInterrupt (a BaseException: what the kernel raises inside a program to stop it)
    ├── ToolInDoubt                  a tool call was in flight when its host died: it may have run
    └── NonDeterminismError          a resumed program's syscalls diverged from its journal

``KernelInterrupt`` is not a ``RingzeroError``: like ``asyncio.CancelledError``, it must pass
through the ``except Exception`` a framework wraps around a tool or a step.

An exception raised by user code inside an executor is *data* (``ExecResult.error``), never
one of these. Backends translate their native errors (sqlite3, httpx, subprocess) into this
tree at their edge and chain the original with ``raise ... from exc``.
"""

from __future__ import annotations

import functools

from ringzero.core.contract.states import StopReason

__all__ = [
    "AuthenticationFailed",
    "BadRequest",
    "BudgetExceeded",
    "CheckpointerError",
    "Closed",
    "ContextTooLong",
    "EgressFailed",
    "EgressRefused",
    "ExecutorError",
    "Fenced",
    "InvalidArgument",
    "InvalidLimits",
    "KernelInterrupt",
    "MissingExtra",
    "NoProvider",
    "NonDeterminismError",
    "NotAProgram",
    "NotResumed",
    "NotSerializable",
    "ProcessFailed",
    "ProcessNotFound",
    "ProcessStateError",
    "ProgramNotFound",
    "ProviderError",
    "ProviderUnavailable",
    "RateLimited",
    "ResultRefused",
    "RingzeroError",
    "ToolCrashed",
    "ToolError",
    "ToolFailed",
    "ToolInDoubt",
    "ToolNotFound",
    "WrongEventLoop",
]


class RingzeroError(Exception):
    """Root of every error ringzero raises."""


class KernelInterrupt(BaseException):
    """Root of the signals the kernel raises inside a program to stop what it was doing:
    ``ToolInDoubt`` (a call that may have had its effect) and ``NonDeterminismError`` (a replay
    that left its journal). Like ``asyncio.CancelledError`` and ``KeyboardInterrupt``, a
    ``BaseException``: the ``except Exception`` with which frameworks (smolagents, CrewAI,
    LangChain's tool nodes) turn a tool's failure into text for the model lets it by, so the
    model is never told "try again" about a call that may have been made. Catch it by its own
    name (``except ToolInDoubt:``); code that catches ``BaseException`` must re-raise it."""


class InvalidArgument(RingzeroError, ValueError):
    """A caller passed something ringzero cannot use; the message names it."""


class InvalidLimits(InvalidArgument):
    """A budget in ``Limits`` is negative or not a number."""


class NotSerializable(InvalidArgument):
    """A value that must be journaled or sent is not JSON-compatible."""


class NotAProgram(InvalidArgument):
    """``spawn()`` needs an ``async def`` function taking a Context first."""


class ProcessNotFound(RingzeroError, LookupError):
    """No process has this pid."""

    def __init__(self, pid: int) -> None:
        super().__init__(f"no process with pid {pid}")
        self.pid = pid


class ProcessStateError(RingzeroError):
    """The operation does not fit the process's current state (e.g. resume a running one)."""


class Fenced(RingzeroError):
    """Another kernel on the same store has taken this process over (a cluster moved it off a
    node it believed dead): this kernel stops running it and writes nothing more for it.

    The fence is the store itself: ownership is a claimed epoch, and a journal record is written
    only where its slot is free, so of two kernels running one process only one ever records."""


class NonDeterminismError(KernelInterrupt):
    """A resumed program issued a syscall that differs from the one its journal recorded (a
    ``KernelInterrupt``: a framework's ``except Exception`` does not swallow it)."""


class ProgramNotFound(RingzeroError):
    """A journaled program cannot be imported, so its process cannot be resumed."""


class NotResumed(RingzeroError):
    """A recovered process needs what this kernel lacks: its program cannot be imported
    (``ProgramNotFound``), or its next live call needs an LLM provider or a tool the kernel was
    not given (``NoProvider``, ``ToolNotFound``). It stops without ending, left unfinished in the
    store as the crash left it (plus whatever it replayed or recorded on the way), so that a
    resume with a kernel that has what it needs finishes it. ``cause`` is what was missing."""

    def __init__(self, pid: int, name: str, cause: RingzeroError) -> None:
        super().__init__(f"pid {pid} ({name}) was not resumed: {cause}. It is left unfinished in the store; "
                         "a resume whose kernel has what it needs finishes it")
        self.pid = pid
        self.name = name
        self.cause = cause


class ProcessFailed(RingzeroError):
    """The awaited process did not return: it raised, or it was killed."""

    def __init__(self, pid: int, status: str, reason: StopReason | None, error: dict[str, str] | None) -> None:
        why = reason.value if reason is not None else status
        detail = f": {error['type']}: {error['message']}" if error else ""
        super().__init__(f"pid {pid} {status} ({why}){detail}")
        self.pid = pid
        self.status = status
        self.reason = reason
        self.error = error


class BudgetExceeded(ProcessFailed):
    """The awaited process was stopped because it crossed one of its Limits."""


class NoProvider(RingzeroError):
    """The kernel was asked for an LLM call but has no provider by that name."""


class ToolNotFound(RingzeroError, LookupError):
    """``ctx.tool()`` named a tool the kernel was not given."""


class ProviderError(RingzeroError):
    """An LLM provider failed."""

    retryable: bool = False


class RateLimited(ProviderError):
    """The provider refused for rate or quota reasons; retry after ``retry_after`` seconds."""

    retryable = True

    def __init__(self, message: str = "rate limited", retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class ProviderUnavailable(ProviderError):
    """The provider could not answer now (5xx, connection refused, timeout)."""

    retryable = True


class ContextTooLong(ProviderError):
    """The request is longer than the model's context window."""


class BadRequest(ProviderError):
    """The provider rejected the request as malformed."""


class AuthenticationFailed(ProviderError):
    """The provider rejected the credentials."""


class ToolFailed(RingzeroError):
    """A host tool raised; the same error is served again when the call is replayed."""

    def __init__(self, tool: str, error_type: str, message: str) -> None:
        super().__init__(f"tool {tool!r} raised {error_type}: {message}")
        self.tool = tool
        self.error_type = error_type
        self.error_message = message


class ToolError(RingzeroError):
    """What a host tool raises on purpose to tell sandboxed code why it failed: its message is
    shown to the code (and so to the model). Any other exception a tool raises reaches the code
    as its type name alone, since its text may carry what the host keeps (a URL with a token, a
    request's headers), unless the executor was built with ``show_tool_errors=True``."""


class EgressRefused(ToolError):
    """A run's egress policy (``ExecLimits.egress``) refused a request before anything was
    sent: a host, port or scheme off its allow-list, an address it does not list, the budget."""


class EgressFailed(ToolError):
    """A request the egress policy allowed failed on its way: upstream unreachable, its TLS
    certificate not verified, the budget passed mid-response, a timeout."""


class ToolCrashed(ToolError):
    """The worker process running a ``cpu_bound`` tool died mid-call (a segfault, an OOM kill):
    that call fails with this; the next call gets a fresh worker."""


class ResultRefused(ToolError, ValueError):
    """A ``cpu_bound`` tool's result that may not cross, judged in its worker process before the
    host sees it: too large for the caller's limit, too deep, not JSON. Its message says which,
    in the words the boundary uses for any tool's result."""


class ToolInDoubt(KernelInterrupt):
    """A tool call whose intent was recorded but whose result was not: its host died while it
    ran, so it may or may not have had its effect. The kernel does not run it again (it might
    pay twice); the program decides, for instance by asking the other system what happened.
    A ``KernelInterrupt``: ``except Exception`` in a framework lets it by; ``except ToolInDoubt``
    catches it.

    A tool that may safely run again says so (``ringzero.idempotent``), or takes the
    ``idempotency_key`` parameter, which the kernel fills with the same key on every attempt
    (payment and e-mail APIs deduplicate on such keys): those are run again, never raised.
    Raised again, the same way, each time the program is replayed."""

    def __init__(self, pid: int, tool: str, slot: str, summary: str = "") -> None:
        super().__init__(
            f"pid {pid}: tool {tool!r} (syscall #{slot}{': ' + summary if summary else ''}) was running when its host "
            "died: it may or may not have had its effect, so it is not run again. Catch ToolInDoubt to decide "
            "(check with the system it acts on), or make the tool safe to repeat: @ringzero.idempotent, or an "
            "idempotency_key parameter")
        self.pid = pid
        self.tool = tool
        self.slot = slot


class ExecutorError(RingzeroError):
    """The executor itself failed; the user's code did not get a fair run."""


class CheckpointerError(RingzeroError):
    """The checkpointer failed, or found data it cannot read."""


class Closed(RingzeroError):
    """The object was closed (``close()``/``aclose()``); make a new one to go on."""


class WrongEventLoop(RingzeroError, RuntimeError):
    """A call cannot reach the event loop its object lives on: a blocking call made on that
    loop's own thread (it would wait on itself forever), or a loop that stopped running while
    the object was busy on it. Raised at once, instead of a hang."""


class MissingExtra(RingzeroError, ImportError):
    """An optional dependency is missing; the message names the extra to install."""

    def __init__(self, feature: str, extra: str) -> None:
        super().__init__(
            f"{feature} needs an optional dependency: pip install 'ringzero[{extra}]'"
        )
        self.extra = extra


@functools.cache
def exception_named(name: str) -> type[Exception]:
    """An Exception class of this name: what a tool's exception, recorded or reported by its
    type's name alone, becomes where the original cannot travel (a journal, a worker process) or
    must not reach the event loop (``SystemExit``)."""
    return type(name, (Exception,), {"__module__": "ringzero.core.contract.errors"})
