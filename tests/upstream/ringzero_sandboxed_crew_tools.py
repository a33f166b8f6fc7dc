"""A pytest plugin for CrewAI's own tool and flow-persistence tests (its sdist, fetched at test
time by tests/test_upstream_tools.py).

With ``RINGZERO_UPSTREAM_MODE=sandboxed`` every CrewAI tool the tests make (with ``@tool``, or
by instantiating a ``BaseTool`` subclass) is handed to them wrapped by ringzero's ``sandboxed``:
its body runs in Monty. A tool ``sandboxed`` refuses is handed over as it was, the refusal
counted by cause (a refusal of no documented cause fails the run). Every flow persistence the
tests make, ``SQLiteFlowPersistence(path)``, is a ``KernelFlowPersistence`` over a
``SqliteCheckpointer`` at that path. Without the variable the tests run as they are: the
baseline the sandboxed run is compared with.
"""

from __future__ import annotations

import os
import threading
from typing import Any

import pytest
from refusals import Refusals

MODE = os.environ.get("RINGZERO_UPSTREAM_MODE", "as_is")

CAUSES = {
    "from an enclosing function": "a closure (uses names of an enclosing function)",
    "uses self": "a tool class whose _run uses self (the tool object is not in the sandbox)",
    "an _arun of its own": "a tool class with an async _arun of its own",
    "is async": "an async body",
    "a lambda": "a lambda (no source to ship)",
    "uses module-level": "uses a module-level name",
    "the source of": "a callable without def source",
    "could not find the definition": "a callable without def source",
    "fills with a host object": "takes a host object",
    "which is not JSON": "takes an argument that is not JSON (an enum, a datetime, a model)",
    "takes no self parameter": "a tool class whose _run is not a plain method",
}
"""What a refusal says, and the cause the README documents (see ``sandboxed``)."""

wrapped = 0
sandboxed_runs = 0
persistences = 0
refused = Refusals(CAUSES)
_making = threading.local()


def _substitute() -> None:
    from crewai.flow.persistence import sqlite as crew_sqlite
    from crewai.tools.base_tool import BaseTool
    from pydantic._internal._model_construction import ModelMetaclass

    import ringzero.adapters.crewai as crew_adapter
    from ringzero.adapters.crewai import KernelFlowPersistence, SandboxedTool, sandboxed
    from ringzero.checkpointers import SqliteCheckpointer
    from ringzero.core.contract.errors import InvalidArgument

    def wrap(tool: Any) -> Any:
        global wrapped
        try:
            copy = sandboxed(tool)
        except InvalidArgument as exc:
            refused.add(exc)
            return tool
        wrapped += 1
        return copy

    def make(cls: Any, *args: Any, **kwargs: Any) -> Any:
        """Every pydantic model is made as usual; a CrewAI tool made outside ringzero's own
        making of one is handed back sandboxed."""
        if not (isinstance(cls, type) and issubclass(cls, BaseTool)) or issubclass(cls, SandboxedTool) \
                or getattr(_making, "depth", 0):
            return type.__call__(cls, *args, **kwargs)
        _making.depth = 1
        try:
            made = type.__call__(cls, *args, **kwargs)
            return wrap(made)
        finally:
            _making.depth = 0

    ModelMetaclass.__call__ = make  # type: ignore[method-assign,assignment]

    run_execute = crew_adapter._execute

    def counted(*args: Any, **kwargs: Any) -> Any:
        global sandboxed_runs
        sandboxed_runs += 1
        return run_execute(*args, **kwargs)

    crew_adapter._execute = counted  # type: ignore[assignment]

    class SqliteFlowPersistenceOnTheKernel(KernelFlowPersistence):
        """``SQLiteFlowPersistence(db_path)`` as a KernelFlowPersistence over that SQLite file."""

        def __init__(self, db_path: str | None = None, **_: Any) -> None:
            global persistences
            persistences += 1
            super().__init__(SqliteCheckpointer(db_path or "flow_states.db", create_folder=True))

    crew_sqlite.SQLiteFlowPersistence = SqliteFlowPersistenceOnTheKernel  # type: ignore[misc,assignment]
    import crewai.flow.persistence as persistence_package

    persistence_package.SQLiteFlowPersistence = SqliteFlowPersistenceOnTheKernel  # type: ignore[misc,attr-defined]


if MODE == "sandboxed":
    _substitute()  # at plugin import: before any test module imports the tools or the persistence


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if MODE == "sandboxed":
        refused.report(terminalreporter, f"ringzero: {wrapped} tools sandboxed, {sandboxed_runs} calls ran in the "
                                         f"sandbox, {persistences} flow persistences on the kernel")


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    refused.fail_if_unknown(session)
