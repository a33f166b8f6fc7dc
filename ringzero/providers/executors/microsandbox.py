"""MicrosandboxExecutor: agent code in a microVM (libkrun, through the microsandbox SDK 0.7).

A pool of pre-started sandboxes, each with no network by default (``Network.none()``) and
the agent's workspace directory mounted at ``/workspace`` (it persists between runs of that
agent). A run is ``python3 -c <runner>`` in a pooled VM, speaking the same framed protocol as
the process executor over the exec's stdin/stdout, so host tools stay on the host. A VM whose
run timed out or whose exec failed is discarded and replaced.

The image is offline: a root file system directory (``Image.bind``). Build one with Debian's
mmdebstrap, which needs nothing but Debian's package mirror::

    sudo apt-get install mmdebstrap
    mmdebstrap --variant=minbase --include=python3 bookworm ./rootfs

    executor = MicrosandboxExecutor("./rootfs", workspace="./agent-workspace")

MicroVMs need hardware virtualization: ``/dev/kvm`` usable and a CPU exposing vmx or svm.
``start()`` (and ``ringzero doctor``) check that first and refuse with the reason.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any, Generic, TypeVar

from ringzero.core.contract.egress import Egress
from ringzero.core.contract.errors import ExecutorError, InvalidArgument, MissingExtra
from ringzero.core.contract.protocols import ExecutorCapabilities, Tool
from ringzero.core.contract.types import JSON, ExecError, ExecLimits, ExecResult
from ringzero.core.support.owner_only import owner_only_folder
from ringzero.core.support.tool_pool import DEFAULT_TOOL_THREADS, ToolPool
from ringzero.providers.executors import _runner
from ringzero.providers.executors.boundary import (
    FrameBuffer,
    HostTools,
    ProtocolViolation,
    check_value,
    executor_error,
    finished,
    merge_limits,
    message_limit,
)
from ringzero.providers.executors.microsandbox_egress import microvm_network

try:
    import microsandbox as ms
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise MissingExtra("MicrosandboxExecutor", "microsandbox") from exc

__all__ = ["MicrosandboxExecutor", "SandboxPool", "microvm_unavailable_reason"]

DEFAULT_LIMITS = ExecLimits(wall_seconds=60.0, memory_bytes=512 * 1024 * 1024, output_bytes=1024 * 1024,
                            tool_bytes=1024 * 1024, run_tool_bytes=32 * 1024 * 1024)
RUNNER_SOURCE = Path(_runner.__file__).read_text()
T = TypeVar("T")


def microvm_unavailable_reason(kvm: str = "/dev/kvm", cpuinfo: str = "/proc/cpuinfo") -> str | None:
    """Why microVMs cannot boot on this host, or None when nothing stands in the way yet."""
    if not os.path.exists(kvm):
        return f"{kvm} does not exist: this machine exposes no KVM"
    if not os.access(kvm, os.R_OK | os.W_OK):
        return f"{kvm} exists but this user cannot open it for reading and writing"
    try:
        flags = {f for line in Path(cpuinfo).read_text().splitlines() if line.startswith("flags") for f in line.split()}
    except OSError:
        flags = set()
    if not flags & {"vmx", "svm"}:
        return "the CPU exposes no hardware virtualization (no vmx or svm flag): microVMs cannot boot here"
    if not ms.is_runtime_installed():
        return "the microsandbox runtime (msb, libkrunfw) is not installed: run `msb` setup or reinstall the SDK"
    return None


class SandboxPool(Generic[T]):
    """Up to ``size`` live sandboxes; idle ones are handed out first, broken ones replaced."""

    def __init__(self, create: Callable[[], Awaitable[T]], destroy: Callable[[T], Awaitable[None]], size: int) -> None:
        if size < 1:
            raise InvalidArgument(f"a sandbox pool needs a size of at least 1, got {size}")
        self._create, self._destroy, self.size = create, destroy, size
        self._idle: list[T] = []
        self._live = 0
        self._freed = asyncio.Condition()
        self._closed = False

    @property
    def live(self) -> int:
        return self._live

    @property
    def idle(self) -> int:
        return len(self._idle)

    async def fill(self) -> None:
        """Start sandboxes until the pool is full (the first failure is raised)."""
        while self._live < self.size:
            self._live += 1
            try:
                self._idle.append(await self._create())
            except BaseException:
                self._live -= 1
                raise

    async def acquire(self) -> T:
        async with self._freed:
            while True:
                if self._closed:
                    raise ExecutorError("the sandbox pool is closed")
                if self._idle:
                    return self._idle.pop()
                if self._live < self.size:
                    self._live += 1
                    break
                await self._freed.wait()
        try:
            return await self._create()
        except BaseException:
            async with self._freed:
                self._live -= 1
                self._freed.notify()
            raise

    async def release(self, item: T) -> None:
        async with self._freed:
            if self._closed:
                self._live -= 1
            else:
                self._idle.append(item)
                self._freed.notify()
                return
        await self._destroy(item)

    async def discard(self, item: T) -> None:
        """Destroy a sandbox that cannot be trusted to serve another run; a new one replaces it on demand."""
        try:
            await self._destroy(item)
        finally:
            async with self._freed:
                self._live -= 1
                self._freed.notify()

    async def close(self) -> None:
        async with self._freed:
            self._closed = True
            idle, self._idle = self._idle, []
            self._live -= len(idle)
            self._freed.notify_all()
        await asyncio.gather(*(self._destroy(item) for item in idle), return_exceptions=True)


def map_failure(exc: BaseException) -> ExecError | None:
    """The run's error for a microsandbox failure during a run, or None when it is the
    executor's own failure (to be raised as ExecutorError). Either way the VM is discarded."""
    if isinstance(exc, ms.ExecTimeoutError):
        return executor_error("TimeoutError", f"the run outlasted its wall time limit: {exc}")
    if isinstance(exc, (ms.SandboxNotRunningError, ms.SandboxNotFoundError, ms.ExecFailedError, ms.IoError)):
        return executor_error("SandboxKilled", f"the microVM stopped serving the run: {exc}")
    return None


