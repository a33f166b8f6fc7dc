"""The boundary every tool call from code crosses, and the tools ``ctx.exec`` hands an executor.

``ToolBoundary`` checks a call both ways (the parameters the host keeps, sizes, the run's byte
budget), runs the tool off the event loop and journals it. ``ctx.exec`` hands an executor its
run's tools as a ``RunTools`` (``bound_tools``): a callable per tool that goes through a
``ToolBoundary`` of its own, so an executor that calls the tools it is given, in process or from
a message its sandbox sent, journals every call whatever else it does; and, on the mapping,
the run's journal and the tools themselves. An executor that runs its own ``ToolBoundary``
(``HostTools``) over the mapping gets both from it, with no tool given too (its egress
requests are the run's calls): one boundary per call, never two.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import dataclasses
import functools
from collections.abc import Mapping
from typing import Any

from ringzero.core.contract.errors import ResultRefused, ToolError
from ringzero.core.contract.outcomes import ERROR_CHARS, clip
from ringzero.core.contract.protocols import Tool, ToolCallJournal
from ringzero.core.contract.types import ExecLimits, ToolCallRecord
from ringzero.core.support.host_tools import call_tool, call_tool_here, is_async, runs_here
from ringzero.core.support.json_cost import measure, measure_async
from ringzero.core.support.loop_pool import wait_for_loop
from ringzero.core.support.tool_parameters import ToolParameters
from ringzero.core.support.tool_pool import CallHere, ToolPool, shared_pool

__all__ = ["BINDING", "CALL_BYTES", "RunTools", "ShownError", "ToolBinding", "ToolBoundary", "bound_tools",
           "unbound"]

NO_LIMITS = ExecLimits()


CALL_BYTES = 512
"""What one tool call costs a run's byte budget besides its values: its intent and its record
in the journal, its entry in the run's record. It bounds how many calls a run may make."""
_ERROR_ROOM = 2 * (ERROR_CHARS + 160)
"""What a call's error may cost (its text twice, clipped): a call is admitted only where the
budget has this much room beyond its arguments, so that its outcome always fits."""


@dataclasses.dataclass(frozen=True)
class ShownError:
    """A failed tool call as the code sees it: a type name and, where it may be shown, a
    message (``original`` stays on the host)."""

    type: str
    message: str | None
    original: BaseException

    def reply(self) -> dict[str, Any]:
        """The ``error`` frame a sandbox's tool proxy raises from."""
        return {"op": "error", "type": self.type, "args": [] if self.message is None else [self.message]}

    def as_exception(self) -> Exception:
        """An exception to raise in the code: the built-in of that name, else ``Exception``
        (whose message names the type)."""
        cls = getattr(builtins, self.type, None)
        if isinstance(cls, type) and issubclass(cls, Exception):
            with contextlib.suppress(Exception):
                return cls() if self.message is None else cls(self.message)
        return Exception(self.type if self.message is None else f"{self.type}: {self.message}")


