"""langchain-core's and CrewAI's own tool tests judge ``sandboxed`` as a drop-in.

Its tool tests (``tests/unit_tests/test_tools.py`` and ``test_tools_postponed_annotations.py``
of the sdist of the installed version, fetched at test time by ``tests/upstream/sdist.py``) run
unchanged in a pytest subprocess, with every tool they make wrapped by ``sandboxed``
(``tests/upstream/ringzero_sandboxed_tools.py``): what it refuses runs as it was, counted by a
documented cause; three tests that a sandbox cannot pass by its nature (a sync call on a thread
that runs an event loop waits for the sandbox) are strict xfails.
"""

from __future__ import annotations

import concurrent.futures
import re

import pytest

from tests.upstream.sdist import run_suite, unpacked_sdist

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

LANGCHAIN_TOOL_TESTS = ["tests/unit_tests/test_tools.py", "tests/unit_tests/test_tools_postponed_annotations.py"]


def test_langchain_core_tool_tests_pass_with_every_tool_sandboxed() -> None:
    result = run_suite(unpacked_sdist("langchain-core"), LANGCHAIN_TOOL_TESTS, "ringzero_sandboxed_tools")
    print(f"langchain-core tool tests, every tool sandboxed: {result.summary}")
    assert result.returncode == 0, result.output[-6000:]
    assert result.count("passed") > 200 and result.count("failed") == 0 and result.count("error") == 0, \
        result.summary
    assert result.count("xfailed") == 3, result.summary  # the listed sync-call-inside-a-loop tests
    found = re.search(r"ringzero: (\d+) tools sandboxed, (\d+) calls ran in the sandbox; refused (\d+) \((.*)\)",
                      result.output)
    assert found is not None, result.output[-3000:]
    tools, runs = int(found.group(1)), int(found.group(2))
    print(f"  {tools} tools sandboxed, {runs} calls in the sandbox; refused {found.group(3)}: {found.group(4)}")
    assert tools > 80 and runs > 40, "the substitution happened and the tests' calls ran in the sandbox"
    assert "a refusal of no documented cause" not in result.output, result.output[-3000:]


CREWAI_TESTS = [
    "tests/tools/test_base_tool.py", "tests/tools/test_structured_tool.py", "tests/tools/test_async_tools.py",
    "tests/tools/test_tool_usage.py", "tests/tools/test_tool_usage_limit.py", "tests/tools/test_tool_failure.py",
    "tests/tools/test_tool_usage_error_attribution.py", "tests/test_tool_cache_default.py",
    "tests/test_flow_tool_action_failure_policy.py", "tests/test_flow_tool_action_usage.py",
    "tests/test_flow_persistence.py", "tests/test_flow_persistence_factory.py",
]
CREWAI_INI = """[pytest]
markers =
    vcr: a test that replays recorded HTTP (CrewAI's cassettes)
asyncio_mode = auto
asyncio_default_fixture_loop_scope = function
filterwarnings = ignore
"""
"""CrewAI keeps its pytest settings at its monorepo's top, outside the sdist: these are them, as
far as the tests here need (its markers, pytest-asyncio's auto mode)."""


def test_crewai_tool_and_flow_persistence_tests_pass_with_every_tool_sandboxed() -> None:
    """CrewAI's tests run twice: as they are (the baseline: a few need CrewAI's recorded HTTP
    cassettes and keys, which its sdist's configuration does not carry) and with every tool
    sandboxed and every flow persistence on the kernel; the second fails nothing the first passes."""
    root = unpacked_sdist("crewai")
    env = {"CREWAI_DISABLE_TELEMETRY": "true", "OTEL_SDK_DISABLED": "true"}
    with concurrent.futures.ThreadPoolExecutor(2) as both:  # side by side: a pytest on each core
        runs = [both.submit(run_suite, root, CREWAI_TESTS, "ringzero_sandboxed_crew_tools", ini=CREWAI_INI,
                            env={**env, "RINGZERO_UPSTREAM_MODE": mode}) for mode in ("as_is", "sandboxed")]
        baseline, result = (run.result() for run in runs)
    print(f"crewai tests as they are: {baseline.summary}; every tool sandboxed: {result.summary}")
    assert baseline.count("passed") > 200, baseline.output[-3000:]
    newly_failed = result.failed_tests() - baseline.failed_tests()
    assert not newly_failed, result.output[-6000:]
    assert result.count("passed") == baseline.count("passed"), (baseline.summary, result.summary)
    found = re.search(r"ringzero: (\d+) tools sandboxed, (\d+) calls ran in the sandbox, (\d+) flow persistences "
                      r"on the kernel; refused (\d+) \((.*)\)", result.output)
    assert found is not None, result.output[-3000:]
    tools, runs, persistences = int(found.group(1)), int(found.group(2)), int(found.group(3))
    print(f"  {tools} tools sandboxed, {runs} calls in the sandbox, {persistences} flow persistences on the "
          f"kernel; refused {found.group(4)}: {found.group(5)}")
    assert tools > 30 and runs > 30 and persistences > 5, "the substitution happened and the calls ran sandboxed"
    assert "a refusal of no documented cause" not in result.output, result.output[-3000:]
