"""The four narrow contracts every backend implements: LLMProvider, Executor, Checkpointer, Scheduler.

Each is a ``typing.Protocol`` (structural: no base class to inherit) with as few methods as
the job allows, and a ``capabilities`` attribute that says what the backend promises. The
conformance kit in ``ringzero.compat`` tests exactly what is declared.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol, runtime_checkable

from ringzero.core.contract.types import JSON, Checkpoint, ExecLimits, ExecResult, LLMRequest, LLMResponse, PendingWrite

__all__ = [
    "ENFORCED",
    "Appending",
    "Batching",
    "Checkpointer",
    "CheckpointerCapabilities",
    "Executor",
    "ExecutorCapabilities",
    "Isolation",
    "LLMProvider",
    "MemoryIndexed",
    "ProviderCapabilities",
    "Scheduler",
    "SchedulerCapabilities",
    "Streaming",
    "TextSink",
    "Tool",
    "ToolCallJournal",
    "backend_problems",
    "check_backend",
]

Isolation = Literal["none", "interpreter", "process", "microvm"]
Tool = Callable[..., Any]
"""A host callable that sandboxed code may call as a plain function (sync or async)."""


@dataclass(frozen=True)
class ProviderCapabilities:
    """What an LLM provider supports."""

    tool_calls: bool = True
    streaming: bool = False
    """True when the provider also has ``stream`` (see ``Streaming``): text as it arrives."""
    counts_tokens: bool = False
    """True when usage comes from the provider's own tokenizer, not an estimate."""


@runtime_checkable
class LLMProvider(Protocol):
    """A language model behind one async call."""

    @property
    def capabilities(self) -> ProviderCapabilities:
        """What this backend promises (read-only: a class attribute or a property)."""
        ...

    async def complete(self, request: LLMRequest) -> LLMResponse:
        """Answer ``request``.

        ``stop_reason`` is ``end_turn`` (an answer), ``tool_use`` (tool calls), ``max_tokens``
        or ``stop_sequence``, whatever words the vendor used (another reason the vendor gives
        passes as it is).

        Raises: RateLimited (HTTP 429, with retry_after when known); ProviderUnavailable (a
        server error, an overload, a timeout, a connection refused or cut: retried by the
        gate); ContextTooLong; AuthenticationFailed (HTTP 401 and 403); BadRequest (any
        other refusal). Nothing else escapes: a client library's own exceptions are mapped.
        """
        ...


TextSink = Callable[[str], None]
"""Where a streamed answer's text goes, piece by piece, as it arrives."""


@runtime_checkable
class Streaming(Protocol):
    """An LLMProvider that can hand over its answer's text while the answer is still arriving
    (it declares ``capabilities.streaming``). The gate calls ``stream`` instead of ``complete``
    when the caller gave somewhere for the text to go."""

    async def stream(self, request: LLMRequest, on_text: TextSink) -> LLMResponse:
        """Answer ``request`` as ``complete`` does, the same errors included, calling ``on_text``
        with each piece of the answer's text as it arrives: the pieces joined are the answer's
        ``content``. The whole answer (tool calls, usage) is the return value."""
        ...


ENFORCED = frozenset({"wall_seconds", "memory_bytes", "output_bytes"})
"""Every limit an executor may declare in ``ExecutorCapabilities.enforces`` (Monty and the
process sandbox hold all of them)."""


@dataclass(frozen=True)
class ExecutorCapabilities:
    """How strongly an executor isolates code, and what code it can run."""

    isolation: Isolation
    """How far hostile code is kept from the host: ``"none"``, it can do what the host's user
    can (a thread, or a plain subprocess run as that user, with the host's files and network);
    ``"interpreter"``, an interpreter that offers it no files, network or processes (Monty);
    ``"process"``, another OS process confined so that it reaches no host file, network or
    process it was not given (namespaces, seccomp, Landlock: ``ProcessExecutor``);
    ``"microvm"``, a virtual machine of its own."""
    full_cpython: bool
    """True when any installed package can be imported (pandas, numpy)."""
    sessions: bool = False
    tools: bool = True
    network: bool = False
    """True when code inside can reach the network."""
    enforces: frozenset[str] = frozenset({"wall_seconds"})
    """The ``ExecLimits`` fields this executor holds code to (the kit tests each one named):
    ``wall_seconds`` always; ``memory_bytes``, ``output_bytes`` where it does. ``tool_bytes``
    and ``run_tool_bytes`` the kernel's boundary holds for every executor."""


