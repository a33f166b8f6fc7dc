"""Shared fixtures: kernels on each built-in checkpointer, and a provider with a real rate limit."""

from __future__ import annotations

import os

# CrewAI's own switches, read when it is imported: no telemetry, no network attempt (its issue
# notes that without them exit stalls about 10 s trying to reach its telemetry host).
os.environ.setdefault("CREWAI_DISABLE_TELEMETRY", "true")
os.environ.setdefault("OTEL_SDK_DISABLED", "true")
# Ray's switch for a cluster on one machine, read when it is imported: every node, actor and the
# driver use 127.0.0.1 instead of this host's outside address (the tests' clusters stay on loopback;
# the subprocesses the tests start, such as `ringzero demo --ray`, inherit it).
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")

import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from ringzero import Kernel
from ringzero.checkpointers import MemoryCheckpointer, SqliteCheckpointer
from ringzero.core.contract.errors import RateLimited
from ringzero.core.contract.protocols import Checkpointer
from ringzero.core.contract.types import LLMRequest
from ringzero.testing import ScriptedProvider
from tests.egress_servers import api, ca, plain  # noqa: F401 - the egress tests' CA and servers
from tests.executors import executor, sandbox  # noqa: F401 - fixtures for the executor suites
from tests.postgres import fresh_database, postgres_dsn  # noqa: F401 - the PostgreSQL server fixture


@pytest.fixture(autouse=True)
def _release_workspaces(request: pytest.FixtureRequest) -> Iterator[None]:
    """A process executor's workspace stays mounted after the executor closes (its host reads it
    there): a test that made one under its tmp_path unmounts it when it ends."""
    folder = request.getfixturevalue("tmp_path") if "tmp_path" in request.fixturenames else None
    yield
    if folder is not None:  # asked for at set-up, so that tmp_path is torn down after this
        from ringzero.providers.executors import workspaces

        workspaces.release_under(str(folder), forget_images=True)


@pytest.fixture(params=["memory", "sqlite", "postgres"])
async def checkpointer(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Checkpointer]:
    store: Checkpointer
    if request.param == "memory":
        store = MemoryCheckpointer()
    elif request.param == "sqlite":
        store = SqliteCheckpointer(tmp_path / "k.db")
    else:
        from ringzero.checkpointers import PostgresCheckpointer

        store = PostgresCheckpointer(fresh_database(request.getfixturevalue("postgres_dsn")))
    yield store
    await store.aclose()


@pytest.fixture
def open_again(checkpointer: Checkpointer) -> Any:
    """Another instance over the same storage as ``checkpointer``, as a second kernel opens it
    (the checkpointer kit races claims across instances)."""
    from ringzero.checkpointers import PostgresCheckpointer

    if isinstance(checkpointer, SqliteCheckpointer):
        return lambda: SqliteCheckpointer(checkpointer.path)
    if isinstance(checkpointer, PostgresCheckpointer):
        return lambda: PostgresCheckpointer(checkpointer.dsn)
    raise AssertionError(f"{type(checkpointer).__name__} is one store per instance")


@pytest.fixture
async def kernel(checkpointer: Checkpointer) -> AsyncIterator[Kernel]:
    async with Kernel(checkpointer=checkpointer, llm=ScriptedProvider(lambda r: "ok")) as k:
        yield k


class RateLimitedServer:
    """A provider that, like a real API, answers 429 with Retry-After past ``per_second``.

    Its window is a token bucket with a burst of one request, kept on the server's side.
    """

    def __init__(self, per_second: float) -> None:
        self.per_second = per_second
        self.level = 1.0
        self.stamp = time.monotonic()
        self.accepted = 0
        self.refused = 0
        self.provider = ScriptedProvider(self._answer)

    def _answer(self, request: LLMRequest) -> str:
        now = time.monotonic()
        self.level = min(1.0, self.level + (now - self.stamp) * self.per_second)
        self.stamp = now
        if self.level < 1.0:
            self.refused += 1
            raise RateLimited("429 Too Many Requests", retry_after=(1.0 - self.level) / self.per_second)
        self.level -= 1.0
        self.accepted += 1
        return f"answer to {request.messages[-1].content}"
