"""ProcessExecutor: full CPython (any installed package) in a confined, forked process.

A fork server keeps the interpreter, common standard library modules
(``_forkserver.COMMON_MODULES``) and preloaded packages warm; each run is one fresh fork of
it, confined by a cgroup, Linux namespaces with a private root, rlimits, Landlock, seccomp
and an unprivileged uid (see ``_confine``, ``_mounts``, ``_seccomp``, ``_cgroups`` and
SECURITY.md). The code sees only the interpreter, system libraries, its own tmpfs scratch
(``/tmp``) and, when given, the agent's workspace; no network, but for a run given
``ExecLimits(egress=...)`` a proxy on the host (``process_egress``, ``ringzero.providers.egress``)
that its clients find through ``HTTPS_PROXY``; an environment of ``PATH``,
``LANG``, ``HOME``, ``TMPDIR`` and what ``env=`` adds (nothing of the host's); and host tools
as plain functions whose calls cross back over the run's socket, so secrets stay with the
host. Linux only.

One fork server prepares about 230 sandboxes a second on a 2-core machine (BENCHMARKS.md), so
the executor keeps a pool of them, at most ``fork_servers`` (one per CPU this process may use,
by default). It
starts with one and starts another, in the background, only when a run is asked for while
every server has a run in flight: code run one at a time costs one server. A run goes to the
server with the fewest runs in flight.

``preload`` names more modules each fork server imports once, so that runs find them loaded:
``ProcessExecutor(preload=("pandas",))`` makes a pandas run take milliseconds instead of the
second an import costs, at the price of slower forks (see BENCHMARKS.md). Nothing else is
loaded in the fork server (not ringzero's kernel, not asyncio): a run that imports asyncio
pays about 20 ms for it unless ``preload`` names it.

Controls are probed when the executor starts. If any cannot be enforced on this host,
``start()`` refuses with the reasons, unless ``allow_weaker_isolation=True``; then
``capabilities`` and ``missing_controls`` say what is missing.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import sys
import tempfile
import time
from collections.abc import Mapping
from typing import Any

from ringzero.core.contract.errors import Closed, ExecutorError, InvalidArgument
from ringzero.core.contract.protocols import ENFORCED, ExecutorCapabilities, Tool
from ringzero.core.contract.types import JSON, ExecError, ExecLimits, ExecResult
from ringzero.core.support.owner_only import owner_only_folder
from ringzero.core.support.timeouts import fail_after
from ringzero.core.support.tool_pool import DEFAULT_TOOL_THREADS, ToolPool
from ringzero.providers.executors import workspaces
from ringzero.providers.executors._confine import CONTROLS
from ringzero.providers.executors._runner import frame
from ringzero.providers.executors.boundary import (
    HostTools,
    ProtocolViolation,
    check_value,
    clip,
    executor_error,
    finished,
    merge_limits,
    message_limit,
)
from ringzero.providers.executors.fork_servers import Channel, ForkServer, remove_tree
from ringzero.providers.executors.process_egress import RunEgress

__all__ = ["SANDBOX_ENVIRONMENT", "ProcessExecutor", "ProcessSession", "remove_tree"]

DEFAULT_LIMITS = ExecLimits(wall_seconds=30.0, memory_bytes=1024 * 1024 * 1024, output_bytes=1024 * 1024,
                            tool_bytes=1024 * 1024, run_tool_bytes=32 * 1024 * 1024)
SANDBOX_ENVIRONMENT = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "OPENBLAS_NUM_THREADS": "1",
                       "OMP_NUM_THREADS": "1"}
"""The environment every run starts from; ``HOME`` and ``TMPDIR`` are its scratch, and
``env=`` adds to it. Nothing else of the host's environment enters."""


_PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
# How the fork server starts: its three parent packages are made bare (no __init__ runs), so that
# it holds what a run needs and not the kernel, asyncio and ssl that `import ringzero` loads.
# Every run is a fork of its memory: 8 MB of its own instead of 14, copied on write by each run.
_FORK_SERVER_BOOT = f"""
import sys, types
for name in ("ringzero", "ringzero.providers", "ringzero.providers.executors"):
    package = types.ModuleType(name)
    package.__path__ = [{_PACKAGE_ROOT!r} + "/" + name.replace(".", "/")]
    sys.modules[name] = package
from ringzero.providers.executors._forkserver import main
main()
"""


