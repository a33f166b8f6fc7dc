"""The executors the shared suites run against: every one this host can run."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from ringzero.core.protocols import Executor
from ringzero.testing import InProcessExecutor


def _monty() -> Executor:
    from ringzero.providers.executors import MontyExecutor

    return MontyExecutor(max_workers=2)


FACTORIES = {"in-process": InProcessExecutor, "monty": _monty}
ISOLATING = ["monty"]  # the hostile-code suite runs only where isolation is promised


@pytest.fixture(params=list(FACTORIES))
async def executor(request: pytest.FixtureRequest) -> AsyncIterator[Executor]:
    instance = FACTORIES[request.param]()
    yield instance
    await instance.aclose()


@pytest.fixture(params=ISOLATING)
async def sandbox(request: pytest.FixtureRequest) -> AsyncIterator[Executor]:
    instance = FACTORIES[request.param]()
    assert instance.capabilities.isolation != "none"
    yield instance
    await instance.aclose()
