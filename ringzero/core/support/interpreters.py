"""An executor's own session (an interpreter kept between runs), asked for in one way by whoever
needs one: a process's ``ctx.session()`` and the smolagents adapter outside a kernel."""

from __future__ import annotations

from typing import Any

from ringzero.core.contract.errors import InvalidArgument
from ringzero.core.contract.protocols import Executor
from ringzero.core.contract.types import ExecLimits

__all__ = ["check_keeps_interpreter", "open_interpreter"]


def check_keeps_interpreter(executor: Executor, who: str) -> None:
    """Refuse (``InvalidArgument``, naming ``who`` needs it) an executor that keeps no
    interpreter between runs: ``capabilities.sessions``, and a ``session()`` to open one."""
    if not executor.capabilities.sessions or not callable(getattr(executor, "session", None)):
        raise InvalidArgument(
            f"{type(executor).__name__} keeps no interpreter between runs (capabilities.sessions is False): {who} "
            "needs one that does, such as MontyExecutor or ProcessExecutor")


async def open_interpreter(executor: Executor, limits: ExecLimits | None) -> Any:
    """``executor``'s session, open (``MontySession``, ``ProcessSession``): given ``limits``
    where there are some (an executor's ``session()`` may take none)."""
    opening = executor.session  # type: ignore[attr-defined]
    interpreter = opening() if limits is None else opening(limits)
    await interpreter.__aenter__()
    return interpreter
