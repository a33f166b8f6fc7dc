"""smolagents on ringzero (``ringzero.adapters.smolagents``): a ``CodeAgent`` whose actions run in
a ringzero session, its tools on the host, its model through the gate; durable in a kernel
process (kill -9 mid-agent resumes to the same answer, each payment made once), a local sandbox
outside one; and smolagents' own executor tests, fetched from its sdist, judge the executor."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from smolagents import CodeAgent, ToolCallingAgent, tool
from smolagents.default_tools import FinalAnswerTool
from smolagents.utils import AgentError

from ringzero import Kernel
from ringzero.adapters.smolagents import KernelExecutor, KernelModel
from ringzero.core.contract.errors import InvalidArgument, NoProvider
from ringzero.providers.executors import MontyExecutor, ProcessExecutor
from ringzero.testing import ScriptedProvider
from tests.upstream.ringzero_smolagents_executor import PACKAGE, SUITE
from tests.upstream.sdist import run_suite, unpacked_sdist

ROOT = Path(__file__).resolve().parent.parent
WHERE = pytest.mark.parametrize("where", ["monty", "process"])


@pytest.fixture
def executor(request: pytest.FixtureRequest) -> Iterator[KernelExecutor]:
    """A ``KernelExecutor`` outside any kernel process, on Monty or the process sandbox."""
    made = KernelExecutor(MontyExecutor() if request.param == "monty" else ProcessExecutor())
    yield made
    made.cleanup()


@pytest.mark.parametrize("executor", ["monty", "process"], indirect=True)
def test_each_action_sees_what_the_ones_before_defined_and_final_answer_ends_it(executor: KernelExecutor) -> None:
    charged: list[int] = []

    @tool
    def charge(amount: int) -> str:
        """Charges an amount.

        Args:
            amount: what to charge.
        """
        charged.append(amount)
        return f"charged {amount}"

    class Shouting(FinalAnswerTool):
        def forward(self, answer: Any) -> Any:
            return str(answer).upper()

    executor.send_tools({"charge": charge, "final_answer": Shouting()})
    executor.send_variables({"rate": 3})
    first = executor("def triple(x):\n    return rate * x\nclass Box:\n    def __init__(self, v):\n"
                     "        self.v = v\nprint('defined')\ncharge(triple(2))")
    assert (first.output, first.logs, first.is_final_answer) == ("charged 6", "defined\n", False)
    assert executor("total = Box(triple(5)).v\ntotal").output == 15
    with pytest.raises(AgentError, match=r"(?s)before\n.*ZeroDivisionError"):
        executor("print('before')\n1 / 0")
    answer = executor("try:\n    final_answer(f'total {total}')\nexcept Exception:\n    charge(1)\ncharge(2)")
    assert (answer.output, answer.is_final_answer) == ("TOTAL 15", True)
    assert charged == [6], "final_answer ended the step: nothing after it ran, `except Exception` did not stop it"


def test_what_cannot_cross_is_refused_by_name() -> None:
    executor = KernelExecutor()
    try:
        with pytest.raises(InvalidArgument, match=r"variable 'image' .*cannot enter the sandbox"):
            executor.send_variables({"image": object()})

        @tool
        def pay(amount: int, idempotency_key: str = "") -> str:
            """Pays.

            Args:
                amount: what to pay.
                idempotency_key: the host's.
            """
            return f"paid {amount} {idempotency_key}"

        executor.send_tools({"pay": pay})
        assert executor("pay(5)").output == "paid 5 ", "outside a kernel process there is no key to give"
        with pytest.raises(AgentError, match="idempotency_key"):
            executor("pay(5, idempotency_key='mine')")  # the host's parameter, never the code's
    finally:
        executor.cleanup()


ACTIONS = ["Thought: add.\n<code>\nx = add(2, 3)\nprint(x)\n</code>",
           "Thought: done.\n<code>\nfinal_answer(x * 2)\n</code>"]


@tool
def add(a: int, b: int) -> int:
    """Adds two numbers.

    Args:
        a: the first.
        b: the second.
    """
    return a + b


def test_a_code_agent_outside_a_kernel_uses_the_model_s_gate_and_a_local_sandbox() -> None:
    model = KernelModel(ScriptedProvider(ACTIONS))
    agent = CodeAgent(tools=[add], model=model, executor=KernelExecutor(), verbosity_level=-1)
    try:
        assert agent.run("add 2 and 3, then double it") == 10
        assert agent.monitor.total_input_token_count > 0  # the provider's usage reached smolagents
    finally:
        agent.cleanup()
        model.close()
    with pytest.raises(NoProvider, match="KernelModel has no provider"):
        KernelModel().generate([{"role": "user", "content": "hello"}])
    calling = ToolCallingAgent(tools=[add], model=KernelModel(ScriptedProvider(["no"])), verbosity_level=-1)
    with pytest.raises(Exception, match="use it with a CodeAgent"):
        calling.run("add", max_steps=1)


async def test_a_code_agent_in_a_kernel_process_journals_each_model_call_and_each_action() -> None:
    async def program(ctx: Any) -> Any:
        agent = CodeAgent(tools=[add], model=KernelModel(), executor=KernelExecutor(), verbosity_level=-1)
        return await asyncio.to_thread(agent.run, "add 2 and 3, then double it")

    async with Kernel(llm=ScriptedProvider(ACTIONS), executor=MontyExecutor(), monitor_interval=None) as kernel:
        handle = await kernel.spawn(program)
        assert await handle.wait(timeout=60) == 10
        kinds = [entry.kind for entry in await kernel.store.journal(handle.pid)]
        calls, _ = await kernel.store.calls(handle.pid)
    assert kinds == ["llm", "session", "session", "llm", "session"], kinds  # final_answer defined once, first
    assert sorted(calls) == ["3.1", "5.1"] and calls["3.1"].outcome.value == 5, calls  # type: ignore[union-attr]


def _host(db: Path, log: Path, where: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tests.smolagents_host", str(db), str(log)], cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT), "AGENT_KILL": "during", "AGENT_EXECUTOR": where},
                          capture_output=True, text=True, timeout=120)


@WHERE
def test_a_code_agent_killed_mid_action_resumes_to_the_same_answer_with_each_payment_once(
        tmp_path: Path, where: str) -> None:
    """Killed with SIGKILL inside the second payment of its second action, the host is started
    again: the agent's model calls and first action are served from the journal, its session
    rebuilt (the second action finds ``fee``), the first payment not made again, the one in
    flight made again under its key, and the answer is the one an unbroken run gives."""
    db, log = tmp_path / "state.db", tmp_path / "payments.log"
    first = _host(db, log, where)
    assert first.returncode == -9, first.stderr
    again = _host(db, log, where)
    assert again.returncode == 0 and "answer 660" in again.stdout, again.stdout + again.stderr
    lines = [line.split() for line in log.read_text().splitlines()]
    starts = Counter(amount for word, amount, _ in lines if word == "start")
    ends = Counter(amount for word, amount, _ in lines if word == "end")
    assert ends == {"110": 1, "220": 1, "330": 1} and starts == {"110": 1, "220": 2, "330": 1}, lines
    assert len({key for _, amount, key in lines if amount == "220"}) == 1, lines  # again, under its key


SMOLAGENTS_EXCEPTIONS = {
    "tests/test_ringzero_kernel_executor.py::TestKernelExecutor::test_state_persistence[monty]",
    "tests/test_ringzero_kernel_executor.py::TestKernelExecutor::test_execute_image_output[monty]",
    "tests/test_ringzero_kernel_executor.py::TestKernelExecutor::test_execute_image_output[process]",
}
"""What the README says of smolagents' tests: Monty has no numpy and no PIL (the process sandbox
imports both), and a final answer crosses as JSON, so a PIL image is not one."""


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_smolagents_own_executor_tests_pass_on_the_kernel_executor() -> None:
    root = unpacked_sdist("smolagents")
    for name, text in {**PACKAGE, SUITE[0]: SUITE[1]}.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    result = run_suite(root, [SUITE[0]], "ringzero_smolagents_executor", ini="[pytest]\nfilterwarnings = ignore\n")
    print(f"smolagents' executor tests on KernelExecutor: {result.summary}")
    assert result.failed_tests() == SMOLAGENTS_EXCEPTIONS, result.output[-6000:]
    assert result.count("passed") == 17 and result.count("error") == 0, result.summary