class ToolBoundary:
    """One run's host tools as its code reaches them: the one boundary every executor's tool
    calls cross, in both directions (``HostTools`` adds a run's egress and the sandbox's frames).

    - A call is refused before the tool runs (the code gets a ValueError or TypeError) where
      it sets a parameter the host keeps (``ringzero.core.support.tool_parameters``: bound with the
      tool's signature, only parameters without a default and those the tool declares with
      ``code_may_set`` are the code's); where its arguments are not JSON, nest too deeply or
      exceed ``tool_bytes``; or where the run's byte budget (``run_tool_bytes``) has no room
      left for it.
    - A tool runs off the event loop (``call_tool``: sync tools in ``pool``); whatever it raises,
      ``SystemExit`` included, is that call's error. The code sees the type name, and the message
      only for a :class:`~ringzero.core.contract.errors.ToolError` (or with ``show_errors``), clipped.
    - A result is checked the same way as arguments before the host keeps or returns it.
    - Every call is in ``calls``, a call cut short by the run's end too.

    The budget bounds what the run's calls add to the journal, whatever the code does: each
    call is charged ``CALL_BYTES`` and its arguments when it is admitted, its result (or its
    error's text) twice when it returns (the call's own record and the run's), each value as
    the journal stores it (compact ASCII JSON). A refused call's record is charged too; past
    the budget, refused calls are only counted, in one last record."""

    def __init__(self, tools: Mapping[str, Tool], limits: ExecLimits, pool: ToolPool | None = None, *,
                 show_errors: bool = False, journal: ToolCallJournal | None = None) -> None:
        self.tools: dict[str, Tool] = {}
        self.journal = journal
        """What journals the run's calls, one by one: the journal of the run ``ctx.exec`` handed
        the tools for (``RunTools.journal``, there even when it gave no tools: the run's own
        requests, ``http_request``, are journaled too); None for a run outside a kernel process."""
        if isinstance(tools, RunTools):  # what ctx.exec hands over: the run's journal, the tools themselves
            self.journal = tools.journal if tools.journal is not None else journal
            self.tools.update(tools.originals)
        else:
            for name, tool in tools.items():
                self.tools[name], bound_to = unbound(tool)
                if bound_to is not None:  # a bound tool taken out of its run's mapping
                    self.journal = bound_to
        self.tool_bytes = limits.tool_bytes
        self.budget = limits.run_tool_bytes
        self.spent = 0
        """Bytes of the budget charged so far."""
        self.pool = pool
        self.owner: object = self if self.journal is None else self.journal.owner
        """Whose share of the pool its sync tools take: the kernel process the run is for, else the run."""
        self.show_errors = show_errors
        self.calls: list[ToolCallRecord] = []
        self.unrecorded = 0
        """Calls refused once the budget had no room left even for their record."""
        self._parameters: dict[str, ToolParameters] = {}
        self.running_here: tuple[str, list[Any], dict[str, Any], CallHere] | None = None
        """The call ``call_here`` runs now, if any."""

    def _room(self) -> int | None:
        return None if self.budget is None else max(0, self.budget - self.spent)

    def _refuse(self, name: str, exc: Exception) -> tuple[bool, ShownError]:
        """A call refused before its tool ran: kept in the record while the budget has room."""
        text = clip(f"{type(exc).__name__}: {exc}")
        room = self._room()
        if room is None or CALL_BYTES + len(text) <= room:
            self.spent += CALL_BYTES + len(text)
            self.calls.append(ToolCallRecord(name, [], {}, None, text))
        else:
            if self.unrecorded:
                self.calls.pop()
            self.unrecorded += 1
            self.calls.append(ToolCallRecord(name, [], {}, None, (
                f"ValueError: {self.unrecorded} more call(s) refused, not kept one by one: this run's tool "
                f"calls used the whole of run_tool_bytes ({self.budget})")))
        return False, ShownError(type(exc).__name__, clip(str(exc)), exc)

    def _failed(self, name: str, args: list[Any], kwargs: dict[str, Any], text: str) -> None:
        """A call admitted that did not return a value: its error's text kept, and charged
        twice (the journal keeps it in the call's record too); admission left room for it."""
        self.spent += 2 * len(text)
        self.calls.append(ToolCallRecord(name, args, kwargs, None, text))

    def _over(self, size: int, what: str) -> str | None:
        room = self._room()
        if room is None or size <= room:
            return None
        return (f"{what} would take this run's tool calls to {self.spent + size} bytes of JSON, over the "
                f"limit of {self.budget} for the whole run")

    def _admit(self, name: str, args: list[Any], kwargs: dict[str, Any]) -> Tool | Exception:
        """The tool a call names, or why the call is refused before its arguments are measured."""
        tool = self.tools.get(name)
        if tool is None:
            return NameError(f"no host tool named {name!r}")
        parameters = self._parameters.get(name)
        if parameters is None:
            parameters = self._parameters[name] = ToolParameters(tool, name)
        return parameters.refusal(args, kwargs) or tool

    def _charge_arguments(self, name: str, size: int, refused: str | None) -> Exception | None:
        """Charge a call's measured arguments to the budget, or say why it is refused."""
        refused = refused or self._over(size + CALL_BYTES + _ERROR_ROOM, f"the arguments to {name}()")
        if refused is not None:
            return ValueError(refused)
        self.spent += size + CALL_BYTES
        return None

    def _outcome(self, name: str, args: list[Any], kwargs: dict[str, Any], exc: Exception) -> tuple[bool, ShownError]:
        """A call admitted whose tool raised, or whose result may not cross."""
        if isinstance(exc, ResultRefused):  # too large, not JSON, or no room left: judged before anything kept it
            self._failed(name, args, kwargs, f"ValueError: {exc}")
            return False, ShownError("ValueError", str(exc), ValueError(str(exc)))
        self._failed(name, args, kwargs, clip(f"{type(exc).__name__}: {_text(exc)}"))
        shown = isinstance(exc, ToolError) or self.show_errors
        return False, ShownError(type(exc).__name__, clip(_text(exc)) if shown else None, exc)

    async def call(self, name: str, args: list[Any], kwargs: dict[str, Any]) -> tuple[bool, Any]:
        """``(True, result)``, or ``(False, ShownError)`` for a call refused, a tool that raised
        or a result that may not cross the boundary."""
        tool = self._admit(name, args, kwargs)
        if isinstance(tool, Exception):
            return self._refuse(name, tool)
        refusal = self._charge_arguments(name, *await measure_async([args, kwargs], f"the arguments to {name}()",
                                                                    self.tool_bytes))
        if refusal is not None:
            return self._refuse(name, refusal)
        try:
            run = functools.partial((self.pool or shared_pool()).run, owner=self.owner, result_bytes=self.tool_bytes)
            result = await call_tool(tool, args, kwargs, name=name, run=run,
                                     check=functools.partial(self._admit_result, name), calls=self.journal)
        except asyncio.CancelledError:
            self._failed(name, args, kwargs, "Cancelled: the run ended before the tool returned")
            raise
        except Exception as exc:
            return self._outcome(name, args, kwargs, exc)
        self.calls.append(ToolCallRecord(name, args, kwargs, result))
        return True, result

    def runs_here(self, name: str) -> bool:
        """True where ``call_here`` may answer calls to ``name``: a plain sync tool, in a run
        outside a kernel process or in one whose journal takes records from this thread
        (``ToolCallJournal.answers_here``)."""
        tool = self.tools.get(name)
        return (self.journal is None or self.journal.answers_here) and tool is not None and runs_here(tool)

    def call_here(self, name: str, args: list[Any], kwargs: dict[str, Any],
                  loop: asyncio.AbstractEventLoop) -> tuple[bool, Any]:
        """``call`` in the calling thread, which is not ``loop``'s (Monty's thread that calls
        host functions), for a tool ``runs_here``: the same checks, the same record, the tool
        run right here. Calls in one run come one at a time (sync-style code)."""
        tool = self._admit(name, args, kwargs)
        if isinstance(tool, Exception):
            return self._refuse(name, tool)
        refusal = self._charge_arguments(name, *measure([args, kwargs], f"the arguments to {name}()", self.tool_bytes))
        if refusal is not None:
            return self._refuse(name, refusal)
        handle = CallHere(name)
        self.running_here = (name, args, kwargs, handle)
        pool = self.pool or shared_pool()

        def plain(tool: Tool, args: list[Any], kwargs: dict[str, Any]) -> Any:
            result = call_tool_here(tool, args, kwargs, pool=pool, call=handle, loop=loop)
            self._check_here(name, result)
            return result

        try:
            if self.journal is None:
                result = plain(tool, args, kwargs)
            else:  # journaled from this thread: answered from the record, or run and recorded
                result = self.journal.call_here(name, tool, args, kwargs, plain, loop,
                                                functools.partial(self._check_here, name))
        except Exception as exc:
            return self._outcome(name, args, kwargs, exc)
        finally:
            self.running_here = None
        self.calls.append(ToolCallRecord(name, args, kwargs, result))
        return True, result

    def cut_short(self) -> None:
        """The run ended while ``call_here`` ran a tool: that call's record says so, and the
        tool, in a thread the run no longer waits for, counts in its pool's ``overrunning``
        until it returns."""
        running = self.running_here
        if running is not None:
            name, args, kwargs, handle = running
            self._failed(name, args, kwargs, "Cancelled: the run ended before the tool returned")
            (self.pool or shared_pool()).abandon_here(handle)

    async def _admit_result(self, name: str, result: Any) -> None:
        """A result may cross where it is JSON within ``tool_bytes`` and the budget has room for
        it twice: judged as the tool returns, before the journal keeps anything of it."""
        size, refused = await measure_async(result, f"the result of {name}()", self.tool_bytes)
        self._charge_result(name, size, refused)

    def _check_here(self, name: str, result: Any) -> None:
        """``_admit_result`` in the calling thread."""
        size, refused = measure(result, f"the result of {name}()", self.tool_bytes)
        self._charge_result(name, size, refused)

    def _charge_result(self, name: str, size: int, refused: str | None) -> None:
        refused = refused or self._over(2 * size, f"the result of {name}()")
        if refused is not None:
            raise ResultRefused(refused)
        self.spent += 2 * size



