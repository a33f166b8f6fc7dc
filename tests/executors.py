"""The executors the shared suites run against: every one this host can run.

An executor the host cannot run is skipped with the reason its own probe gives.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from ringzero.core.contract.errors import ExecutorError
from ringzero.core.contract.protocols import Executor
from ringzero.testing import InProcessExecutor


def _monty() -> Executor:
    from ringzero.providers.executors import MontyExecutor

    return MontyExecutor(max_workers=2)


def _monty_quick_tools() -> Executor:
    """Monty with every tool taken as quick from its first call: each run is answered in Monty's
    own thread (the way quick sync tools take once they have been seen), not only from a tool's
    second run on."""
    from ringzero.providers.executors import MontyExecutor
    from ringzero.providers.executors.monty_run import ToolSpeeds

    class QuickUntilSeenSlow(ToolSpeeds):
        def __init__(self, park_after: float) -> None:
            super().__init__(park_after)
            self.seen_slow: list[object] = []

        def quick(self, tool: object) -> bool:
            return all(slow is not tool for slow in self.seen_slow)

        def took(self, tool: object, seconds: float) -> None:
            if seconds > self.park_after:
                self.seen_slow.append(tool)

    executor = MontyExecutor(max_workers=2)
    executor.tool_speeds = QuickUntilSeenSlow(executor.park_after)
    return executor


def _process() -> Executor:
    from ringzero.providers.executors import ProcessExecutor

    return ProcessExecutor(preload=())


def _microsandbox() -> Executor:
    import os

    from ringzero.providers.executors import MicrosandboxExecutor
    from ringzero.providers.executors.microsandbox import microvm_unavailable_reason

    reason = microvm_unavailable_reason()
    if reason is not None:
        pytest.skip(f"microVMs cannot boot on this host: {reason}")
    rootfs = os.environ.get("RINGZERO_MICROVM_ROOTFS")
    if not rootfs:
        pytest.skip("set RINGZERO_MICROVM_ROOTFS to a root file system built with "
                    "`mmdebstrap --variant=minbase --include=python3 bookworm DIR`")
    return MicrosandboxExecutor(rootfs, pool_size=1)


FACTORIES = {"in-process": InProcessExecutor, "monty": _monty, "monty-quick-tools": _monty_quick_tools,
             "process": _process, "microsandbox": _microsandbox}
CONFORMING = [name for name in FACTORIES if name != "in-process"]
"""The executors the conformance kit passes: ``InProcessExecutor`` (a test double) cannot stop a
thread at its timeout, which the kit asks of every executor."""
ISOLATING = ["monty", "process", "microsandbox"]  # the hostile-code suite runs only where isolation is promised
CALLING_TOOLS = [*ISOLATING, "monty-quick-tools"]
"""For the suites about the host side of tool calls: Monty both ways (driven by snapshots, and
answering quick tools in its own thread, as it does outside a kernel process)."""
FULL_CPYTHON = ["process", "microsandbox"]
"""The isolating executors that run full CPython (fork, files, ctypes, their channel to the host)."""
full_cpython_only = pytest.mark.parametrize("sandbox", FULL_CPYTHON, indirect=True)
"""A hostile-code test about what only full CPython can try: ``sandbox`` is each of these, not Monty."""


async def _started(name: str) -> Executor:
    try:
        instance = FACTORIES[name]()
        start = getattr(instance, "start", None)
        if start is not None:
            await start()
    except ExecutorError as exc:
        pytest.skip(f"the {name} executor cannot run on this host: {exc}")
    return instance


async def _each(request: pytest.FixtureRequest) -> AsyncIterator[Executor]:
    instance = await _started(request.param)
    yield instance
    await instance.aclose()


executor = pytest.fixture(params=list(FACTORIES), name="executor")(_each)
"""Each built-in executor this host can run."""
conforming = pytest.fixture(params=CONFORMING, name="executor")(_each)
"""``executor`` for the conformance kit (imported there, it takes the place of the other)."""


async def _isolating(request: pytest.FixtureRequest) -> AsyncIterator[Executor]:
    instance = await _started(request.param)
    assert instance.capabilities.isolation != "none"
    yield instance
    await instance.aclose()


sandbox = pytest.fixture(params=ISOLATING, name="sandbox")(_isolating)
"""Each isolating executor this host can run."""
sandbox_calling_tools = pytest.fixture(params=CALLING_TOOLS, name="sandbox")(_isolating)
"""``sandbox`` for a module about tool calls (imported there, it takes the place of the other):
Monty also answering quick tools in its own thread."""
