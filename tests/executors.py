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


FACTORIES = {"in-process": InProcessExecutor, "monty": _monty, "process": _process, "microsandbox": _microsandbox}
ISOLATING = ["monty", "process", "microsandbox"]  # the hostile-code suite runs only where isolation is promised
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


@pytest.fixture(params=list(FACTORIES))
async def executor(request: pytest.FixtureRequest) -> AsyncIterator[Executor]:
    instance = await _started(request.param)
    yield instance
    await instance.aclose()


@pytest.fixture(params=ISOLATING)
async def sandbox(request: pytest.FixtureRequest) -> AsyncIterator[Executor]:
    instance = await _started(request.param)
    assert instance.capabilities.isolation != "none"
    yield instance
    await instance.aclose()
