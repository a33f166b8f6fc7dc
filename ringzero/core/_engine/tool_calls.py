"""The tool calls one exec's code makes, each a slot of the effect engine under the exec's own.

``ctx.exec`` makes a :class:`ToolCalls` for the run and hands it to the executor as ``calls``;
the executor's boundary (``HostTools``, through ``call_tool``) passes every tool call the code
makes to it. The n-th call takes slot ``<exec slot>.<n>`` when it starts, in the order the code
makes them. A recorded one is answered from the journal (its value, or its error raised again),
after checking that the code asks for the same tool and arguments; a new one goes through
``ringzero.core._engine.effect.perform`` like every other effect: its intent, its live run, its record.
Where a call cannot go on (it diverged from its record, it is in doubt, the store failed), the
run is abandoned: that call and every later one raise in the code, and ``ctx.exec`` raises
``problem`` once the executor returns.

A quick sync tool called from the thread that runs the code (Monty's) is answered there:
``call_here`` makes the same steps as ``perform`` (intent, live run, record), writing the intent
and the record from that thread where the store appends from any thread
(``capabilities.append_anywhere``), and on the loop, waited for, where it cannot.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from ringzero.core._engine.effect import perform
from ringzero.core.contract.errors import (
    CheckpointerError,
    KernelInterrupt,
    NonDeterminismError,
    RingzeroError,
    ToolInDoubt,
)
from ringzero.core.contract.fingerprints import fingerprint
from ringzero.core.contract.outcomes import Failure, InDoubt, Outcome, Value, exception_of, failure, with_beside
from ringzero.core.contract.types import strict_json
from ringzero.core.support.effects import retry_safe, takes_idempotency_key, tool_summary
from ringzero.core.support.host_tools import ResultCheck
from ringzero.core.support.live import SLOT
from ringzero.core.support.loop_pool import LoopStopped, wait_for_loop
from ringzero.core.support.tool_parameters import IDEMPOTENCY_KEY

if TYPE_CHECKING:
    from ringzero.core._engine.journal import Journal

__all__ = ["PlainCall", "PlainCallHere", "ToolCalls", "journal_on_loop"]

PlainCall = Callable[[Any, list[Any], dict[str, Any]], Awaitable[Any]]
"""How the boundary runs a tool live: ``plain(tool, args, kwargs)``."""
PlainCallHere = Callable[[Any, list[Any], dict[str, Any]], Any]
"""``PlainCall`` in the calling thread: the tool run and its result judged there."""


class ToolCalls:
    """The journal of one exec's tool calls (see the module docstring). ``owner`` is whose share
    of a tool pool the run's sync tools take (the kernel process)."""

    def __init__(self, journal: Journal, pid: int, slot: str, key_prefix: str, owner: object, *,
                 served_only: bool = False) -> None:
        self.journal = journal
        self.served_only = served_only
        """Every call must be answered from the journal (a session's step run again to rebuild its
        interpreter): one without a record stops the run, and nothing runs live."""
        self.pid = pid
        self.slot = slot
        self.key_prefix = key_prefix
        self.owner = owner
        self.problem: RingzeroError | KernelInterrupt | None = None
        self.served = 0
        """Calls answered from the journal."""
        self.rerun = 0
        """In-doubt calls run again because their tool is safe to repeat."""
        self._count = 0
        self._keyed: dict[int, bool] = {}
        """Per tool (by id: the run holds its tools), whether it takes an idempotency key
        (``takes_idempotency_key`` reads its signature: 5 µs a call)."""

    def _takes_key(self, tool: Any) -> bool:
        keyed = self._keyed.get(id(tool))
        if keyed is None:
            keyed = self._keyed[id(tool)] = takes_idempotency_key(tool)
        return keyed

    async def call(self, name: str, tool: Any, args: list[Any], kwargs: dict[str, Any], plain: PlainCall,
                   check: ResultCheck | None = None) -> Any:
        """The call's outcome: served from the journal, or ``plain`` run live (which judges the
        result with ``check`` before it is recorded; a served result passes ``check`` too, so the
        run's budget is charged as it was when the call was made)."""
        slot, fp, summary = self._begin(name, args, kwargs)  # before anything is awaited: the code's order
        try:
            recorded = await self.journal.recorded_call(slot, "tool", fp, summary)
        except (NonDeterminismError, CheckpointerError) as exc:
            raise self._abandon(exc) from None
        if isinstance(recorded, (Value, Failure)):
            value = self._served(recorded)
            if check is not None:
                await check(value)
            return value
        if self.served_only:
            raise self._abandon(self._unrecorded(slot, name, summary))
        raised: list[Exception] = []

        async def live() -> Outcome:
            given = {**kwargs, IDEMPOTENCY_KEY: self.key_prefix + slot} if self._takes_key(tool) else kwargs
            try:
                value = await plain(tool, args, given)
            except Exception as exc:
                raised.append(exc)
                return failure(exc)
            try:
                text = strict_json(value)
            except (TypeError, ValueError) as exc:
                error = ValueError(f"the result of {name}() is not JSON-compatible: {exc}")
                raised.append(error)
                return failure(error)
            # The code gets what a replay would serve it: the result as the journal holds it.
            return Value(json.loads(text))

        try:
            outcome = recorded or await perform(self.journal, slot, "tool", fp, summary, live,
                                                retry_safe=lambda: retry_safe(tool))
        except CheckpointerError as exc:
            raise self._abandon(exc) from None
        if isinstance(outcome, InDoubt):
            raise self._abandon(ToolInDoubt(self.pid, name, slot, summary))
        self.rerun += outcome.beside.get("rerun") == "in_doubt"
        if raised:  # a failure recorded live: the tool's own exception, as raised
            raise raised[0]
        return outcome.value if isinstance(outcome, Value) else None

    @property
    def answers_here(self) -> bool:
        """Whether ``call_here`` may answer a call in the thread that runs the code."""
        return self.journal.answers_here

    def call_here(self, name: str, tool: Any, args: list[Any], kwargs: dict[str, Any], plain: PlainCallHere,
                  loop: asyncio.AbstractEventLoop, check: Callable[[Any], None] | None = None) -> Any:
        """``call`` in the thread that runs the code, not ``loop``'s: the same slot, the same
        record, the same steps as ``perform``, the tool run here by ``plain``."""
        slot, fp, summary = self._begin(name, args, kwargs)
        journal = self.journal
        try:
            recorded = journal.recorded_call_here(slot, "tool", fp, summary)
        except NonDeterminismError as exc:
            raise self._abandon(exc) from None
        if isinstance(recorded, (Value, Failure)):
            value = self._served(recorded)
            if check is not None:
                check(value)
            return value
        if self.served_only:
            raise self._abandon(self._unrecorded(slot, name, summary))
        rerun = journal.in_doubt_here(slot)
        if rerun and not retry_safe(tool):
            raise self._abandon(ToolInDoubt(self.pid, name, slot, summary))
        try:
            if not journal.record_intent_here(slot, "tool", fp, summary):
                journal_on_loop(loop, journal.record_intent(slot, "tool", fp, summary))
        except CheckpointerError as exc:
            raise self._abandon(exc) from None
        raised: Exception | None = None
        given = {**kwargs, IDEMPOTENCY_KEY: self.key_prefix + slot} if self._takes_key(tool) else kwargs
        token = SLOT.set(slot)
        try:
            outcome: Outcome = Value(None)
            try:
                value = plain(tool, args, given)
            except Exception as exc:
                raised, outcome = exc, failure(exc)
            else:
                try:
                    text = strict_json(value)
                except (TypeError, ValueError) as exc:
                    raised = ValueError(f"the result of {name}() is not JSON-compatible: {exc}")
                    outcome = failure(raised)
                else:
                    outcome = Value(json.loads(text))  # the code gets what a replay would serve it
        finally:
            SLOT.reset(token)
        if rerun:
            outcome = with_beside(outcome, rerun="in_doubt")
        try:
            if not journal.record_call_here(slot, "tool", fp, summary, outcome):
                journal_on_loop(loop, journal.fill(slot, "tool", fp, summary, outcome))
        except CheckpointerError as exc:
            raise self._abandon(exc) from None
        self.rerun += rerun
        if raised is not None:
            raise raised
        return outcome.value if isinstance(outcome, Value) else None

    def _begin(self, name: str, args: list[Any], kwargs: dict[str, Any]) -> tuple[str, str, str]:
        """The call's slot (the next, in the order the code makes its calls), fingerprint and
        summary; raises where the run was abandoned."""
        self._count += 1
        slot = f"{self.slot}.{self._count}"
        if self.problem is not None:
            raise self._abandoned()
        return slot, fingerprint({"name": name, "args": args, "kwargs": kwargs}), tool_summary(name, args, kwargs)

    def _unrecorded(self, slot: str, name: str, summary: str) -> NonDeterminismError:
        return NonDeterminismError(
            f"pid {self.pid}: tool call #{slot} ({summary}) has no record, but this run is made again only to "
            f"rebuild a session, every call of it answered from the journal: the code now calls {name}() where it "
            "did not before (a session's steps must make the same calls when they run again)")

    def _served(self, recorded: Value | Failure) -> Any:
        """A recorded call's value, or its recorded error raised again."""
        self.served += 1
        if isinstance(recorded, Failure):
            raise exception_of(recorded)
        return recorded.value

    def _abandon(self, problem: RingzeroError | KernelInterrupt) -> RuntimeError:
        if self.problem is None:
            self.problem = problem
        return self._abandoned()

    def _abandoned(self) -> RuntimeError:
        return RuntimeError(f"ringzero stops this run: {type(self.problem).__name__} (no further tool runs)")


def journal_on_loop(loop: asyncio.AbstractEventLoop, write: Awaitable[Any]) -> None:
    """A journal write the store cannot take from this thread, made on ``loop`` and waited for.
    A loop that stops meanwhile (its kernel closing while the code still runs) ends the wait
    with ``CheckpointerError`` (``wait_for_loop``)."""
    async def written() -> None:
        await write

    job = written()
    try:
        wait_for_loop(asyncio.run_coroutine_threadsafe(job, loop), loop)
    except (LoopStopped, RuntimeError) as exc:  # stopped, or closed before it was sent
        if isinstance(exc, LoopStopped) or loop.is_closed():
            job.close()
            if asyncio.iscoroutine(write):
                write.close()
            raise CheckpointerError("the kernel stopped before this tool call could be journaled") from None
        raise