def _text(exc: BaseException) -> str:
    try:
        return str(exc)
    except Exception:
        return "<a message that cannot be shown>"


@dataclasses.dataclass(frozen=True)
class ToolBinding:
    """What a tool ``bound_tools`` made is bound to: the tool itself and the run's journal."""

    tool: Tool
    journal: ToolCallJournal | None


BINDING = "ringzero_binding"
"""The attribute of a bound tool that holds its ``ToolBinding``."""


def unbound(tool: Tool) -> tuple[Tool, ToolCallJournal | None]:
    """``(the tool itself, its run's journal)`` for a tool ``bound_tools`` made, else ``(tool, None)``."""
    binding = getattr(tool, BINDING, None)
    if isinstance(binding, ToolBinding):
        return binding.tool, binding.journal
    return tool, None


class RunTools(dict[str, Tool]):
    """The tools ``ctx.exec`` hands an executor, and the run they belong to: each a function
    bound to the run's journal (``bound_tools``), and, on the mapping itself, the run's
    ``journal`` and the ``originals``. An executor that calls the tools journals every call;
    one that builds a ``ToolBoundary`` (``HostTools``) from the mapping gets the run's journal
    from it, even when the mapping is empty, so that everything the run does through the host
    (its ``http_request`` calls under egress too) is journaled whatever tools it was given."""

    def __init__(self, bound: Mapping[str, Tool], originals: Mapping[str, Tool],
                 journal: ToolCallJournal | None) -> None:
        super().__init__(bound)
        self.originals: dict[str, Tool] = dict(originals)
        self.journal = journal

    def __bool__(self) -> bool:
        return True  # an empty one still carries its run's journal: never replaced by a default