class ToolCallJournal(Protocol):
    """What journals the tool calls one run's code makes, one by one (the kernel's own,
    ``ringzero.core._engine.tool_calls.ToolCalls``). An executor never sees it: the tools
    ``ctx.exec`` hands over are bound to it (``ringzero.core.support.tool_boundary``)."""

    owner: object
    """Whose share of a tool pool the run's sync tools take: the kernel process the run is for."""

    async def call(self, name: str, tool: Any, args: list[Any], kwargs: dict[str, Any],
                   plain: Callable[[Any, list[Any], dict[str, Any]], Awaitable[Any]],
                   check: Callable[[Any], Awaitable[None]] | None = None) -> Any:
        """The call's result: answered from the journal where it is recorded, else ``plain(tool,
        args, kwargs)`` run live and recorded (its result judged by ``check`` first). Raises what
        the tool raised; RuntimeError once the run cannot go on (it diverged from its record, a
        call is in doubt, the store failed)."""
        ...

    @property
    def answers_here(self) -> bool:
        """Whether ``call_here`` may be used: the journal takes records from any thread."""
        ...

    def call_here(self, name: str, tool: Any, args: list[Any], kwargs: dict[str, Any],
                  plain: Callable[[Any, list[Any], dict[str, Any]], Any], loop: asyncio.AbstractEventLoop,
                  check: Callable[[Any], None] | None = None) -> Any:
        """``call`` in the thread that runs the code (not ``loop``'s): ``plain`` runs the tool
        there and judges its result; the call's intent and record are written from there, or
        on ``loop`` where the store cannot take them here."""
        ...


@runtime_checkable
class Executor(Protocol):
    """Runs untrusted Python and returns what it produced."""

    @property
    def capabilities(self) -> ExecutorCapabilities:
        """What this backend promises (read-only: a class attribute or a property)."""
        ...

    async def run(
        self,
        code: str,
        *,
        inputs: Mapping[str, JSON] | None = None,
        tools: Mapping[str, Tool] | None = None,
        limits: ExecLimits | None = None,
    ) -> ExecResult:
        """Run ``code`` with ``inputs`` bound as variables and ``tools`` callable as functions.

        Inside a kernel process the tools come from ``ctx.exec`` already journaled: call them as
        they are (an async tool is a coroutine function; a sync one is called from a thread other
        than the event loop's, or awaited as ``tool.acall(...)``), or hand them to
        ``ringzero.providers.executors.boundary.HostTools``, which a sandbox's messages reach
        (it checks sizes and the run's byte budget as well). Either way each call is recorded,
        a recorded call is answered from the journal after a crash, one in doubt is not run
        again, and parameters the host keeps are refused: nothing here can skip that.

        An exception in the code, a limit hit or a timeout is reported in ``ExecResult.error``.
        Raises ExecutorError only when the executor itself fails.
        """
        ...

    async def aclose(self) -> None:
        """Release workers, pools and sandboxes. Idempotent."""
        ...


@dataclass(frozen=True)
class CheckpointerCapabilities:
    """What a checkpointer guarantees."""

    durable: bool
    """A record survives the host process dying once ``put`` has returned."""
    multi_process: bool = False
    """Several kernels in separate processes may share one store."""
    delete_checkpoints: bool = False
    """``delete_checkpoints()`` removes single checkpoints (LangGraph's prune and delete_for_runs need it)."""
    claims: bool = False
    """``claim()`` stores a checkpoint only if its address is free, atomically across processes
    (how kernels sharing one store allocate pids without colliding)."""
    put_many: bool = False
    """``put_many(checkpoints)`` stores several checkpoints, in order, in one atomic step (one
    commit, not one each): the kernel writes a process's transitions, status and state rows
    so. Not a method of the protocol: a store without it gets one ``put`` after another."""
    append: bool = False
    """``append(checkpoint)`` stores a checkpoint as ``put`` does,
    ``append_many(checkpoints)`` several as ``put_many`` does (all or none), and
    ``append_writes(thread_id, namespace, checkpoint_id, writes)`` writes as ``put_writes``
    does, as durable when they return, for records this store (or one opened after a crash)
    reads back, such as the kernel's syscall journal and a LangGraph graph's checkpoints; other
    stores open on the same data may see them a moment later than after a ``put``. A store that
    can make them cheaper than a ``put`` (SQLite: one ``write()`` into a log beside the file,
    not a commit) declares it; the kernel and ``KernelSaver`` ``put`` where it is missing."""
    append_anywhere: bool = False
    """``append_here(checkpoint) -> bool``, ``append_many_here(checkpoints) -> bool`` and
    ``append_writes_here(thread_id, namespace, checkpoint_id, writes) -> bool`` are ``append``,
    ``append_many`` and ``append_writes`` called from any thread, not only the event loop's:
    True once the records are as durable as ``append`` makes them; False where the store cannot
    take them there now (the caller appends on the loop instead). The kernel journals the tool
    calls a sandbox's code makes from the sandbox's own thread so, and ``KernelSaver`` a sync
    graph's steps from the graph's thread, without a hop to the loop and back for each
    (SQLite: the append log, under a lock)."""