class MicrosandboxExecutor:
    """Full CPython in a microVM per pooled sandbox."""

    capabilities = ExecutorCapabilities(isolation="microvm", full_cpython=True, sessions=False, tools=True,
                                        network=False, enforces=frozenset({"wall_seconds", "output_bytes"}))
    """A run's ``memory_bytes`` is not its own: a microVM's memory is set when it boots, from
    the executor's ``limits``."""

    def __init__(
        self,
        image: str | os.PathLike[str],
        *,
        workspace: str | os.PathLike[str] | None = None,
        pool_size: int = 2,
        cpus: int = 1,
        limits: ExecLimits | None = None,
        network: Any = None,
        egress: Egress | None = None,
        python: str = "python3",
        name_prefix: str = "ringzero",
        tool_threads: int = DEFAULT_TOOL_THREADS,
        show_tool_errors: bool = False,
    ) -> None:
        rootfs = Path(image)
        if not rootfs.is_dir():
            raise InvalidArgument(f"image {str(rootfs)!r} is not a root file system directory "
                                  "(build one with: mmdebstrap --variant=minbase --include=python3 bookworm DIR)")
        if not any((rootfs / p).exists() for p in ("usr/bin/python3", "bin/python3")):
            raise InvalidArgument(f"image {str(rootfs)!r} has no python3 (add --include=python3 to mmdebstrap)")
        self.image = str(rootfs.resolve())
        self.workspace = None if workspace is None else Path(workspace).resolve()
        self.cpus = cpus
        self.limits = merge_limits(limits, DEFAULT_LIMITS)
        if egress is not None and network is not None:
            raise InvalidArgument("give network (microsandbox's own) or egress (ringzero's policy), not both")
        self.network = network if network is not None else ms.Network.none()
        """The guests' network scope (``ms.Network.none()`` unless given)."""
        self.secrets: list[Any] = []
        """Secrets microsandbox adds at its egress (from ``egress``; their values stay on the host)."""
        if egress is not None:
            self.network, self.secrets = microvm_network(egress)
        self.python = python
        self.tool_pool = ToolPool(tool_threads)
        """Where the runs' sync host tools run: at most ``tool_threads`` at once."""
        self.show_tool_errors = show_tool_errors
        """Show the code every tool error's message, not only a ``ToolError``'s."""
        self._names = (f"{name_prefix}-{uuid.uuid4().hex[:8]}-{n}" for n in itertools.count())
        self._pool: SandboxPool[Any] = SandboxPool(self._create_sandbox, self._destroy_sandbox, pool_size)
        self._started = False

    async def _create_sandbox(self) -> Any:
        volumes = {} if self.workspace is None else {"/workspace": ms.Volume.bind(str(self.workspace))}
        try:
            return await ms.Sandbox.create(
                next(self._names), image=ms.Image.bind(self.image), memory=(self.limits.memory_bytes or 0) >> 20,
                cpus=self.cpus, network=self.network, secrets=self.secrets or None, volumes=volumes,
                workdir="/workspace" if volumes else None,
                ephemeral=True, replace=True,
            )
        except ms.MicrosandboxError as exc:
            raise ExecutorError(f"the microVM for image {self.image} did not start: {exc}") from exc

    async def _destroy_sandbox(self, sandbox: Any) -> None:
        with contextlib.suppress(ms.MicrosandboxError):  # already gone
            await sandbox.kill()

    async def start(self) -> None:
        """Check the host, then boot the pool. Raises ExecutorError saying why VMs cannot run."""
        if self._started:
            return
        reason = microvm_unavailable_reason()
        if reason is not None:
            raise ExecutorError(reason)
        if self.workspace is not None:
            owner_only_folder(self.workspace)
        await self._pool.fill()
        self._started = True

    async def run(
        self,
        code: str,
        *,
        inputs: Mapping[str, JSON] | None = None,
        tools: Mapping[str, Tool] | None = None,
        limits: ExecLimits | None = None,
    ) -> ExecResult:
        await self.start()
        limits = merge_limits(limits, self.limits)
        refused = check_value(dict(inputs or {}), "inputs", None)
        if refused is not None:
            raise InvalidArgument(refused)
        host = HostTools(tools or {}, limits, self.tool_pool, show_errors=self.show_tool_errors)
        made = host.calls
        started = time.perf_counter()
        sandbox = await self._pool.acquire()
        request = {"op": "run", "code": code, "inputs": dict(inputs or {}), "tools": sorted(host.tools),
                   "output_bytes": limits.output_bytes, "message_bytes": message_limit(limits)}
        try:
            value, stdout, error = await self._converse(sandbox, request, host, limits)
        except ms.MicrosandboxError as exc:
            await self._pool.discard(sandbox)
            mapped = map_failure(exc)
            if mapped is None:
                raise ExecutorError(f"microsandbox failed: {exc}") from exc
            return ExecResult(None, "", mapped, time.perf_counter() - started, tuple(made), host.ended())
        except BaseException:
            await self._pool.discard(sandbox)
            raise
        if error is not None and error.origin == "executor":
            await self._pool.discard(sandbox)
        else:
            await self._pool.release(sandbox)
        return ExecResult(value, stdout, error, time.perf_counter() - started, tuple(made), host.ended())

    async def _converse(self, sandbox: Any, request: dict[str, Any], host: HostTools,
                        limits: ExecLimits) -> tuple[JSON, str, ExecError | None]:
        handle = await sandbox.exec_stream(self.python, ["-c", RUNNER_SOURCE], stdin=ms.Stdin.pipe(),
                                           timeout=limits.wall_seconds)
        stdin = handle.take_stdin()
        if stdin is None:
            raise ExecutorError("microsandbox gave the run no stdin to talk to")
        await stdin.write(_runner.frame(request))
        frames = FrameBuffer(message_limit(limits))
        try:
            async for event in handle:
                kind = str(event.event_type)
                if kind == "stdout" and event.data:
                    for message in frames.feed(event.data):
                        if message.get("op") == "done":
                            return await finished(message, limits)
                        reply = await host.answer(message)
                        await stdin.write(_runner.frame(reply))
                elif kind in ("exited", "failed"):
                    break
        except ProtocolViolation as exc:
            return None, "", executor_error("SandboxProtocolError", f"the guest broke the protocol: {exc}")
        return None, "", executor_error("SandboxKilled", "the guest's python exited before it answered")

    async def aclose(self) -> None:
        self.tool_pool.close()
        await self._pool.close()
