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
"""

from __future__ import annotations

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
from ringzero.core.contract.outcomes import Failure, InDoubt, Outcome, Value, exception_of, failure
from ringzero.core.contract.types import strict_json
from ringzero.core.support.effects import retry_safe, takes_idempotency_key, tool_summary
from ringzero.core.support.host_tools import ResultCheck
from ringzero.core.support.tool_parameters import IDEMPOTENCY_KEY

if TYPE_CHECKING:
    from ringzero.core._engine.journal import Journal

__all__ = ["PlainCall", "ToolCalls"]

PlainCall = Callable[[Any, list[Any], dict[str, Any]], Awaitable[Any]]
"""How the boundary runs a tool live: ``plain(tool, args, kwargs)``."""


class ToolCalls:
    """The journal of one exec's tool calls (see the module docstring). ``owner`` is whose share
    of a tool pool the run's sync tools take (the kernel process)."""

    def __init__(self, journal: Journal, pid: int, slot: str, key_prefix: str, owner: object) -> None:
        self.journal = journal
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

    async def call(self, name: str, tool: Any, args: list[Any], kwargs: dict[str, Any], plain: PlainCall,
                   check: ResultCheck | None = None) -> Any:
        """The call's outcome: served from the journal, or ``plain`` run live (which judges the
        result with ``check`` before it is recorded; a served result passes ``check`` too, so the
        run's budget is charged as it was when the call was made)."""
        self._count += 1  # taken before anything is awaited: the order the code made the calls in
        slot = f"{self.slot}.{self._count}"
        if self.problem is not None:
            raise self._abandoned()
        fp = fingerprint({"name": name, "args": args, "kwargs": kwargs})
        summary = tool_summary(name, args, kwargs)
        try:
            recorded = await self.journal.recorded_call(slot, "tool", fp, summary)
        except (NonDeterminismError, CheckpointerError) as exc:
            raise self._abandon(exc) from None
        if isinstance(recorded, (Value, Failure)):
            self.served += 1
            if isinstance(recorded, Failure):
                raise exception_of(recorded)
            if check is not None:
                await check(recorded.value)
            return recorded.value
        raised: list[Exception] = []

        async def live() -> Outcome:
            given = {**kwargs, IDEMPOTENCY_KEY: self.key_prefix + slot} if takes_idempotency_key(tool) else kwargs
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

    def _abandon(self, problem: RingzeroError | KernelInterrupt) -> RuntimeError:
        if self.problem is None:
            self.problem = problem
        return self._abandoned()

    def _abandoned(self) -> RuntimeError:
        return RuntimeError(f"ringzero stops this run: {type(self.problem).__name__} (no further tool runs)")