@runtime_checkable
class Checkpointer(Protocol):
    """Durable records addressed by (thread_id, namespace, id)."""

    @property
    def capabilities(self) -> CheckpointerCapabilities:
        """What this backend promises (read-only: a class attribute or a property)."""
        ...

    async def put(self, checkpoint: Checkpoint) -> None:
        """Store ``checkpoint`` (its ``parent_id`` too), replacing one with the same address;
        the writes stored against that address stay. Durable on return when
        ``capabilities.durable``. Raises CheckpointerError."""
        ...

    async def put_writes(
        self, thread_id: str, namespace: str, checkpoint_id: str, writes: Sequence[PendingWrite]
    ) -> None:
        """Store the writes tasks made against a checkpoint, each addressed by (task_id, idx).

        A write with a negative ``idx`` (a special channel: error, interrupt, resume) replaces
        the one at its address; any other is stored only if its address is free, so a retried
        task never overwrites what its first attempt recorded. One statement per kind, with no
        read first (LangGraph's ``put_writes`` rule, kept by the store). Raises CheckpointerError."""
        ...

    async def get(self, thread_id: str, namespace: str = "", checkpoint_id: str | None = None) -> Checkpoint | None:
        """The checkpoint with that id, or the latest one when ``checkpoint_id`` is None;
        None when there is none. Its ``writes`` are every write stored against it, in any
        order (a reader that needs one sorts them by ``(task_id, idx)``). Raises CheckpointerError."""
        ...

    def list(
        self,
        thread_id: str | None = None,
        namespace: str | None = None,
        *,
        filter: Mapping[str, JSON] | None = None,
        before: str | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[Checkpoint]:
        """Checkpoints newest first: by id, greatest first, and among equal ids (other threads or
        namespaces) by thread id, then namespace, greatest first. ``None`` for thread or
        namespace means any; ``filter`` keeps those whose metadata has these exact values;
        ``before`` keeps ids below it; ``limit`` keeps the first that many after the filter."""
        ...

    async def delete_thread(self, thread_id: str) -> None:
        """Delete every checkpoint and every write of the thread, in every namespace. Raises
        CheckpointerError."""
        ...

    async def delete_checkpoints(self, thread_id: str, namespace: str, ids: Sequence[str]) -> None:
        """Delete these checkpoints of one thread and namespace, with their writes, atomically.
        Optional: only where ``capabilities.delete_checkpoints``. Raises CheckpointerError."""
        ...

    async def claim(self, checkpoint: Checkpoint) -> bool:
        """Store ``checkpoint`` only if no checkpoint has its address; True if this call stored it.
        Atomic: of several callers racing for one address, exactly one gets True. Optional: only
        where ``capabilities.claims``. Raises CheckpointerError."""
        ...

    async def aclose(self) -> None:
        """Close connections. Idempotent."""
        ...


@runtime_checkable
class Batching(Protocol):
    """What a checkpointer declaring ``capabilities.put_many`` implements."""

    async def put_many(self, checkpoints: Sequence[Checkpoint]) -> None:
        """Store each, in order, in one atomic step. Raises CheckpointerError."""
        ...


@runtime_checkable
class Appending(Protocol):
    """What a checkpointer declaring ``capabilities.append`` implements (see there)."""

    async def append(self, checkpoint: Checkpoint) -> None: ...

    async def append_many(self, checkpoints: Sequence[Checkpoint]) -> None: ...

    async def append_writes(
        self, thread_id: str, namespace: str, checkpoint_id: str, writes: Sequence[PendingWrite]
    ) -> None: ...


@runtime_checkable
class MemoryIndexed(Protocol):
    """A checkpointer that keeps long-term memory in an index of its own (SQLite's FTS5,
    PostgreSQL's full-text search) rather than as checkpoint records: ``memory_index()``
    returns a ``ringzero.core.support.memory.MemoryIndex``."""

    def memory_index(self) -> Any: ...


@dataclass(frozen=True)
class SchedulerCapabilities:
    """What a scheduler offers."""

    priorities: bool = True
    distributed: bool = False


@runtime_checkable
class Scheduler(Protocol):
    """Decides which ready process runs, and how many run at once.

    A process holds a run slot while it executes or waits on a service (LLM, executor,
    tool); it gives the slot back while it sleeps, waits for a message or is paused, so
    idle processes cost nothing. Lower priority numbers run first; equal priorities take
    turns in arrival order.
    """

    @property
    def capabilities(self) -> SchedulerCapabilities:
        """What this backend promises (read-only: a class attribute or a property)."""
        ...

    async def acquire(self, pid: int, priority: int) -> None:
        """Wait for a run slot. Cancelling the wait leaves no trace, even when the slot was
        handed to this wait an instant before (the slot goes to the next waiter)."""
        ...

    def release(self, pid: int) -> None:
        """Give back the slot ``pid`` holds."""
        ...

    def should_yield(self, pid: int, priority: int) -> bool:
        """True when a ready process of equal or higher priority is waiting for a slot, so
        the running process ``pid`` should give its slot up at this syscall boundary."""
        ...


CAPABILITY_METHODS: dict[str, dict[str, tuple[str, ...]]] = {
    "Checkpointer": {"delete_checkpoints": ("delete_checkpoints",), "claims": ("claim",), "put_many": ("put_many",),
                     "append": ("append", "append_many", "append_writes")},
    "LLMProvider": {"streaming": ("stream",)},
}
"""For each protocol, the methods a backend needs only where it declares the capability named:
every other member of the protocol is required of every backend."""


def backend_problems(value: object, protocol: type) -> list[str]:
    """Why ``value`` cannot stand behind ``protocol`` (one of the four), each problem in words
    that name the members and capabilities concerned; empty where it can. What the kernel
    checks when it is built (``check_backend``) and the conformance kits' first test."""
    optional = CAPABILITY_METHODS.get(protocol.__name__, {})
    members = [name for name in vars(protocol) if not name.startswith("_")]
    needed_always = [name for name in members if not any(name in methods for methods in optional.values())]
    problems = []
    missing = [name for name in needed_always if not hasattr(value, name)
               or (name != "capabilities" and not callable(getattr(value, name)))]
    if missing:
        problems.append(f"it has no {', '.join(missing)} (every {protocol.__name__} needs "
                        f"{', '.join(needed_always)})")
    capabilities = getattr(value, "capabilities", None)
    if capabilities is None:
        return problems
    for flag, methods in optional.items():
        lacking = [name for name in methods if not callable(getattr(value, name, None))]
        if getattr(capabilities, flag, False) and lacking:
            problems.append(f"it declares capabilities.{flag} but has no {', '.join(lacking)} (implement it, or "
                            f"leave the capability off)")
    if protocol is Checkpointer and getattr(capabilities, "multi_process", False) \
            and not getattr(capabilities, "claims", False):
        problems.append("it declares capabilities.multi_process (several kernels may share it) but not "
                        "capabilities.claims: kernels sharing it would hand out the same pids; implement claim() "
                        "and declare claims, or leave multi_process off")
    return problems


def check_backend(value: object, protocol: type, what: str) -> None:
    """Raise ``InvalidArgument`` naming every problem ``backend_problems`` finds: a backend is
    refused when it is handed over, not at the first call that needs what it lacks."""
    from ringzero.core.contract.errors import InvalidArgument

    problems = backend_problems(value, protocol)
    if problems:
        kind = type(value)
        raise InvalidArgument(f"{what} {kind.__module__}.{kind.__qualname__} is not a ringzero {protocol.__name__}: "
                              f"{'; '.join(problems)}. See ringzero.protocols.{protocol.__name__} and "
                              f"its conformance kit, ringzero.compat")