def _server_environment(extra: Mapping[str, str]) -> dict[str, str]:
    """What the fork server starts with: the sandbox's environment, plus where Python finds
    ringzero (and, if the host needs them to start its interpreter, ``PYTHONPATH`` and
    ``LD_LIBRARY_PATH``). Every run inherits this memory, so no host secret may be in it."""
    paths = [p for p in (os.environ.get("PYTHONPATH", ""), _PACKAGE_ROOT) if p]
    env = {**SANDBOX_ENVIRONMENT, **extra, "PYTHONPATH": os.pathsep.join(paths)}
    if "LD_LIBRARY_PATH" in os.environ:
        env["LD_LIBRARY_PATH"] = os.environ["LD_LIBRARY_PATH"]
    return env


class ProcessExecutor:
    """Runs agent code as full CPython, one confined fork per run."""

    controls = CONTROLS
    """The controls each run is confined by (``missing_controls`` names those this host lacks)."""
    WORKSPACE = "/workspace"
    """Where a run finds the workspace (also ``$RINGZERO_WORKSPACE``), with a private root: that
    is, unless ``allow_weaker_isolation=True`` let it start without namespaces, when it is the
    workspace's host path."""

    def __init__(
        self,
        *,
        limits: ExecLimits | None = None,
        preload: tuple[str, ...] = (),
        allow_weaker_isolation: bool = False,
        max_processes: int = 32,
        file_bytes: int = 64 * 1024 * 1024,
        max_files: int = 16384,
        warm: int = 2,
        workspace: str | os.PathLike[str] | None = None,
        workspace_bytes: int = workspaces.WORKSPACE_BYTES,
        workspace_files: int = workspaces.WORKSPACE_FILES,
        env: Mapping[str, str] | None = None,
        fork_servers: int | None = None,
        tool_threads: int = DEFAULT_TOOL_THREADS,
        show_tool_errors: bool = False,
    ) -> None:
        if not sys.platform.startswith("linux"):
            raise ExecutorError("ProcessExecutor confines code with Linux namespaces and Landlock; this is not Linux")
        if fork_servers is not None and (not isinstance(fork_servers, int) or isinstance(fork_servers, bool)
                                         or fork_servers < 1):
            raise InvalidArgument(f"fork_servers must be a whole number of at least 1, not {fork_servers!r}")
        env = dict(env or {})
        bad = [k for k, v in env.items() if not isinstance(k, str) or not isinstance(v, str) or "=" in k or not k]
        if bad:
            raise InvalidArgument(f"env must map variable names to strings; these entries are not: {bad!r}")
        self.limits = merge_limits(limits, DEFAULT_LIMITS)
        self.preload = preload
        self.allow_weaker_isolation = allow_weaker_isolation
        self.max_processes = max_processes
        self.file_bytes = file_bytes
        """The run's scratch (``/tmp``) holds at most this many bytes in all, and one file no more."""
        self.max_files = max_files
        self.warm = warm
        self.env = env
        """Variables added to ``SANDBOX_ENVIRONMENT`` for every run: the only way a host value
        enters the sandbox's environment."""
        self.workspace = os.path.abspath(workspace) if workspace is not None else ""
        """A directory every run may write (at ``/workspace``, ``$RINGZERO_WORKSPACE``), kept
        between runs: an agent's workspace, owned by the agent's own uid, where runs make files
        and folders only (no symlink, FIFO, socket, device or set-id file, so nothing in it can
        trick the host that reads it later). Everything else outside the run's scratch
        directory is read-only. Where the host is root it is a file system of its own
        (``workspaces``): ``workspace_bytes`` in ``workspace_files`` files and folders at most,
        past which a run's writes fail with ENOSPC."""
        self.workspace_bytes = workspace_bytes
        self.workspace_files = workspace_files
        self._workspace_uid = 0
        self.fork_servers = fork_servers if fork_servers is not None else len(os.sched_getaffinity(0))
        """At most this many fork servers: started one at a time, as concurrent runs need them."""
        self.tool_pool = ToolPool(tool_threads)
        """Where the runs' sync host tools run: at most ``tool_threads`` at once."""
        self.show_tool_errors = show_tool_errors
        """Show the code every tool error's message, not only a ``ToolError``'s."""
        self.missing_controls: dict[str, str] = {}
        self._controls: list[str] = []
        self._servers: list[ForkServer] = []
        self._starting = asyncio.Lock()
        self._growing: asyncio.Task[None] | None = None
        self._cannot_grow = False  # a server failed to start in the background: serve on with those there are

    @property
    def capabilities(self) -> ExecutorCapabilities:
        return ExecutorCapabilities(isolation="process", full_cpython=True, sessions=True, tools=True,
                                    network="namespaces" not in self._controls and bool(self._servers),
                                    enforces=ENFORCED)

    @property
    def servers(self) -> tuple[ForkServer, ...]:
        """The fork servers of the pool now (each with its process and its runs in flight)."""
        return tuple(self._servers)

    @property
    def growing(self) -> bool:
        """Whether a fork server is being added to the pool now."""
        return self._growing is not None

    @property
    def servers_running(self) -> int:
        """How many fork servers the pool holds now (at most ``fork_servers``)."""
        return sum(server.alive for server in self._servers)

    async def start(self) -> None:
        """Start a fork server (if none is running) and probe the host. Raises ExecutorError if a
        control cannot be enforced and weaker isolation was not accepted."""
        async with self._starting:
            for dead in [s for s in self._servers if not s.alive]:  # its runs already failed
                await self._retire(dead)
            if not self._servers:
                self._servers.append(await self._start_fork_server())

    async def _start_fork_server(self) -> ForkServer:
        """Start one fork server and read which controls it enforces. Stops it and raises
        ExecutorError where it did not start, or cannot enforce a control and weaker isolation
        was not accepted."""
        host_end, server_end = socket.socketpair()
        host_end.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)  # before the fork server can send
        root = tempfile.mkdtemp(prefix="ringzero-root-")  # an empty mount point, never written
        os.chmod(root, 0o711)
        try:
            if self.workspace:
                await asyncio.to_thread(self._prepare_workspace)
            process = await asyncio.create_subprocess_exec(
                sys.executable, "-c", _FORK_SERVER_BOOT, str(server_end.fileno()),
                pass_fds=(server_end.fileno(),), env=_server_environment(self.env), cwd="/")
        except BaseException:
            host_end.close()
            await asyncio.to_thread(remove_tree, root)
            raise
        finally:
            server_end.close()
        server = ForkServer(process, host_end, root)
        try:
            config = {"preload": list(self.preload), "root": root, "warm": self.warm,
                      "workspace": self.workspace, "workspace_uid": self._workspace_uid,
                      "file_bytes": self.file_bytes, "scratch_inodes": self.max_files,
                      "max_processes": self.max_processes, "memory_bytes": self.limits.memory_bytes}
            host_end.sendall(frame(config))
            channel = Channel(host_end.dup(), 1 << 20, sender=process.pid)
            try:
                async with fail_after(60):
                    ready = await channel.read()
            except (TimeoutError, asyncio.IncompleteReadError, ProtocolViolation) as exc:
                raise ExecutorError("the ProcessExecutor's fork server did not start") from exc
            finally:
                channel.close()
                host_end.setblocking(True)  # the dup shared its file description, non-blocking mode included
            missing = {c: why for c, why in ready["controls"].items() if why is not None}
            missing.update({c: why for c, why in self.missing_controls.items() if c == "workspace_quota"})
            self.missing_controls = missing  # also where start() refuses: the caller may look
            self._controls = [c for c in CONTROLS if c not in missing]
            if missing and not self.allow_weaker_isolation:
                reasons = "; ".join(f"{c}: {why}" for c, why in missing.items())
                raise ExecutorError(f"this host cannot enforce {', '.join(missing)} ({reasons}); "
                                    "pass allow_weaker_isolation=True to run with what it can enforce")
        except BaseException:
            await server.stop()
            raise
        return server

    def _prepare_workspace(self) -> None:
        """Create the workspace; as root, hand it to its agent's uid (every run given this
        workspace runs as it, and no other run does), readable by that uid alone, and put it in
        a file system of its own with its quota (``workspaces``)."""
        if os.geteuid() != 0:
            owner_only_folder(self.workspace)
            self.missing_controls["workspace_quota"] = str(workspaces.unavailable())
            return
        self._workspace_uid = workspaces.workspace_uid(self.workspace)
        refused = workspaces.prepare(self.workspace, self._workspace_uid, max_bytes=self.workspace_bytes,
                                     max_files=self.workspace_files)
        if refused is None:
            self.missing_controls.pop("workspace_quota", None)
        else:
            self.missing_controls["workspace_quota"] = refused

    async def _least_busy(self) -> ForkServer:
        """The server with the fewest runs in flight. Where even that one has a run, and the
        pool may grow, another server starts in the background for the runs after this one."""
        await self.start()
        server = min(self._servers, key=lambda s: s.runs)
        if (server.runs and self._growing is None and not self._cannot_grow
                and len(self._servers) < self.fork_servers):
            self._growing = asyncio.create_task(self._grow())
        return server

    async def _grow(self) -> None:
        try:
            server = await self._start_fork_server()
        except Exception:  # the pool serves on with the servers it has
            self._cannot_grow = True
            return
        finally:
            self._growing = None
        self._servers.append(server)

    async def _retire(self, server: ForkServer) -> None:
        with contextlib.suppress(ValueError):
            self._servers.remove(server)
        await server.stop()

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
        limits = merge_limits(limits, self.limits)
        refused = check_value(dict(inputs or {}), "inputs", None)
        if refused is not None:
            raise InvalidArgument(refused)
        host = HostTools(tools or {}, limits, self.tool_pool, show_errors=self.show_tool_errors)
        started = time.perf_counter()
        egress = None
        if host.egress is not None:
            await self.start()
            if "namespaces" not in self._controls:
                raise ExecutorError("a run with egress needs the namespaces control (its own network namespace, "
                                    f"where only the host's proxy listens); this host lacks it: "
                                    f"{self.missing_controls.get('namespaces')}")
            egress = RunEgress(host)
        sandbox = await self._open_run(limits, egress)
        try:
            outcome = await self._converse(sandbox, code, dict(inputs or {}), host, limits, egress)
        finally:
            if egress is not None:
                await egress.aclose()
            if host.egress is not None:  # a run cut short (its host shutting down) closes its upstreams too
                host.egress.close()
            await sandbox.end()
        value, stdout, error = outcome
        return ExecResult(value, stdout, error, time.perf_counter() - started, tuple(host.calls), host.ended())

    def session(self, limits: ExecLimits | None = None, *, cpu_seconds: float = 600.0) -> ProcessSession:
        """A session whose globals persist between runs: one confined sandbox process kept for
        it, ``async with executor.session() as s: await s.run(...)``. ``limits``: each step's
        (where the step gives none), and the sandbox's memory, set when it starts; its CPU time
        in all is at most ``cpu_seconds``."""
        return ProcessSession(self, merge_limits(limits, self.limits), cpu_seconds)

    async def _open_run(self, limits: ExecLimits, egress: RunEgress | None, *,
                        session_cpu_seconds: float | None = None) -> _Sandbox:
        """Ask the least busy fork server for a sandbox; where that one has died, it leaves the
        pool and the request goes to another (started, if none is left), once. A run given
        egress also sends a link of its own, on which its init hands over the proxy's listener.
        With ``session_cpu_seconds`` the sandbox is a session's: it takes run after run, and
        its CPU time in all is bounded by that."""
        cpu_seconds = session_cpu_seconds if session_cpu_seconds is not None else (limits.wall_seconds or 30) + 1
        header: dict[str, Any] = {"limits": {
            "cpu_seconds": int(cpu_seconds), "memory_bytes": limits.memory_bytes,
            "file_bytes": self.file_bytes, "processes": self.max_processes, "output_bytes": limits.output_bytes}}
        if egress is not None:
            header["egress"] = True
        if session_cpu_seconds is not None:
            header["session"] = True
        for attempt in (1, 2):
            server = await self._least_busy()
            mine, theirs = socket.socketpair()
            channel = Channel(mine, message_limit(limits), sender=server.process.pid)  # before anyone can send
            fds = [theirs.fileno()] if egress is None else [theirs.fileno(), egress.init_end.fileno()]
            try:
                socket.send_fds(server.control, [json.dumps(header).encode()], fds)
            except OSError as exc:
                channel.close()
                if attempt == 2:
                    raise ExecutorError(f"the ProcessExecutor's fork server is gone and did not restart: {exc}") \
                        from exc
                await self._retire(server)
                continue
            finally:
                theirs.close()
            server.run_began()
            return _Sandbox(server, channel)
        raise AssertionError("unreachable")

    async def _converse(self, sandbox: _Sandbox, code: str, inputs: dict[str, JSON], host: HostTools,
                        limits: ExecLimits, egress: RunEgress | None) -> tuple[JSON, str, ExecError | None]:
        """One run in ``sandbox``: its first (greeting, confinement, then the run) or, in a
        session's, the next. An outcome the executor gave (a limit, a killed sandbox, a broken
        protocol) leaves ``sandbox.broken`` set: it takes no more runs."""
        wall = limits.wall_seconds
        channel = sandbox.channel
        sandbox.broken = True  # until the run ends as the code's own
        try:
            async with fail_after(wall):
                if not sandbox.started:
                    sandbox.greeting.update(await channel.read())  # from the fork server, before any user code
                    greeting = sandbox.greeting
                    if greeting["op"] == "failed":
                        raise ExecutorError(f"the sandbox could not be set up: {greeting.get('message')}")
                    if not isinstance(greeting.get("pid"), int):
                        raise ProtocolViolation("no pid in the greeting")
                    channel.hand_over(greeting["pid"])  # from now on, only the run's own process may speak
                await channel.write({"op": "run", "code": code, "inputs": inputs, "tools": sorted(host.tools),
                                     "message_bytes": message_limit(limits),
                                     **({} if egress is None else {"egress": egress.request()})})
                if not sandbox.started:
                    confined = await channel.read()
                    if confined["op"] == "failed":  # the child could not confine itself; nothing ran
                        raise ExecutorError(f"the sandbox could not be set up: {confined.get('message')}")
                    if confined["op"] != "started":
                        raise ProtocolViolation(f"{confined['op']!r} before the run started")
                    sandbox.started = True
                    if egress is not None:
                        egress.serve()  # the init sent its listener before "started"
                while True:  # from here on the run's code may write to this socket itself
                    message = await channel.read()
                    if message["op"] == "call":
                        await channel.write(await host.answer(message))
                    elif message["op"] == "done":
                        outcome = await finished(message, limits)
                        sandbox.broken = outcome[2] is not None and outcome[2].origin == "executor"
                        return outcome
                    elif message["op"] == "failed":  # the runner's last word, or the code's: its outcome
                        return None, "", ExecError("SandboxFailed", clip(str(message.get("message")), 2000))
                    else:
                        raise ProtocolViolation(f"unknown message {message.get('op')!r}")
        except ProtocolViolation as exc:
            return None, "", executor_error("SandboxProtocolError",
                                            f"the sandbox broke the protocol and was killed: {exc}")
        except TimeoutError:
            return None, "", executor_error("TimeoutError", f"the run took longer than {wall} s and was killed")
        except (asyncio.IncompleteReadError, ConnectionError):
            return None, "", executor_error("SandboxKilled", "the sandboxed process died before it answered "
                                            "(a CPU, memory or process limit, or a signal)")

    async def aclose(self) -> None:
        """Stop every fork server (and one still starting); the executor may start again."""
        if self._growing is not None:
            growing = self._growing
            growing.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await growing
        self.tool_pool.close()
        servers, self._servers = self._servers, []
        await asyncio.gather(*(server.stop() for server in servers))


