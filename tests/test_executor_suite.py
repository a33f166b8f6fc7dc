"""Every built-in executor this host can run passes the Executor conformance kit."""

from __future__ import annotations

from ringzero.compat.executor import ExecutorConformance
from tests.executors import conforming  # noqa: F401  (the kit's executor fixture)


class TestBuiltinExecutors(ExecutorConformance):
    """Runs the kit with the ``conforming`` fixture from tests/executors.py: one instance of each
    built-in executor, skipped (with its probe's reason) where the host cannot run it."""
