"""MontyExecutor: agent code in pydantic-monty, a Python-subset interpreter in worker processes.

Monty has no file system, network, subprocess or ctypes for the code to reach (a file
open is a PermissionError, an ``import socket`` a ModuleNotFoundError), and it enforces a
feed time limit, a heap limit and a recursion limit itself. Each run checks a fresh
session out of an ``AsyncMonty`` pool; the pool's request timeout backstops the limits
and replaces a worker that dies.

Host tools are called as plain functions. A run is driven snapshot by snapshot, each external
call answered by the host: async tools awaited there, sync ones in the tool pool. Code that
uses ``await`` is async-style, as in Python: there an async tool returns an awaitable, and calls
the code gathers run at the same time on the host. A tool call still pending after ``park_after``
seconds parks the run: its snapshot is dumped, the worker goes back to the pool, and the run
resumes on any worker once the tool returns, so a slow tool does not hold a worker.

Quick sync tools take a shorter way: where a run's code is sync-style, and every tool a plain
sync function that has answered within ``park_after`` and never past it (``ToolSpeeds``), the
code runs in one feed and Monty calls each tool from its own thread, where the host's boundary
checks and runs it: no snapshot and no thread hop per call (100 calls cost 1.2 to 1.4 times
raw pydantic-monty's ``feed_run``: the boundary's checks, 10 to 30 µs a call, are what is
left). In a kernel process whose store takes records from any thread, each call's intent and
result are journaled from there too. Such a call holds its worker as long as it runs (a call
driven by snapshots holds it up to ``park_after``); one that runs past ``park_after`` makes its
tool slow again, and its later runs park. It also holds
one of pydantic-monty's runtime threads, so at most one fewer such run than there are CPUs goes
at once (``monty_run._QuickRuns``), and a tool that turns slow never stops every other run.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import errno
import functools
import json
import os
import shutil
import tempfile
import time
from collections.abc import Mapping

from ringzero.core.contract.errors import Closed, ExecutorError, InvalidArgument, MissingExtra
from ringzero.core.contract.protocols import ENFORCED, ExecutorCapabilities, Tool
from ringzero.core.contract.types import JSON, ExecLimits, ExecResult
from ringzero.core.support.tool_pool import DEFAULT_TOOL_THREADS, ToolPool
from ringzero.providers.executors import _monty_wall
from ringzero.providers.executors.boundary import (
    check_value,
    merge_limits,
)
from ringzero.providers.executors.monty_run import MontyRun, ToolSpeeds

try:
    import pydantic_monty as pm
except ImportError as exc:  # pragma: no cover - a core dependency; only a broken install lands here
    raise MissingExtra("MontyExecutor", "all") from exc

__all__ = ["MontyExecutor", "MontySession"]

# The heap limit also bounds how long the host's event loop can stall: pydantic-monty turns the
# code's final value or exception into Python objects holding the GIL, on whichever thread asks
# (about 0.15 ms per 1,000 dict entries, 0.7 ms per MB of text, here). At 96 MiB the largest value
# the code can build costs under 40 ms; at 256 MiB, up to 150 ms (SECURITY.md).
DEFAULT_LIMITS = ExecLimits(wall_seconds=10.0, memory_bytes=96 * 1024 * 1024, output_bytes=1024 * 1024,
                            tool_bytes=1024 * 1024, run_tool_bytes=32 * 1024 * 1024)
_UNSUPPORTED_HINT = (
    " (Monty runs a subset of Python; for this, use ringzero.providers.executors.ProcessExecutor, "
    "which runs full CPython with any installed package)"
)


_TEXT_FILE_BUSY = os.strerror(errno.ETXTBSY)
"""How a worker's start fails while its launcher, just written, is still open for writing in a
process another thread forked meanwhile and that has not reached its exec yet: it passes."""
_SPAWN_ATTEMPTS = 5


class MontyExecutor:
    """The default executor: sub-millisecond runs of untrusted code, isolated at interpreter level."""

    wall_controls = _monty_wall.WALL_CONTROLS
    """The controls of each worker's second wall (``missing_controls`` names those this host lacks)."""
    capabilities = ExecutorCapabilities(isolation="interpreter", full_cpython=False, sessions=True, tools=True,
                                        network=False, enforces=ENFORCED)

    def __init__(
        self,
        *,
        max_workers: int = 4,
        limits: ExecLimits | None = None,
        park_after: float = 0.05,
        request_grace: float = 5.0,
        tool_threads: int = DEFAULT_TOOL_THREADS,
        show_tool_errors: bool = False,
        confine_workers: bool = True,
    ) -> None:
        if not isinstance(max_workers, int) or max_workers < 1:
            raise InvalidArgument(f"max_workers must be a positive integer, got {max_workers!r}")
        if not isinstance(tool_threads, int) or isinstance(tool_threads, bool) or tool_threads < 1:
            raise InvalidArgument(f"tool_threads must be a positive integer, got {tool_threads!r}")
        self.limits = merge_limits(limits, DEFAULT_LIMITS)
        self.tool_pool = ToolPool(tool_threads)
        """Where the runs' sync host tools run: at most ``tool_threads`` at once."""
        self.show_tool_errors = show_tool_errors
        """Show the code every tool error's message, not only a ``ToolError``'s."""
        self.converting = ToolPool(2)  # final values and errors are made JSON here, off the event loop
        self.confine_workers = confine_workers
        """Start each worker behind a second wall (``_monty_wall``): its own network namespace,
        nobody, Landlock, seccomp, an empty environment, where the host allows each."""
        self.missing_controls: dict[str, str] = {}
        """The second wall's controls this host could not apply to the workers, with why
        (known once the workers started)."""
        self._launcher_dir: str | None = None
        self.park_after = park_after
        self._max_workers = max_workers
        self._grace = request_grace
        self._pool: pm.AsyncMonty | None = None
        self._opening = asyncio.Lock()
        self.tool_speeds = ToolSpeeds(park_after)
        """Which sync tools answered within ``park_after``: runs calling only those are answered
        in Monty's own thread."""

    async def _get_pool(self) -> pm.AsyncMonty:
        async with self._opening:
            if self._pool is None:
                wall = self.limits.wall_seconds or 0.0
                binary = await self._worker_binary()
                for attempt in range(_SPAWN_ATTEMPTS):
                    pool = pm.AsyncMonty(binary_path=binary, min_processes=1, max_processes=self._max_workers,
                                         request_timeout=wall + self._grace)
                    try:
                        await pool.__aenter__()
                        break
                    except Exception as exc:
                        if _TEXT_FILE_BUSY in str(exc) and attempt + 1 < _SPAWN_ATTEMPTS:
                            await asyncio.sleep(0.01 * (attempt + 1))
                            continue
                        raise ExecutorError(f"could not start Monty workers: {exc}") from exc
                self._pool = pool
                _hand_over_the_gil_at_exit()
        return self._pool

    async def _worker_binary(self) -> str:
        """What the pool starts as a worker: the ``monty`` binary, behind the second wall unless
        ``confine_workers=False``."""
        binary = _monty_binary()
        if not self.confine_workers:
            return binary
        report = await asyncio.to_thread(_monty_wall.probe, binary)
        self.missing_controls = {name: why for name, why in report.items() if why is not None}
        if self._launcher_dir is None:
            self._launcher_dir = tempfile.mkdtemp(prefix="ringzero-monty-")  # 0700, the host's own
        launcher = os.path.join(self._launcher_dir, "monty-walled")
        held = [name for name, why in report.items() if why is None]
        with open(launcher, "w") as script:  # noqa: ASYNC230 - a few hundred bytes, once per pool
            script.write(_monty_wall.launcher_script(binary, held, self._wall_report()))
        os.chmod(launcher, 0o700)
        return launcher

    def _wall_report(self) -> str:
        assert self._launcher_dir is not None
        return os.path.join(self._launcher_dir, "wall-failed")

    def wall_failure(self) -> ExecutorError | None:
        """Where a worker would not start because a control of its second wall that held when
        probed failed as it started (it fails closed): the error saying which, also noted in
        ``missing_controls``; else None."""
        if self._launcher_dir is None:
            return None
        try:
            with open(self._wall_report()) as report:
                lines = report.read().splitlines()
        except OSError:
            return None
        failed: dict[str, str] = {}
        for line in lines:
            with contextlib.suppress(ValueError):
                failed.update(json.loads(line))
        if not failed:
            return None
        self.missing_controls.update(failed)
        reasons = "; ".join(f"{name}: {why}" for name, why in failed.items())
        return ExecutorError(f"a Monty worker did not start: its second wall could not apply {', '.join(failed)} "
                             f"({reasons}), which held when the executor started")

    def resource_limits(self, limits: ExecLimits) -> pm.ResourceLimits:
        """``limits`` as pydantic-monty's own resource limits for one run."""
        own: pm.ResourceLimits = {"max_feed_duration_secs": limits.wall_seconds,
                                  "max_total_sleep_secs": limits.wall_seconds, "max_memory": limits.memory_bytes}
        return own

    async def run(
        self,
        code: str,
        *,
        inputs: Mapping[str, JSON] | None = None,
        tools: Mapping[str, Tool] | None = None,
        limits: ExecLimits | None = None,
    ) -> ExecResult:
        merged = merge_limits(limits, self.limits)
        refused = check_value(dict(inputs or {}), "inputs", None)
        if refused is not None:
            raise InvalidArgument(refused)
        pool = await self._get_pool()
        run = MontyRun(self, pool, merged, tools or {})
        return await run.execute(code, dict(inputs or {}), session=None)

    def session(self, limits: ExecLimits | None = None) -> MontySession:
        """A session whose variables persist between runs (it holds one worker while open):
        ``async with executor.session() as s: await s.run(...)``. ``limits``: each run's, where
        the run gives none, and the heap's (its memory), set when it opens."""
        return MontySession(self, limits)

    async def aclose(self) -> None:
        self.tool_pool.close()
        self.converting.close()
        if self._pool is not None:
            pool, self._pool = self._pool, None
            await pool.__aexit__(None, None, None)
            await _let_monty_threads_finish()
        if self._launcher_dir is not None:
            launcher_dir, self._launcher_dir = self._launcher_dir, None
            shutil.rmtree(launcher_dir, ignore_errors=True)


