"""A pytest plugin for smolagents' own executor tests (the smolagents sdist, fetched at test time
by tests/test_smolagents_adapter.py): ``custom_executor``, the fixture through which smolagents'
``CommonDockerExecutorIntegration`` tests an executor that keeps its state between actions, is
ringzero's ``KernelExecutor``, once on Monty and once on the process sandbox. The class runs
unchanged, as ``TestKernelExecutor``: a subclass with nothing of its own, written into the
unpacked sdist's tests (``SUITE``) beside the package files its sdist leaves out (``PACKAGE``).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from ringzero.adapters.smolagents import KernelExecutor
from ringzero.providers.executors import MontyExecutor, ProcessExecutor

SUITE = ("tests/test_ringzero_kernel_executor.py", '''\
"""smolagents' tests of an executor that keeps its state between actions, on ringzero's."""

from .test_remote_executors import CommonDockerExecutorIntegration


class TestKernelExecutor(CommonDockerExecutorIntegration):
    """Every test of smolagents' class, as it is; ``custom_executor`` is ringzero's."""
''')
PACKAGE = {
    "tests/__init__.py": "",
    "tests/utils/__init__.py": "",
    "tests/utils/markers.py": "import os\n\nimport pytest\n\nrequire_run_all = pytest.mark.skipif("
                              "not os.getenv('RUN_ALL'), reason='needs a Docker daemon or a cloud account')\n",
}
"""What smolagents' tests import that its sdist does not ship (its repository's ``tests/utils``):
the marker that skips the tests of remote sandboxes, which this suite does not run."""


@pytest.fixture(params=["monty", "process"])
def custom_executor(request: pytest.FixtureRequest) -> Iterator[KernelExecutor]:
    executor = KernelExecutor(MontyExecutor() if request.param == "monty" else ProcessExecutor())
    yield executor
    executor.cleanup()  # the session, and the executor it ran on
