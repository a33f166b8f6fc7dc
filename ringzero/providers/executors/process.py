"""ProcessExecutor: full CPython (any installed package) in a confined, forked process.

A fork server, started once, keeps the interpreter and preloaded packages warm; each run
is a fresh fork confined by Linux namespaces, rlimits, Landlock, seccomp and an
unprivileged uid (see ``_confine``). The code sees a read-only file system except its
own scratch directory, no network, and host tools as plain functions whose calls cross
back over the run's socket, so secrets stay with the host. Linux only.

``preload`` names modules the fork server imports once, so that runs find them loaded:
``ProcessExecutor(preload=("pandas",))`` makes a pandas run take milliseconds instead of the
second an import costs, at the price of slower forks (see BENCHMARKS.md).

Controls are probed when the executor starts. If any cannot be enforced on this host,
``start()`` refuses with the reasons, unless ``allow_weaker_isolation=True``; then
``capabilities`` and ``missing_controls`` say what is missing.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import socket
import struct
import sys
import tempfile
import time
from collections.abc import Mapping
from typing import Any

from ringzero.core.errors import ExecutorError, InvalidArgument
from ringzero.core.protocols import ExecutorCapabilities, Tool
from ringzero.core.types import JSON, ExecError, ExecLimits, ExecResult, ToolCallRecord
from ringzero.providers.executors._confine import CONTROLS
from ringzero.providers.executors._host import ProtocolViolation, answer_tool_call, merge_limits
from ringzero.providers.executors._runner import frame

__all__ = ["ProcessExecutor"]

DEFAULT_LIMITS = ExecLimits(wall_seconds=30.0, memory_bytes=1024 * 1024 * 1024, output_bytes=1024 * 1024)
_timeout = getattr(asyncio, "timeout", None)


def _prepare_workspace(path: str) -> None:
    """Create the workspace; as root, hand it to the uid runs use (they run as nobody)."""
    os.makedirs(path, exist_ok=True)
    if os.geteuid() == 0:
        from ringzero.providers.executors._confine import NOBODY

        os.chown(path, NOBODY, NOBODY)


class ProcessExecutor:
    """Runs agent code as full CPython, one confined fork per run."""

    def __init__(
        self,
        *,
        limits: ExecLimits | None = None,
        preload: tuple[str, ...] = (),
        allow_weaker_isolation: bool = False,
        max_processes: int = 32,
        file_bytes: int = 64 * 1024 * 1024,
        warm: int = 2,
        workspace: str | os.PathLike[str] | None = None,
    ) -> None:
        if not sys.platform.startswith("linux"):
            raise ExecutorError("ProcessExecutor confines code with Linux namespaces and Landlock; this is not Linux")
        self.limits = merge_limits(limits, DEFAULT_LIMITS)
        self.preload = preload
        self.allow_weaker_isolation = allow_weaker_isolation
        self.max_processes = max_processes
        self.file_bytes = file_bytes
        self.warm = warm
        self.workspace = os.path.abspath(workspace) if workspace is not None else ""
        """A directory every run may write (``$RINGZERO_WORKSPACE``), kept between runs: an
        agent's workspace. Everything else outside the run's scratch directory is read-only."""
        self.missing_controls: dict[str, str] = {}
        self.keeps_read_search = False
        """True when the sandboxed uid keeps CAP_DAC_READ_SEARCH to reach an interpreter that
        lives where ``nobody`` cannot read (Landlock still bounds what it reads)."""
        self._controls: list[str] = []
        self._server: asyncio.subprocess.Process | None = None
        self._control: socket.socket | None = None
        self._scratch_root = ""
        self._starting = asyncio.Lock()

    @property
    def capabilities(self) -> ExecutorCapabilities:
        return ExecutorCapabilities(isolation="process", full_cpython=True, sessions=False, tools=True,
                                    network="namespaces" not in self._controls and bool(self._server))

    async def start(self) -> None:
        """Start the fork server and probe the host. Raises ExecutorError if a control
        cannot be enforced and weaker isolation was not accepted."""
        async with self._starting:
            if self._server is not None:
                return
            host_end, server_end = socket.socketpair()
            self._scratch_root = tempfile.mkdtemp(prefix="ringzero-scratch-")
            os.chmod(self._scratch_root, 0o711)  # nobody may enter its own run's directory, not list them
            if self.workspace:
                _prepare_workspace(self.workspace)
            self._server = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "ringzero.providers.executors._forkserver", str(server_end.fileno()),
                json.dumps(list(self.preload)), self._scratch_root, str(self.warm), self.workspace,
                pass_fds=(server_end.fileno(),))
            server_end.close()
            self._control = host_end
            reader, writer = await asyncio.open_unix_connection(sock=host_end.dup())
            try:
                ready = await asyncio.wait_for(_read(reader), 60)
            except (asyncio.TimeoutError, asyncio.IncompleteReadError) as exc:
                await self.aclose()
                raise ExecutorError("the ProcessExecutor's fork server did not start") from exc
            finally:
                writer.close()
            self.missing_controls = {c: why for c, why in ready["controls"].items() if why is not None}
            self.keeps_read_search = bool(ready.get("keep_read_search"))
            self._controls = [c for c in CONTROLS if c not in self.missing_controls]
            if self.missing_controls and not self.allow_weaker_isolation:
                await self.aclose()
                reasons = "; ".join(f"{c}: {why}" for c, why in self.missing_controls.items())
                raise ExecutorError(f"this host cannot enforce {', '.join(self.missing_controls)} ({reasons}); "
                                    "pass allow_weaker_isolation=True to run with what it can enforce")

    async def run(
        self,
        code: str,
        *,
        inputs: Mapping[str, JSON] | None = None,
        tools: Mapping[str, Tool] | None = None,
        limits: ExecLimits | None = None,
    ) -> ExecResult:
        if not isinstance(code, str):
            raise InvalidArgument(f"code must be a string, not {type(code).__name__}")
        await self.start()
        limits = merge_limits(limits, self.limits)
        tools = dict(tools or {})
        started = time.perf_counter()
        mine, theirs = socket.socketpair()
        header = {"limits": {
            "cpu_seconds": int((limits.wall_seconds or 30) + 1), "memory_bytes": limits.memory_bytes,
            "file_bytes": self.file_bytes, "processes": self.max_processes, "output_bytes": limits.output_bytes}}
        assert self._control is not None
        socket.send_fds(self._control, [json.dumps(header).encode()], [theirs.fileno()])
        theirs.close()
        reader, writer = await asyncio.open_unix_connection(sock=mine)
        calls: list[ToolCallRecord] = []
        greeting: dict[str, Any] = {}
        try:
            outcome = await self._converse(reader, writer, code, dict(inputs or {}), tools, limits, calls, greeting)
        finally:
            if "pid" in greeting:  # the namespace's init: killing it ends every process the code started
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(greeting["pid"], signal.SIGKILL)
            writer.close()
            scratch = str(greeting.get("scratch", ""))
            if scratch.startswith(self._scratch_root + os.sep):
                shutil.rmtree(scratch, ignore_errors=True)
        value, stdout, error = outcome
        return ExecResult(value, stdout, error, time.perf_counter() - started, tuple(calls))

    async def _converse(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, code: str,
                        inputs: dict[str, JSON], tools: dict[str, Tool], limits: ExecLimits,
                        calls: list[ToolCallRecord], greeting: dict[str, Any]) -> tuple[JSON, str, ExecError | None]:
        wall = limits.wall_seconds
        try:
            async with (_timeout(wall) if _timeout is not None else _WaitFor(wall)):
                greeting.update(await _read(reader))  # from the fork server itself, before any user code
                if greeting["op"] == "failed":
                    raise ExecutorError(f"the sandbox could not be set up: {greeting.get('message')}")
                if not isinstance(greeting.get("pid"), int):
                    raise ProtocolViolation("no pid in the greeting")
                _write(writer, {"op": "run", "code": code, "inputs": inputs, "tools": sorted(tools)})
                while True:
                    message = await _read(reader)
                    if message["op"] == "call":
                        _write(writer, await answer_tool_call(message, tools, calls))
                    elif message["op"] == "done":
                        return _finished(message)
                    elif message["op"] == "failed":  # the child could not confine itself; nothing ran
                        raise ExecutorError(f"the sandbox could not be set up: {message.get('message')}")
                    else:
                        raise ProtocolViolation(f"unknown message {message.get('op')!r}")
        except ProtocolViolation as exc:
            return None, "", ExecError("SandboxProtocolError", f"the sandbox broke the protocol and was killed: {exc}")
        except (TimeoutError, asyncio.TimeoutError):
            return None, "", ExecError("TimeoutError", f"the run took longer than {wall} s and was killed")
        except asyncio.IncompleteReadError:
            return None, "", ExecError("SandboxKilled", "the sandboxed process died before it answered "
                                       "(a CPU, memory or process limit, or a signal)")

    async def aclose(self) -> None:
        if self._control is not None:
            self._control.close()
            self._control = None
        if self._server is not None:
            server, self._server = self._server, None
            with contextlib.suppress(ProcessLookupError):
                server.kill()
            await server.wait()
        if self._scratch_root:
            shutil.rmtree(self._scratch_root, ignore_errors=True)
            self._scratch_root = ""


MAX_MESSAGE = 64 * 1024 * 1024


async def _read(reader: asyncio.StreamReader) -> dict[str, Any]:
    (length,) = struct.unpack("!I", await reader.readexactly(4))
    if length > MAX_MESSAGE:
        raise ProtocolViolation(f"a {length}-byte message (the limit is {MAX_MESSAGE})")
    try:
        message = json.loads(await reader.readexactly(length))
    except ValueError as exc:
        raise ProtocolViolation(f"malformed message: {exc}") from exc
    if not isinstance(message, dict) or "op" not in message:
        raise ProtocolViolation("a message without an op")
    return message


def _finished(message: dict[str, Any]) -> tuple[JSON, str, ExecError | None]:
    error = message.get("error")
    if error is not None and not isinstance(error, dict):
        raise ProtocolViolation("a malformed error")
    stdout = message.get("stdout", "")
    exec_error = None if error is None else ExecError(
        str(error.get("type", "Exception")), str(error.get("message", "")), str(error.get("traceback", "")))
    return message.get("value"), stdout if isinstance(stdout, str) else str(stdout), exec_error


def _write(writer: asyncio.StreamWriter, message: Any) -> None:
    writer.write(frame(message))


class _WaitFor:
    """asyncio.timeout for Python 3.10: cancels the body after ``delay`` seconds."""

    def __init__(self, delay: float | None) -> None:
        self._delay = delay
        self._handle: asyncio.TimerHandle | None = None
        self._expired = False

    async def __aenter__(self) -> None:
        if self._delay is not None:
            task = asyncio.current_task()
            assert task is not None
            self._handle = asyncio.get_running_loop().call_later(self._delay, self._expire, task)

    def _expire(self, task: asyncio.Task[Any]) -> None:
        self._expired = True
        task.cancel()

    async def __aexit__(self, exc_type: object, exc: object, tb: object) -> None:
        if self._handle is not None:
            self._handle.cancel()
        if self._expired and exc_type is asyncio.CancelledError:
            raise asyncio.TimeoutError
