"""A tool's exception reaches the program as itself, live and on replay: ``except CardDeclined:``
around ``ctx.tool`` matches when the call runs and when a resumed program replays it; an
exception whose class cannot be rebuilt from the record is ``ToolFailed`` naming it, both times.
Each program is stopped as a crash would stop it (an idempotent charge in flight), then resumed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ringzero.core.contract.outcomes import Failure, failure, rebuilt
from tests import operator_programs as programs
from tests.operator_programs import CardDeclined, crash_in, make_kernel


async def live_then_replayed(db: Path, program: Any, hang: str) -> tuple[Any, Any]:
    """What ``program`` returns run through, and what it returns resumed after a crash in ``hang``."""
    async with make_kernel(db / "live.db") as kernel:
        handle = await kernel.spawn(program)
        live = await handle.wait(timeout=30)
    await crash_in(db / "crashed.db", program, hang)
    async with make_kernel(db / "crashed.db") as kernel:
        [handle] = await kernel.recover()
        replayed = await handle.wait(timeout=30)
        assert handle.replayed_syscalls >= 1  # what failed was served from the journal, not run again
    return live, replayed


async def test_a_tool_s_exception_is_caught_by_its_class_live_and_on_replay(tmp_path: Path) -> None:
    programs.RUNS.clear()
    live, replayed = await live_then_replayed(tmp_path, programs.declined_then_charges, "charge 9")
    expected = [["declined", "insufficient funds", 51],
                ["ToolFailed", "tool 'refuse' raised Refusal: refused: over the limit"],
                "charged 9"]
    assert live == replayed == expected
    assert programs.RUNS["charge_card 5"] == 2 and programs.RUNS["refuse 5"] == 2  # once per program, not on replay


async def test_a_framework_s_exception_through_journaled_tool_is_the_same_class_on_replay(tmp_path: Path) -> None:
    programs.RUNS.clear()
    live, replayed = await live_then_replayed(tmp_path, programs.retried_by_a_framework, "charge 10")
    assert live == replayed == [["retry", "the answer had no date: ask again"], "charged 10"]
    assert programs.RUNS["validate"] == 2


def test_only_a_class_that_imports_back_is_rebuilt() -> None:
    declined = failure(CardDeclined("insufficient funds", 51))
    assert declined.details["class"] == "tests.operator_programs:CardDeclined"
    again = rebuilt(declined)
    assert isinstance(again, CardDeclined) and again.code == 51

    class Local(Exception):
        pass

    assert "class" not in failure(Local("x")).details and rebuilt(failure(Local("x"))) is None
    assert isinstance(rebuilt(failure(KeyError("k"))), KeyError)  # built-ins by name, as before
    assert rebuilt(Failure("Gone", "x", None, {"class": "tests.no_such_module:Gone"})) is None