def bound_tools(tools: Mapping[str, Tool], limits: ExecLimits | None,
                journal: ToolCallJournal | None = None) -> RunTools:
    """The tools as ``ctx.exec`` hands them to an executor: each a function of the tool's own
    signature (``inspect.signature`` reads through it) whose every call crosses a
    ``ToolBoundary``: the parameters the host keeps are refused, arguments and results are held
    to ``limits``, and, with ``journal`` (a kernel process's), the call is recorded before and
    after it runs, a recorded call is answered from the journal and one in doubt is never run
    again unless its tool is safe to repeat.

    An async tool's stand-in is a coroutine function, awaited on any loop (the call itself is
    made on the kernel's, where the journal is written). A sync tool's is a plain function that
    waits for its call from any thread but the event loop's: called on the loop's own thread it
    raises RuntimeError, and ``tool.acall(...)`` is the coroutine to await instead. A failed
    call raises what the tool raised (or the TypeError or ValueError of a call refused)."""
    loop = asyncio.get_running_loop()
    limits = limits or NO_LIMITS
    if limits.egress is not None:  # the executor's own boundary (HostTools) carries the run's egress
        limits = dataclasses.replace(limits, egress=None)
    boundary = ToolBoundary(tools, limits, journal=journal)
    return RunTools({name: _bound(name, tool, boundary, journal, loop) for name, tool in boundary.tools.items()},
                    boundary.tools, journal)


def _bound(name: str, tool: Tool, boundary: ToolBoundary, journal: ToolCallJournal | None,
           loop: asyncio.AbstractEventLoop) -> Tool:
    async def on_loop(args: list[Any], kwargs: dict[str, Any]) -> Any:
        ok, outcome = await boundary.call(name, args, kwargs)
        if ok:
            return outcome
        raise outcome.original

    async def acall(*args: Any, **kwargs: Any) -> Any:
        if asyncio.get_running_loop() is loop:
            return await on_loop(list(args), dict(kwargs))
        # awaited on another loop (an executor's own thread): the journal is written on the kernel's
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(on_loop(list(args), dict(kwargs)), loop))

    def call(*args: Any, **kwargs: Any) -> Any:
        try:
            running: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            raise RuntimeError(f"tool {name!r} was called on the event loop's own thread, where its journaled call "
                               f"cannot wait for the journal: call it from another thread (asyncio.to_thread), or "
                               f"await {name}.acall(...)")
        return wait_for_loop(asyncio.run_coroutine_threadsafe(on_loop(list(args), dict(kwargs)), loop))

    bound = acall if is_async(tool) else call
    functools.update_wrapper(bound, tool)
    vars(bound).update({"acall": acall, BINDING: ToolBinding(tool, journal)})
    return bound

