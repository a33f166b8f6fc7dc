"""The host side of the sandbox boundary, shared by every executor (and open to executors
outside ringzero: ``HostTools`` is what a third-party executor calls for its tool calls).

Everything a sandbox sends is untrusted: messages are size-capped before they are parsed, the
data beside them (a call's arguments, the final value) is judged by its length before it is
parsed, values nested deeper than ``MAX_DEPTH`` are refused before any recursive code sees them,
and tool arguments and results are size-capped before the host keeps them, one call and the
whole run (``HostTools``), by a walk that counts what they cost before any JSON is made
(``json_cost``), so that no value the code makes stalls the event loop. Host tools run off the
event loop: a coroutine function is awaited, a plain function runs in the executor's bounded
tool pool, so a slow tool stalls only its own run (whose wall limit still holds), never the host.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import dataclasses
import functools
import json
from collections.abc import Mapping
from typing import Any

from ringzero.core.contract.egress import EgressRecord
from ringzero.core.contract.errors import InvalidArgument, ResultRefused, ToolError
from ringzero.core.contract.outcomes import ERROR_CHARS, clip
from ringzero.core.contract.protocols import Tool, ToolCallJournal
from ringzero.core.contract.types import JSON, ExecError, ExecLimits, ToolCallRecord
from ringzero.core.support.host_tools import call_tool, call_tool_here, runs_here
from ringzero.core.support.json_cost import NOT_JSON, check_value, measure, measure_async
from ringzero.core.support.tool_parameters import ToolParameters
from ringzero.core.support.tool_pool import CallHere, ToolPool, shared_pool
from ringzero.providers.egress.engine import TOOL_NAME as EGRESS_TOOL
from ringzero.providers.egress.engine import EgressRun
from ringzero.providers.executors._runner import CONTROL_BYTES, HEADER, MAX_DEPTH, deeper_than

__all__ = ["MAX_DEPTH", "NOT_JSON", "FrameBuffer", "HostTools", "ProtocolViolation", "ShownError", "check_value",
           "clip", "deeper_than", "executor_error", "finished", "measure", "measure_async", "merge_limits",
           "message_limit"]



class ProtocolViolation(Exception):
    """The sandbox sent something that is not the protocol: it is killed, the host carries on."""


def executor_error(type_: str, message: str) -> ExecError:
    """An outcome the executor itself decided (a limit, a kill, a broken protocol): its
    ``origin`` tells it from anything the code could have reported."""
    return ExecError(type_, message, origin="executor")


def merge_limits(limits: ExecLimits | None, defaults: ExecLimits) -> ExecLimits:
    """``limits`` with each unset field taken from ``defaults``."""
    if limits is None:
        return defaults
    return dataclasses.replace(limits, **{f.name: getattr(defaults, f.name) for f in dataclasses.fields(limits)
                                          if getattr(limits, f.name) is None})


def message_limit(limits: ExecLimits) -> int:
    """The largest frame a run may send: a ``done`` carries stdout and the value (each capped at
    ``output_bytes``), a ``call`` its arguments (capped at ``tool_bytes``)."""
    return 2 * (limits.output_bytes or 0) + (limits.tool_bytes or 0) + 64 * 1024


async def finished(message: dict[str, Any], limits: ExecLimits) -> tuple[JSON, str, ExecError | None]:
    """The run's outcome from its ``done`` (its data: the value's JSON text and stdout),
    re-checked here: the sandbox is not trusted to have applied its own limits. The value is
    judged by its length before it is parsed, and walked a piece at a time after."""
    error = message.get("error")
    if error is not None and not (isinstance(error, dict) and all(isinstance(v, str) for v in error.values())):
        raise ProtocolViolation("a malformed error")
    value_text, stdout_bytes = _data(message, 2)
    stdout = stdout_bytes.decode("utf-8", "replace")
    if limits.output_bytes is not None and len(stdout) > limits.output_bytes + 100:
        stdout = stdout[:limits.output_bytes] + "\n[output truncated]"
    limit = limits.output_bytes
    if limit is not None and len(value_text) > limit:
        return None, stdout, executor_error("OutputLimitExceeded", f"the code's final value is {len(value_text)} "
                                            f"bytes of JSON, over the limit of {limit}")
    value = _parsed(value_text, "final value")
    _, refused = await measure_async(value, "the code's final value", limit)
    if refused is not None and NOT_JSON in refused:  # NaN or an infinity: the code's own value, not a limit
        return None, stdout, ExecError("ValueError", refused)
    if refused is not None:
        return None, stdout, executor_error("OutputLimitExceeded", refused)
    exec_error = None if error is None else ExecError(
        str(error.get("type", "Exception")), str(error.get("message", "")), str(error.get("traceback", "")))
    return value, stdout, exec_error


def _data(message: dict[str, Any], count: int) -> list[bytes]:
    data = message.get("data")
    if not isinstance(data, list) or len(data) != count:
        raise ProtocolViolation(f"a {message.get('op')!r} without its {count} piece(s) of data")
    return data


def _parsed(text: bytes, what: str) -> Any:
    """JSON text of known, checked length (its cost is bounded by the run's limit)."""
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise ProtocolViolation(f"a malformed {what}: {type(exc).__name__}") from None


class FrameBuffer:
    """Reassembles length-prefixed JSON messages, and the raw data each names, from arbitrary
    chunks. A message over ``control`` bytes, or data over ``limit`` in all, is refused from its
    header, before it is read; a message that is not a JSON object with an ``op``, or nests too
    deeply, is refused before anyone uses it. Data is never parsed here: its reader judges it by
    its length first (``finished``, ``HostTools.answer``)."""

    def __init__(self, limit: int = 64 * 1024 * 1024, control: int = CONTROL_BYTES) -> None:
        self._buffer = bytearray()
        self.limit = limit
        self.control = control
        self._pending: dict[str, Any] | None = None  # a message whose data is still arriving
        self._expected: list[int] = []

    def feed(self, data: bytes) -> list[dict[str, Any]]:
        self._buffer += data
        messages = []
        size = HEADER.size
        while len(self._buffer) >= size:
            (length,) = HEADER.unpack(self._buffer[:size])
            if self._pending is not None and length != self._expected[0]:
                raise ProtocolViolation(f"{length} bytes of data where {self._expected[0]} were announced")
            limit = self.control if self._pending is None else self.limit
            if length > limit:
                raise ProtocolViolation(f"a {length}-byte message (the limit is {limit})")
            if len(self._buffer) < size + length:
                break
            payload = bytes(self._buffer[size:size + length])
            del self._buffer[:size + length]
            if self._pending is not None:
                self._pending["data"].append(payload)
                self._expected.pop(0)
                if not self._expected:
                    messages.append(self._pending)
                    self._pending = None
                continue
            message = self._message(payload)
            announced = message.get("data")
            if announced is None:
                messages.append(message)
                continue
            if not isinstance(announced, list) or not all(type(n) is int and n >= 0 for n in announced) \
                    or sum(announced) > self.limit:
                raise ProtocolViolation(f"data of {announced!r} bytes (the limit is {self.limit} in all)")
            message["data"] = []
            if announced:
                self._pending, self._expected = message, list(announced)
            else:
                messages.append(message)
        return messages

    @staticmethod
    def _message(payload: bytes) -> dict[str, Any]:
        try:
            message = json.loads(payload)
        except (ValueError, RecursionError) as exc:
            raise ProtocolViolation(f"a malformed message: {type(exc).__name__}: {exc}") from exc
        if not isinstance(message, dict) or not isinstance(message.get("op"), str):
            raise ProtocolViolation("a message without an op")
        if deeper_than(message, MAX_DEPTH + 2):
            raise ProtocolViolation(f"a message nested more than {MAX_DEPTH} levels deep")
        return message


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


class HostTools:
    """One run's host tools as its code reaches them: the one boundary every executor's tool
    calls cross, in both directions.

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
                 show_errors: bool = False, calls: ToolCallJournal | None = None) -> None:
        self.tools = dict(tools)
        self.egress: EgressRun | None = None
        """The run's egress (``ExecLimits.egress``): its ``http_request`` tool is among ``tools``."""
        if limits.egress is not None:
            if EGRESS_TOOL in self.tools:
                raise InvalidArgument(f"a run with egress has the built-in tool {EGRESS_TOOL!r}; give yours "
                                      "another name")
            self.egress = EgressRun(limits.egress)
            self.tools[EGRESS_TOOL] = self.egress.tool
        self.tool_bytes = limits.tool_bytes
        self.budget = limits.run_tool_bytes
        self.spent = 0
        """Bytes of the budget charged so far."""
        self.pool = pool
        self.journal = calls
        """What journals the run's calls, one by one (the ``calls`` that ``ctx.exec`` handed the
        executor); None for a run outside a kernel process."""
        self.owner: object = self if calls is None else calls.owner
        """Whose share of the pool its sync tools take: the kernel process the run is for, else the run."""
        self.show_errors = show_errors
        self.calls: list[ToolCallRecord] = []
        self.unrecorded = 0
        """Calls refused once the budget had no room left even for their record."""
        self._parameters: dict[str, ToolParameters] = {}
        self.running_here: tuple[str, list[Any], dict[str, Any], CallHere] | None = None
        """The call ``call_here`` runs now, if any."""

    def ended(self) -> tuple[EgressRecord, ...]:
        """The run ended: its connections upstream close. Returns its requests through the
        host, for its ``ExecResult``."""
        if self.egress is None:
            return ()
        self.egress.close()
        return tuple(self.egress.log)

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
        outside a kernel process (a journaled call is written on the event loop)."""
        tool = self.tools.get(name)
        return self.journal is None and tool is not None and runs_here(tool)

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
        try:
            result = call_tool_here(tool, args, kwargs, pool=self.pool or shared_pool(), call=handle, loop=loop)
            size, refused = measure(result, f"the result of {name}()", self.tool_bytes)
            self._charge_result(name, size, refused)
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

    def _charge_result(self, name: str, size: int, refused: str | None) -> None:
        refused = refused or self._over(2 * size, f"the result of {name}()")
        if refused is not None:
            raise ResultRefused(refused)
        self.spent += 2 * size

    async def answer(self, message: dict[str, Any]) -> dict[str, Any]:
        """The reply to a sandbox's ``call`` message: the tool's result or its error. Its
        arguments are its data, the JSON text ``[args, kwargs]`` (as ``FrameBuffer`` reads it),
        judged by length before it is parsed; a message may also carry ``args`` and ``kwargs``
        themselves (an executor that parsed them already)."""
        name = message.get("name")
        if message.get("op") != "call" or not isinstance(name, str):
            raise ProtocolViolation("a malformed tool call")
        if "data" in message:
            [text] = _data(message, 1)
            if self.tool_bytes is not None and len(text) > self.tool_bytes:
                return self._refuse(name, ValueError(f"the arguments to {name}() are {len(text)} bytes of JSON, "
                                                     f"over the limit of {self.tool_bytes}"))[1].reply()
            arguments = _parsed(text, "tool call")
            args, kwargs = arguments if isinstance(arguments, list) and len(arguments) == 2 else (None, None)
        else:
            args, kwargs = message.get("args"), message.get("kwargs")
        if not isinstance(args, list) or not isinstance(kwargs, dict) or not all(isinstance(k, str) for k in kwargs):
            raise ProtocolViolation("a malformed tool call")
        ok, outcome = await self.call(name, args, kwargs)
        return {"op": "result", "value": outcome} if ok else outcome.reply()


def _text(exc: BaseException) -> str:
    try:
        return str(exc)
    except Exception:
        return "<a message that cannot be shown>"