class MontySession:
    """Runs that share variables: ``async with executor.session() as s: await s.run(...)``."""

    def __init__(self, executor: MontyExecutor, limits: ExecLimits | None = None) -> None:
        self._executor = executor
        self.limits = merge_limits(limits, executor.limits)
        self._pool: pm.AsyncMonty | None = None
        self._session: pm.AsyncMontySession | None = None

    async def __aenter__(self) -> MontySession:
        await self._open()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def _open(self) -> None:
        if self._pool is None:
            self._pool = await self._executor._get_pool()
        self._session = self._pool.checkout(limits=self._executor.resource_limits(self.limits))
        await self._session.__aenter__()

    async def run(self, code: str, *, inputs: Mapping[str, JSON] | None = None,
                  tools: Mapping[str, Tool] | None = None, limits: ExecLimits | None = None) -> ExecResult:
        """The next step: what earlier steps defined (names, functions, classes, imports) is
        there. ``limits`` as ``MontyExecutor.run``'s (the heap's are the session's, set when it
        opened)."""
        if self._session is None or self._pool is None:
            raise Closed("this Monty session is not open: use it inside `async with executor.session() as s:`")
        refused = check_value(dict(inputs or {}), "inputs", None)
        if refused is not None:
            raise InvalidArgument(refused)
        run = MontyRun(self._executor, self._pool, merge_limits(limits, self.limits), tools or {})
        result = await run.execute(code, dict(inputs or {}), session=self._session)
        if run.session_broken:  # a limit hit leaves the heap in no known state: start afresh
            await self.aclose()
            await self._open()
        return result

    async def aclose(self) -> None:
        if self._session is not None:
            session, self._session = self._session, None
            await session.__aexit__(None, None, None)


def _monty_binary() -> str:
    """Where pydantic-monty finds its worker binary (``MONTY_BIN``, the environment's scripts,
    ``PATH``), by its own rules."""
    try:
        from pydantic_monty._binary import find_monty_binary
    except ImportError:  # a pydantic-monty that moved it: the same first rules
        return os.environ.get("MONTY_BIN") or shutil.which("monty") or "monty"
    return find_monty_binary()


@functools.cache
def _hand_over_the_gil_at_exit() -> None:
    """At interpreter exit (before finalization starts), do what ``aclose()`` does for pools
    left open: let a pydantic-monty thread that is mid-callback return (see below)."""
    atexit.register(time.sleep, 0.01)


async def _let_monty_threads_finish() -> None:
    """Give pydantic-monty's worker threads the GIL once, so none is left mid-callback.

    pydantic-monty completes each awaitable from a tokio thread through
    ``loop.call_soon_threadsafe``, which releases the GIL inside its self-pipe write. The loop
    can run the queued callback before that write returns; if the program then exits, the
    thread wakes into a finalizing interpreter and the process aborts (exit 134). A short
    blocking wait in the loop's selector hands the GIL over so the thread can return first."""
    await asyncio.sleep(0.01)
