"""A pytest plugin for LangGraph's own core tests (the langgraph sdist, fetched at test time by
tests/test_upstream_langgraph.py): ``KernelSaver(SqliteCheckpointer(...))`` is the only
checkpointer. The suite's two checkpointer fixtures (``sync_checkpointer``, ``async_checkpointer``
in its tests/conftest.py, each parametrized over LangGraph's own savers) are replaced, before
pytest reads that conftest, by fixtures with one parameter each: a KernelSaver over a SQLite file
of the test's own. Nothing else in the suite is changed.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from ringzero.adapters.langgraph import KernelSaver

_tests_with_saver = 0


@pytest.fixture(params=["kernel_saver_sqlite"])
def sync_checkpointer(tmp_path: Path) -> Iterator[KernelSaver]:
    global _tests_with_saver
    _tests_with_saver += 1
    with KernelSaver.from_conn_string(str(tmp_path / "langgraph.db")) as saver:
        yield saver


@pytest.fixture(params=["kernel_saver_sqlite"])
async def async_checkpointer(tmp_path: Path) -> AsyncIterator[KernelSaver]:
    global _tests_with_saver
    _tests_with_saver += 1
    async with KernelSaver.from_conn_string(str(tmp_path / "langgraph.db")) as saver:
        yield saver


@pytest.hookimpl(tryfirst=True)
def pytest_plugin_registered(plugin: Any) -> None:
    """Swap the fixtures in LangGraph's tests/conftest.py before pytest collects its fixtures."""
    if getattr(plugin, "__name__", "") == "tests.conftest" and hasattr(plugin, "sync_checkpointer"):
        plugin.sync_checkpointer = sync_checkpointer
        plugin.async_checkpointer = async_checkpointer
        plugin.RINGZERO_SWAPPED = True


def pytest_collection_finish(session: pytest.Session) -> None:
    import sys

    conftest = sys.modules.get("tests.conftest")
    if conftest is None or not getattr(conftest, "RINGZERO_SWAPPED", False):
        raise pytest.UsageError("ringzero_saver: LangGraph's tests/conftest.py was not found or its checkpointer "
                                "fixtures were not swapped; the suite would not test KernelSaver")


def pytest_terminal_summary(terminalreporter: Any) -> None:
    terminalreporter.write_line(f"ringzero: {_tests_with_saver} tests ran on KernelSaver(SqliteCheckpointer)")
