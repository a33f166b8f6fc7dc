"""Backends written outside ringzero (``tests/outside``, installed as a third party installs a
package), judged by what the kernel promises: an executor that calls the tools it is handed
itself, and a store registered under its own URL scheme."""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from ringzero import InvalidArgument, Kernel
from ringzero.compat.checkpointer import CheckpointerConformance
from ringzero.compat.executor import ExecutorConformance
from ringzero.compat.llm import OpenAIWireConformance
from ringzero.compat.scheduler import SchedulerConformance
from ringzero.core.contract.protocols import Checkpointer, Executor, LLMProvider, Scheduler
from tests.hosts import kill_host_when
from tests.outside_install import REPO, environment, installed  # noqa: F401  (the site fixture)
from tests.outside_programs import charge


def cli(site: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ringzero.cli", *args], cwd=REPO, env=environment(site, **env),
                          capture_output=True, text=True, timeout=120)


def started(log: Path) -> list[tuple[int, str]]:
    """The payments the log says started, in order: (n, idempotency key)."""
    found = []
    for line in log.read_text().splitlines() if log.exists() else []:
        word, n, *key = line.split()
        if word == "start":
            found.append((int(n), key[0] if key else ""))
    return found


def test_kill_9_inside_the_third_of_five_keyed_tool_calls_then_resume_runs_each_once(site: Path,
                                                                                     tmp_path: Path) -> None:
    """The executor calls its tools itself; the kernel journals each call anyway: after the
    host is killed inside the third call and ``ringzero resume`` runs, calls one, two, four and
    five ran once each, the third at most once more, under the same key."""
    db, log = f"outside://{tmp_path / 'state.db'}", tmp_path / "charges.log"
    host = subprocess.Popen([sys.executable, "-m", "tests.outside_host", db], cwd=REPO, stdout=subprocess.PIPE,
                            env=environment(site, OUTSIDE_LOG=str(log)))
    assert kill_host_when(host, lambda: 2 in [n for n, _ in started(log)]) == -signal.SIGKILL
    assert [n for n, _ in started(log)] == [0, 1, 2], "the host was killed inside the third call"

    resumed = cli(site, "resume", "--db", db, "--kernel", "tests.outside_programs:make_kernel",
                  OUTSIDE_LOG=str(log))
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    report = " ".join(resumed.stdout.split())
    assert "3 tool call(s) from code recorded; 1 call(s) in doubt: 1 run again" in report, report

    calls = started(log)
    assert [n for n, _ in calls] == [0, 1, 2, 2, 3, 4], calls
    keys = dict(calls)
    assert calls[2] == calls[3], "the call in doubt ran again under another key"
    assert len(set(keys.values())) == 5 and all(keys.values()), keys

    for command in (["ps"], ["top", "--once"], ["show", "1"]):  # every command reaches the registered store
        shown = cli(site, command[0], "--db", db, *command[1:])
        assert shown.returncode == 0 and "payments" in shown.stdout and "exited" in shown.stdout, shown.stdout


def test_kill_9_inside_an_unkeyed_call_then_resume_leaves_it_in_doubt_not_run_again(site: Path,
                                                                                   tmp_path: Path) -> None:
    """A tool with no key and not declared idempotent, killed inside: on resume the program
    gets ToolInDoubt for it, and neither it nor any later call runs."""
    db, log = f"outside://{tmp_path / 'state.db'}", tmp_path / "charges.log"
    host = subprocess.Popen([sys.executable, "-m", "tests.outside_host", db, "unkeyed"], cwd=REPO,
                            stdout=subprocess.PIPE, env=environment(site, OUTSIDE_LOG=str(log)))
    assert kill_host_when(host, lambda: 2 in [n for n, _ in started(log)]) == -signal.SIGKILL
    resumed = cli(site, "resume", "--db", db, "--kernel", "tests.outside_programs:make_kernel",
                  OUTSIDE_LOG=str(log))
    report = " ".join(resumed.stdout.split())
    assert "1 call(s) in doubt: 0 run again (idempotent, or under their idempotency key), 1 left to the program " \
        "(raised as ToolInDoubt" in report, report
    assert [n for n, _ in started(log)] == [0, 1, 2], started(log)


