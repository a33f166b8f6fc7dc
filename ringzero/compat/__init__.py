"""Conformance kits: the tests a backend must pass, for other implementations to run.

One kit per protocol, each a base class to subclass with one fixture:

- ``ringzero.compat.checkpointer.CheckpointerConformance``: a ``checkpointer`` fixture.
- ``ringzero.compat.executor.ExecutorConformance``: an ``executor`` fixture.
- ``ringzero.compat.llm.LLMProviderConformance``: a ``provider_for(scenario)`` fixture; for a
  provider of OpenAI's or Anthropic's wire format, ``OpenAIWireConformance`` or
  ``AnthropicWireConformance`` with a ``provider_at(base_url)`` fixture: the kit's own servers
  (``ringzero.compat.llm_wire``, ``ringzero.compat.vendor_servers``) act the scenarios out.
- ``ringzero.compat.scheduler.SchedulerConformance``: a ``scheduler`` fixture (one run slot).

Each kit's first test is what ``Kernel(...)`` checks when it is built
(``ringzero.core.contract.protocols.backend_problems``). The site's page for backend
authors (``docs/backends.md``) gives each protocol's contract and a worked package of four backends.

This package is also a pytest plugin: ``pytest -p ringzero.compat tests/`` checks that what the
kits need is there (pytest-asyncio), and ends the run with a line per kit saying how many of its
tests passed and failed for each of your classes. Importing this package needs pytest.

The kits work under pytest-asyncio's default (strict) mode: an async fixture is declared with
``@pytest_asyncio.fixture`` (in ``asyncio_mode = "auto"`` a plain ``@pytest.fixture`` does too).
A kit test whose async fixture no plugin ran gets a line saying so.
"""

from __future__ import annotations

import warnings
from collections import Counter
from typing import Any

import pytest

KITS = ("CheckpointerConformance", "ExecutorConformance", "LLMProviderConformance", "SchedulerConformance")
_outcomes: Counter[tuple[str, str, str]] = Counter()


def _kit_of(item: pytest.Item) -> tuple[str, str] | None:
    """(kit, your class) for a test that comes from a kit, else None."""
    cls = getattr(item, "cls", None)
    if cls is None:
        return None
    for base in cls.__mro__[1:]:
        if base.__name__ in KITS and base.__module__.startswith("ringzero.compat."):
            return base.__name__, cls.__name__
    return None


_UNHANDLED_ASYNC_FIXTURE = "requested an async fixture"
"""The start of pytest's words for an async fixture that no plugin ran (strict mode)."""


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    if not config.pluginmanager.hasplugin("asyncio"):
        raise pytest.UsageError("the ringzero conformance kits need pytest-asyncio: pip install pytest-asyncio")
    if not config.getini("asyncio_default_fixture_loop_scope"):
        # pytest-asyncio warns, on every run of a project that leaves this unset, that the loop
        # of an async fixture will one day default to "function" scope. A kit's fixtures are
        # function-scoped, where that day changes nothing; the warning is left out of a run
        # that loads the kits (set the option to hear it about your own fixtures).
        warnings.filterwarnings("ignore", message='The configuration option "asyncio_default_fixture_loop_scope" '
                                "is unset", category=pytest.PytestDeprecationWarning)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    kit = getattr(report, "ringzero_kit", None)
    if kit is not None and (report.when == "call" or report.outcome != "passed"):
        _outcomes[kit[0], kit[1], report.outcome] += 1


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    report = yield
    report.ringzero_kit = kit = _kit_of(item)
    if kit is not None and report.failed and _UNHANDLED_ASYNC_FIXTURE in str(report.longrepr):
        report.sections.append(("ringzero", f"{kit[1]}: under pytest-asyncio's strict mode (its default) an async "
                                "fixture is declared with @pytest_asyncio.fixture, not @pytest.fixture"))
    return report


def pytest_terminal_summary(terminalreporter: Any) -> None:
    classes = sorted({(kit, cls) for kit, cls, _ in _outcomes})
    for kit, cls in classes:
        counts = ", ".join(f"{_outcomes[(kit, cls, outcome)]} {outcome}" for outcome in ("passed", "failed", "skipped")
                           if _outcomes[(kit, cls, outcome)])
        terminalreporter.write_line(f"ringzero {kit} on {cls}: {counts}")
