"""The one place an effect is recorded: every syscall's live run, top-level or made by
sandboxed code, passes :func:`perform` once its slot has no record.

A slot is a syscall's place in program order (``"7"``), or a tool call that the code of exec
``7`` made (``"7.3"``, a :class:`~ringzero.core._engine.tool_calls.ToolCalls` slot). The caller takes
the slot and serves a recorded one (``Journal.take_slot``, ``Journal.recorded_call``: each
checks that the program asks for what was recorded there); ``perform`` runs the rest:

1. an effect on the world (``retry_safe`` given: a tool, a tool call from code) that was in
   flight when its host died is *in doubt*: it runs again only where ``retry_safe()`` says so,
   else its outcome is ``InDoubt``, which the caller raises as ``ToolInDoubt`` (recorded like
   any other outcome; a tool call from code stops its run instead, and its exec records it);
2. its intent is recorded before it runs, so that a crash now leaves it in doubt;
3. it runs live (where it asks, ``SLOT`` holds its slot meanwhile: what
   ``ctx.idempotency_key()`` and an exec's tool calls are named by);
4. its outcome (``ringzero.core.contract.outcomes``) is recorded before anyone sees it
   (``Journal.fill``), marked ``rerun: "in_doubt"`` where it ran again.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from ringzero.core.contract.outcomes import InDoubt, Outcome, with_beside
from ringzero.core.support.live import SLOT

if TYPE_CHECKING:
    from ringzero.core._engine.journal import Journal

__all__ = ["perform"]


async def perform(journal: Journal, slot: int | str, kind: str, fp: str, summary: str,
                  live: Callable[[], Awaitable[Outcome]], *,
                  retry_safe: Callable[[], bool] | None = None, slotted: bool = False) -> Outcome:
    """Run slot ``slot``'s effect live and record its outcome (see the module docstring): a
    syscall's slot is its seq, a tool call's from code ``"<seq>.<n>"``. ``live`` may read its
    slot (``current_slot``) where it is an effect (``retry_safe``) or ``slotted``."""
    rerun = False
    if retry_safe is not None:
        if await journal.in_doubt(slot):
            if not retry_safe():  # the program decides: the outcome says so, live and replayed
                doubt = InDoubt(str(slot), summary)
                # A tool call from code stops its run here: its exec's record holds the doubt.
                return doubt if isinstance(slot, str) else await journal.fill(slot, kind, fp, summary, doubt)
            rerun = True
        await journal.record_intent(slot, kind, fp, summary)
    if retry_safe is None and not slotted:
        outcome = await live()
    else:
        token = SLOT.set(slot)
        try:
            outcome = await live()
        finally:
            SLOT.reset(token)
    if rerun:
        outcome = with_beside(outcome, rerun="in_doubt")
    return await journal.fill(slot, kind, fp, summary, outcome)
