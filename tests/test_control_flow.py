"""The kernel's control-flow signals inside a program (``KernelInterrupt``: ``ToolInDoubt``,
``NonDeterminismError``) pass the ``except Exception`` that agent frameworks wrap around a tool,
as ``asyncio.CancelledError`` does: an in-doubt call never becomes an error the model retries."""

from __future__ import annotations

from pathlib import Path

import pytest

from ringzero import KernelInterrupt, NonDeterminismError, ProcessFailed, RingzeroError, ToolInDoubt
from tests import operator_programs as programs
from tests.operator_programs import crash_in, make_kernel


def test_the_kernel_s_signals_are_not_exceptions_a_catch_all_takes() -> None:
    for signal in (ToolInDoubt, NonDeterminismError):
        assert issubclass(signal, KernelInterrupt) and issubclass(signal, BaseException)
        assert not issubclass(signal, Exception) and not issubclass(signal, RingzeroError)


async def test_an_in_doubt_call_passes_a_framework_s_except_exception_and_is_never_run_twice(
        tmp_path: Path) -> None:
    """A payment in flight at a crash, inside a loop that turns any ``Exception`` into "try
    again": on resume the program ends with ToolInDoubt, and the payment ran once."""
    db = tmp_path / "state.db"
    await crash_in(db, programs.pays_like_a_framework, "pay 7")
    ran = programs.RUNS["pay 7"]
    assert ran >= 1
    async with make_kernel(db) as kernel:
        [handle] = await kernel.recover()
        with pytest.raises(ProcessFailed) as failed:
            await handle.wait(timeout=30)
    assert failed.value.error is not None and failed.value.error["type"] == "ToolInDoubt", failed.value
    assert programs.RUNS["pay 7"] == ran  # not paid again by the framework's retry