class _Sandbox:
    """One confined sandbox process handed to the host: its fork server, its channel, and the
    greeting (its init's pid; its scratch, without a private root)."""

    def __init__(self, server: ForkServer, channel: Channel) -> None:
        self.server, self.channel = server, channel
        self.greeting: dict[str, Any] = {}
        self.started = False
        """Whether it has confined itself and taken a run."""
        self.broken = False
        """Whether its last run ended by the executor's hand (a limit, a death): it takes no more."""
        self._ended = False

    async def end(self) -> None:
        """Kill it (its init: every process in its namespace ends) and remove its scratch."""
        if self._ended:
            return
        self._ended = True
        server, greeting = self.server, self.greeting
        server.run_ended()
        if isinstance(greeting.get("pid"), int):  # the namespace's init: killing it ends every process
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(greeting["pid"], signal.SIGKILL)
        self.channel.close()
        scratch = str(greeting.get("scratch", ""))  # only without a private root
        if scratch.startswith(server.root + os.sep):
            await asyncio.to_thread(remove_tree, scratch)


class ProcessSession:
    """Runs that share globals in one confined sandbox process (``ProcessExecutor.session``):
    ``async with executor.session() as s: await s.run(...)``. A run the executor ends (its wall
    limit, the sandbox's memory, a death) ends the sandbox; the next run starts a new, empty
    one. No egress: a session's sandbox has no network."""

    def __init__(self, executor: ProcessExecutor, limits: ExecLimits, cpu_seconds: float) -> None:
        self._executor = executor
        self.limits = limits
        self.cpu_seconds = cpu_seconds
        self._sandbox: _Sandbox | None = None
        self._closed = False
        self._one_at_a_time = asyncio.Lock()
        """Steps share one channel: a second step waits for the first to end."""

    async def __aenter__(self) -> ProcessSession:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def run(self, code: str, *, inputs: Mapping[str, JSON] | None = None,
                  tools: Mapping[str, Tool] | None = None, limits: ExecLimits | None = None) -> ExecResult:
        """The next step: what earlier steps defined (names, functions, classes, imports) is
        there. ``limits`` as ``ProcessExecutor.run``'s, but for memory: the session's."""
        if self._closed:
            raise Closed("this ProcessExecutor session is closed")
        if not isinstance(code, str):
            raise InvalidArgument(f"code must be a string, not {type(code).__name__}")
        executor = self._executor
        limits = merge_limits(limits, self.limits)
        refused = check_value(dict(inputs or {}), "inputs", None)
        if refused is not None:
            raise InvalidArgument(refused)
        host = HostTools(tools or {}, limits, executor.tool_pool, show_errors=executor.show_tool_errors)
        if host.egress is not None:
            raise InvalidArgument("a ProcessExecutor session's sandbox has no network: run code that needs egress "
                                  "with ctx.exec (or ProcessExecutor.run)")
        async with self._one_at_a_time:
            if self._closed:
                raise Closed("this ProcessExecutor session is closed")
            started = time.perf_counter()
            if self._sandbox is None:
                self._sandbox = await executor._open_run(self.limits, None, session_cpu_seconds=self.cpu_seconds)
            sandbox = self._sandbox
            try:
                value, stdout, error = await executor._converse(sandbox, code, dict(inputs or {}), host, limits, None)
            finally:
                if sandbox.broken or self._closed:
                    self._sandbox = None
                    await sandbox.end()
        return ExecResult(value, stdout, error, time.perf_counter() - started, tuple(host.calls), host.ended())

    async def aclose(self) -> None:
        """End the sandbox; later runs raise ``Closed``."""
        self._closed = True
        sandbox, self._sandbox = self._sandbox, None
        if sandbox is not None:
            await sandbox.end()