async def test_code_sets_no_parameter_the_host_keeps_through_the_outside_executor(site: Path, tmp_path: Path,
                                                                                  monkeypatch: pytest.MonkeyPatch
                                                                                  ) -> None:
    """As with Monty: the code may not pass ``idempotency_key`` (a parameter with a default is
    the host's), however the executor calls the tool."""
    from ringzero_outside.executor import PipeExecutor

    from ringzero.providers.executors.monty import MontyExecutor

    log = tmp_path / "charges.log"
    monkeypatch.setenv("OUTSIDE_LOG", str(log))
    code = ("out = []\nfor call in (lambda: charge(7, idempotency_key='mine'), lambda: charge(7, 'mine')):\n"
            "    try:\n        call()\n        out.append('ran')\n    except TypeError:\n"
            "        out.append('refused')\nout")

    async def program(ctx: Any) -> Any:
        return (await ctx.exec(code, tools={"charge": charge})).value

    outcomes = []
    for executor in (PipeExecutor(), MontyExecutor()):
        async with Kernel(checkpointer=":memory:", executor=executor, monitor_interval=None) as kernel:
            outcomes.append(await (await kernel.spawn(program)).wait())
        await executor.aclose()
    assert outcomes == [["refused", "refused"]] * 2
    assert started(log) == [], "a call that set the host's parameter ran"


async def test_a_store_named_by_its_registered_scheme_is_the_package_s(site: Path, tmp_path: Path) -> None:
    from ringzero_outside.store import OutsideStore

    kernel = Kernel(checkpointer=f"outside://{tmp_path / 'state.db'}", monitor_interval=None)
    async with kernel:
        assert isinstance(kernel.checkpointer, OutsideStore)

        async def hello(ctx: Any) -> str:
            return "hi"

        assert await (await kernel.spawn(hello)).wait() == "hi"
    assert (tmp_path / "state.db").exists()

    from langgraph.checkpoint.base import empty_checkpoint

    from ringzero.adapters.langgraph import KernelSaver

    async with KernelSaver.from_conn_string(f"outside://{tmp_path / 'graphs.db'}") as saver:
        assert isinstance(saver.checkpointer, OutsideStore)
        config = {"configurable": {"thread_id": "t", "checkpoint_ns": ""}}
        saved = await saver.aput(config, empty_checkpoint(), {"source": "input", "step": -1}, {})  # type: ignore[arg-type]
        assert (await saver.aget_tuple(saved)) is not None


def test_an_unknown_scheme_is_refused_in_one_line_naming_the_installed_ones(site: Path) -> None:
    refused = cli(site, "ps", "--db", "redis://127.0.0.1:6390/0")
    assert refused.returncode == 1
    assert refused.stderr.strip().splitlines() == [
        "error: no checkpointer is installed for redis://; the schemes installed are sqlite://, postgresql://, "
        "postgres://, outside:// (a package adds one under the entry point group 'ringzero.checkpointers')"], \
        refused.stderr


async def test_kernels_sharing_a_store_that_cannot_claim_pids_are_refused_at_start(site: Path,
                                                                                  tmp_path: Path) -> None:
    """Two kernels on one store that says it may be shared but has no ``claim`` would hand out
    the same pids: neither is built."""
    from ringzero_outside.store import SharedWithoutClaims

    for _ in range(2):
        with pytest.raises(InvalidArgument, match=r"declares capabilities.multi_process .* but not "
                                                  r"capabilities.claims: kernels sharing it would hand out the same "
                                                  r"pids"):
            Kernel(checkpointer=SharedWithoutClaims(str(tmp_path / "state.db")), monitor_interval=None)


class TestPipeExecutor(ExecutorConformance):
    """The outside executor passes the Executor kit (the tools it calls are the kernel's)."""

    @pytest_asyncio.fixture
    async def executor(self, site: Path) -> AsyncIterator[Executor]:
        from ringzero_outside.executor import PipeExecutor

        instance = PipeExecutor()
        yield instance
        await instance.aclose()




class TestOutsideStore(CheckpointerConformance):
    @pytest_asyncio.fixture
    async def checkpointer(self, site: Path, tmp_path: Path) -> AsyncIterator[Checkpointer]:
        from ringzero_outside.store import OutsideStore

        store = OutsideStore(str(tmp_path / "kit.db"))
        yield store
        await store.aclose()

    @pytest.fixture
    def open_again(self, tmp_path: Path) -> Callable[[], Checkpointer]:
        from ringzero_outside.store import OutsideStore

        return lambda: OutsideStore(str(tmp_path / "kit.db"))


class TestChatCompletions(OpenAIWireConformance):
    """The outside provider, judged on the kit's own OpenAI-format server."""

    @pytest.fixture
    def provider_at(self, site: Path) -> Callable[[str], LLMProvider]:
        from ringzero_outside.provider import ChatCompletions

        return lambda url: ChatCompletions(url, timeout=0.3)


class TestHeapScheduler(SchedulerConformance):
    @pytest.fixture
    def scheduler(self, site: Path) -> Scheduler:
        from ringzero_outside.scheduler import HeapScheduler

        return HeapScheduler(slots=1)
