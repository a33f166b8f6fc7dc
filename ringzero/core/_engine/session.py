"""A process's persistent interpreter (``ctx.session()``): steps of code that see what the
steps before them defined (names, functions, classes, imports), each a journaled syscall.

Each ``await session.exec(code, tools=...)`` is a syscall of kind ``session`` (its arguments:
the session's number in the process, the code, its inputs and its tools' names), its tool calls
journaled under its slot as an ``exec``'s are (``run_code``). A step recorded in the journal is
served from there, as any syscall: a resumed program gets each finished step's result without
running it. The interpreter those steps built is gone with the crashed host, so it is rebuilt
before the first step that runs live: the steps served are run again, in order, in a new
interpreter of the executor, every tool call they make answered from the journal
(``ToolCalls(served_only=True)``: one without a record stops the rebuild, and nothing runs live
in it). A step in flight at the crash runs again live on that rebuilt interpreter: its calls
that finished are served from the journal, the one in flight is in doubt as any tool call from
code is. Rebuilding by running again is for code that does the same when run again (Monty has
no clock and no randomness of its own; what it gets from tools comes from the journal).

The executor's interpreter is opened at the first live step (``limits``, the session's, bound
its memory there) and closed with the session (``async with ctx.session() as s:``, or
``aclose()``), or with its process, however that ends; an executor without sessions
(``capabilities.sessions``) is refused when the session is made. MontyExecutor and
ProcessExecutor keep one (a Monty worker; a confined sandbox process).
"""

from __future__ import annotations

import itertools
import logging
import weakref
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ringzero.core._engine.sys_tools import run_code
from ringzero.core._engine.tool_calls import ToolCalls
from ringzero.core.contract.errors import Closed
from ringzero.core.contract.protocols import Executor, Tool
from ringzero.core.contract.types import JSON, ExecLimits, ExecResult
from ringzero.core.support.interpreters import check_keeps_interpreter, open_interpreter
from ringzero.core.support.tool_boundary import bound_tools

if TYPE_CHECKING:
    from ringzero.core._engine.process import Process

__all__ = ["Session", "close_sessions", "open_session", "open_sessions"]

log = logging.getLogger("ringzero.sessions")

_numbers: weakref.WeakKeyDictionary[Process, itertools.count[int]] = weakref.WeakKeyDictionary()
"""Per process, the number ``open_session`` gives next: interpreters are opened in program
order, so a program run again numbers them the same."""

_open: weakref.WeakKeyDictionary[Process, set[Session]] = weakref.WeakKeyDictionary()
"""Per process, its sessions whose interpreter is open: closed with the process."""


def open_sessions(process: Process) -> int:
    """How many of ``process``'s sessions hold an interpreter now (``ringzero top`` shows it)."""
    return len(_open.get(process, ()))


async def close_sessions(process: Process) -> None:
    """Close what ``process``'s sessions hold (at its end, however it ends): a session's
    interpreter lives no longer than its process."""
    for session in list(_open.pop(process, ())):
        try:
            await session.aclose()
        except Exception:  # the process's end is recorded all the same
            log.warning("session %s of pid %s did not close cleanly", session.number, process.pid, exc_info=True)

Step = tuple[int, str, dict[str, JSON], dict[str, Tool], "ExecLimits | None"]
"""A step served from the journal, to run again before the first live one: its slot, code,
inputs, tools and limits."""


def open_session(process: Process, executor: Executor | None, limits: ExecLimits | None) -> Session:
    """``Context.session`` (see there), for ``process``."""
    running = executor if executor is not None else process.runtime.executor
    check_keeps_interpreter(running, "a session (ctx.session())")
    number = next(_numbers.setdefault(process, itertools.count(1)))
    return Session(process, running, number, limits)


class Session:
    """Steps of code in one interpreter, journaled (see the module). Made by ``ctx.session()``;
    use it as ``async with ctx.session() as s: await s.exec(...)``."""

    def __init__(self, process: Process, executor: Executor, number: int, limits: ExecLimits | None) -> None:
        self._process = process
        self._executor = executor
        self.number = number
        """The session's place among those its process made (1 for the first)."""
        self.limits = limits
        """Each step's limits, where the step gives none."""
        self._live: Any = None
        """The executor's session (its interpreter), opened at the first live step."""
        self._served: list[Step] = []
        self._closed = False
        self.steps = 0
        """Steps made so far, served from the journal or live."""

    @property
    def closed(self) -> bool:
        """Whether it is closed (``aclose()``, or its process ended): later steps raise ``Closed``."""
        return self._closed

    async def __aenter__(self) -> Session:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def exec(self, code: str, *, inputs: Mapping[str, JSON] | None = None,
                   tools: Mapping[str, Tool] | None = None, limits: ExecLimits | None = None) -> ExecResult:
        """Run the next step: ``ctx.exec``, in the interpreter this object holds, where what
        earlier steps defined is there. The code's own exceptions come back in ``error``. A step
        that hits a limit (memory, time) leaves a new, empty interpreter for the steps after it,
        as it does when it is run again to rebuild."""
        if self._closed:
            raise Closed(f"session {self.number} of pid {self._process.pid} is closed")
        limits = limits if limits is not None else self.limits
        self.steps += 1

        def served(slot: int) -> None:
            self._served.append((slot, code, dict(inputs or {}), dict(tools or {}), limits))

        return await run_code(self._process, "session", {"session": self.number}, code, inputs, tools, limits,
                              self._run, self._executor, replayed=served, before_live=self._ready)

    async def _run(self, code: str, inputs: Mapping[str, JSON], tools: Mapping[str, Tool],
                   limits: ExecLimits | None) -> ExecResult:
        result: ExecResult = await self._live.run(code, inputs=inputs, tools=tools, limits=limits)
        return result

    async def _ready(self) -> None:
        """Before a live step: the interpreter open, and the steps served from the journal run
        again in it (their tool calls answered from the journal)."""
        if self._live is None:
            self._live = await open_interpreter(self._executor, self.limits)
            _open.setdefault(self._process, set()).add(self)
        process = self._process
        served, self._served = self._served, []
        for slot, code, inputs, tools, limits in served:
            calls = ToolCalls(process.journal, process.pid, str(slot), process.idempotency_key(""), process,
                              served_only=True)
            await self._live.run(code, inputs=inputs, tools=bound_tools(tools, limits, calls), limits=limits)
            if calls.problem is not None:
                raise calls.problem

    async def aclose(self) -> None:
        """Close the interpreter (a session's worker goes back); later steps raise ``Closed``."""
        self._closed = True
        live, self._live = self._live, None
        if live is not None:
            _open.get(self._process, set()).discard(self)
            await live.aclose()
