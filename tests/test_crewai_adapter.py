"""The CrewAI adapter with real CrewAI objects (Agent, Task, Crew, Flow), fully offline.

CrewAI's telemetry is off through its own switches (set in conftest.py before it is imported).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from crewai.flow.async_feedback.types import PendingFeedbackContext
from crewai.tools import BaseTool, tool
from pydantic import BaseModel

from ringzero import Kernel, Limits
from ringzero.adapters.crewai import CodeExecutionTool, KernelFlowPersistence, KernelLLM, sandboxed
from ringzero.checkpointers import MemoryCheckpointer, SqliteCheckpointer
from ringzero.core.contract.errors import BudgetExceeded, InvalidArgument, ProcessFailed
from ringzero.core.contract.protocols import Executor
from ringzero.core.contract.types import LLMRequest, ProcessStatus, StopReason
from ringzero.testing import ScriptedProvider
from tests.crew_programs import crew_program, flow_persistence, flow_program, react_script
from tests.test_langgraph_e2e import CountingExecutor
from tests.tool_bodies import crew_read_file, crew_word_count, divide

ROOT = Path(__file__).resolve().parent.parent


@tool("word_count")
def word_count(text: str) -> int:
    """Count the words of a text."""
    return len(text.split())


class Multiply(BaseTool):
    name: str = "multiply"
    description: str = "Multiply two integers."

    def _run(self, a: int, b: int) -> int:
        return a * b


class UsesItself(BaseTool):
    name: str = "uses_itself"
    description: str = "Reads a setting of the tool object."
    factor: int = 3

    def _run(self, a: int) -> int:
        return a * self.factor


def secret_file(tmp_path: Path) -> str:
    secret = tmp_path / "host-only.txt"
    secret.write_text("the host's secret")
    return str(secret)


def test_a_sandboxed_tool_keeps_its_identity_and_runs_in_monty() -> None:
    wrapped = sandboxed(word_count)
    assert (wrapped.name, wrapped.args_schema.model_json_schema()) == (
        word_count.name, word_count.args_schema.model_json_schema())
    assert "Count the words of a text." in wrapped.description
    assert wrapped.run(text="to be or not") == 4
    multiply = sandboxed(Multiply())
    assert multiply.name == "multiply" and multiply.run(a=6, b=7) == 42
    plain = sandboxed(crew_word_count)
    assert plain.name == "crew_word_count" and plain.run(text="a b c") == 3


def only_odd_results(arguments: Any, result: Any) -> bool:
    return int(result) % 2 == 1


@tool("adder", result_as_answer=True, max_usage_count=2)
def adder(a: int, b: int) -> int:
    """Add two numbers."""
    return a + b


adder.cache_function = only_odd_results


class Doubler(BaseTool):
    name: str = "doubler"
    description: str = "Double x."
    result_as_answer: bool = True  # a subclass's own default, not set at construction
    max_usage_count: int | None = 5

    def _run(self, x: int) -> int:
        return 2 * x


@pytest.mark.parametrize("original", [adder, Doubler()], ids=["tool_decorator", "base_tool_subclass"])
def test_a_sandboxed_tool_has_every_field_crewai_reads_as_the_original_has_it(original: BaseTool) -> None:
    wrapped = sandboxed(original)
    for field in BaseTool.model_fields:
        assert getattr(wrapped, field) == getattr(original, field), field
    assert wrapped.to_structured_tool().result_as_answer is True
    assert wrapped.to_structured_tool().cache_function is original.cache_function


def test_a_sandboxed_tool_keeps_the_usage_limit_and_runs_async_where_crewai_calls_it() -> None:
    import asyncio

    wrapped = sandboxed(adder)
    with pytest.raises(NotImplementedError):  # as CrewAI's sync tools refuse arun: it runs _run on a thread
        asyncio.run(wrapped.arun(a=1, b=2))
    assert wrapped.run(a=1, b=2) == 3
    assert wrapped.to_structured_tool().func(2, 2) == 4  # what CrewAI's async paths call, positional too
    third = wrapped.run(a=3, b=3)  # max_usage_count=2: CrewAI's own refusal, as for the original
    assert "usage limit" in str(third).lower() and wrapped.current_usage_count == 2


async def sandboxed_async_call(ctx: Any) -> int:
    """A sync tool from async code, as CrewAI's async paths call one: on a worker thread."""
    import asyncio

    return int(await asyncio.to_thread(sandboxed(adder).run, a=20, b=22))


async def test_an_async_sandboxed_tool_call_in_a_kernel_process_is_a_journaled_exec(tmp_path: Path) -> None:
    async with Kernel(checkpointer=SqliteCheckpointer(tmp_path / "k.db")) as kernel:
        handle = await kernel.spawn(sandboxed_async_call)
        assert await handle.wait() == 42
        assert [e.kind for e in await kernel.store.journal(handle.pid)] == ["exec"]


def test_what_cannot_be_shipped_is_refused_when_wrapping() -> None:
    offset = 2

    def closes_over(a: int) -> int:
        return a + offset

    with pytest.raises(InvalidArgument, match="uses self; the tool object does not exist in the sandbox"):
        sandboxed(UsesItself())
    with pytest.raises(InvalidArgument, match="uses offset from an enclosing function"):
        sandboxed(closes_over)
    with pytest.raises(InvalidArgument, match="needs a CrewAI tool or a function"):
        sandboxed(42)  # type: ignore[arg-type]


async def test_a_sandboxed_tool_cannot_read_the_hosts_files_and_its_errors_are_typed(
        sandbox: Executor, tmp_path: Path) -> None:
    import asyncio

    reader = sandboxed(crew_read_file, executor=sandbox)
    with pytest.raises((PermissionError, FileNotFoundError)):  # raised as the function raises them, from the sandbox
        await asyncio.to_thread(reader.run, path=secret_file(tmp_path))
    with pytest.raises(ZeroDivisionError):
        await asyncio.to_thread(sandboxed(divide, executor=sandbox).run, a=1, b=0)


def test_the_code_tool_runs_model_code_with_tools_inside_and_caps_output(tmp_path: Path) -> None:
    run_python = CodeExecutionTool(tools=[word_count, crew_word_count], max_output=200)
    assert "word_count(text)" in run_python.description and "crew_word_count(text)" in run_python.description
    out = run_python.run(code="n = word_count('a b c') + crew_word_count(text='d e')\nprint('total', n)\nn * 10")
    assert out == "total 5\nResult: 50"
    assert "Error: " in run_python.run(code=f"open({secret_file(tmp_path)!r}).read()")
    capped = run_python.run(code="for i in range(500):\n    print('line', i)")
    assert len(capped) < 260 and capped.endswith("more characters truncated]")


def test_kernel_llm_answers_through_the_gate_and_counts_tokens() -> None:
    provider = ScriptedProvider(["Thought: done\nFinal Answer: 42\nObservation: made up"])
    llm = KernelLLM(provider, stop=["\nObservation:"])
    assert llm.call([{"role": "system", "content": "be brief"}, {"role": "user", "content": "answer?"}]) == (
        "Thought: done\nFinal Answer: 42")  # the stop word cuts what the model made up
    assert provider.requests[0].stop == ("\nObservation:",)
    assert llm.get_token_usage_summary().total_tokens > 0


async def test_a_two_agent_crew_runs_as_a_kernel_process_with_its_tools_in_the_sandbox(
        sandbox: Executor, tmp_path: Path) -> None:
    counting = CountingExecutor(sandbox)
    async with Kernel(checkpointer=SqliteCheckpointer(tmp_path / "k.db"), executor=counting,
                      llm=ScriptedProvider(react_script)) as kernel:
        process = await kernel.spawn(crew_program, "the cat sat on the mat", secret_file(tmp_path), name="crew")
        counted, read = await process.wait()  # type: ignore[misc]
        journal = [entry.kind for entry in await kernel.store.journal(process.pid)]
        [row] = [p for p in await kernel.ps() if p.pid == process.pid]
    assert counted == "6"  # computed in the sandbox by the first agent's tool
    # the error as CrewAI shows a host tool's: its message (the sandbox raised the built-in error as itself)
    assert "the host's secret" not in read and ("Permission denied" in read or "No such file or directory" in read)
    # every tool run (CrewAI retries a failing tool several times) is a journaled run in the kernel's executor
    assert counting.runs == journal.count("exec") >= 2
    assert journal.count("llm") == 4
    assert row.name == "crew" and row.llm_calls == 4 and row.tokens > 0


async def test_a_crew_over_its_budget_is_stopped_by_the_kernel(tmp_path: Path) -> None:
    async with Kernel(checkpointer=MemoryCheckpointer(), llm=ScriptedProvider(react_script)) as kernel:
        process = await kernel.spawn(crew_program, "a b c", secret_file(tmp_path), limits=Limits(llm_calls=1))
        with pytest.raises(BudgetExceeded):
            await process.wait()
    assert process.stop_reason is StopReason.LLM_CALLS


async def test_a_crew_waiting_on_its_model_is_killed_at_once(tmp_path: Path) -> None:
    import asyncio

    cancelled = asyncio.Event()

    async def never_answers(request: LLMRequest) -> str:
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return "Final Answer: too late"

    provider = ScriptedProvider(never_answers)
    async with Kernel(checkpointer=MemoryCheckpointer(), llm=provider) as kernel:
        process = await kernel.spawn(crew_program, "a b c", secret_file(tmp_path))
        while provider.calls == 0:  # the crew's first model call is under way, in its worker thread
            await asyncio.sleep(0.02)
        await process.kill()
        with pytest.raises(ProcessFailed):
            await process.wait()
        assert cancelled.is_set() and process.status is ProcessStatus.KILLED  # the model call was cut off


async def test_a_persisted_flow_runs_as_a_kernel_process(tmp_path: Path) -> None:
    async with Kernel(checkpointer=MemoryCheckpointer()) as kernel:
        process = await kernel.spawn(flow_program, str(tmp_path / "flows.db"), name="flow")
        state = await process.wait()
    assert state["steps"] == ["begin", "finish"]  # type: ignore[index]
    assert await asyncio.to_thread(saved_state, str(tmp_path / "flows.db"), state["id"]) == state  # type: ignore[index]


def saved_state(db: str, flow_id: str) -> dict[str, Any] | None:
    with flow_persistence(db) as persistence:
        return persistence.load_state(flow_id)


def run_flow(db: str, *flow_id: str) -> dict[str, Any]:
    done = subprocess.run([sys.executable, "-m", "tests.crew_programs", "flow", db, *flow_id], cwd=ROOT,
                          capture_output=True, text=True, timeout=120, env=dict(os.environ))
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


@pytest.mark.slow
@pytest.mark.timeout(240)  # two fresh Python processes, each importing CrewAI (about 10 s apiece here)
def test_a_persisted_flow_is_reloaded_by_id_in_a_second_python_process(tmp_path: Path) -> None:
    db = str(tmp_path / "flows.db")
    first = run_flow(db)
    assert first["steps"] == ["begin", "finish"]
    second = run_flow(db, first["id"])  # a new process: the state comes back from the checkpointer
    assert second["id"] == first["id"]
    assert second["steps"] == ["begin", "finish", "begin", "finish"]
    assert second["pid"][:2] == first["pid"] and second["pid"][2] != first["pid"][0]
    assert saved_state(db, first["id"]) == second


def test_pending_feedback_is_kept_until_cleared(tmp_path: Path) -> None:
    class Review(BaseModel):
        id: str = "r-1"
        draft: str = "hello"

    with flow_persistence(str(tmp_path / "f.db")) as persistence:
        assert persistence.load_state("r-1") is None and persistence.load_pending_feedback("r-1") is None
        context = PendingFeedbackContext(flow_id="r-1", flow_class="tests.Review", method_name="review",
                                         method_output="hello", message="approve?")
        persistence.save_pending_feedback("r-1", context, Review())
        state, loaded = persistence.load_pending_feedback("r-1")  # type: ignore[misc]
        assert state == {"id": "r-1", "draft": "hello"} and loaded.message == "approve?"
        assert persistence.load_state("r-1") == state
        persistence.clear_pending_feedback("r-1")
        assert persistence.load_pending_feedback("r-1") is None
    with pytest.raises(InvalidArgument, match="needs a ringzero Checkpointer"):
        KernelFlowPersistence("flows.db")  # type: ignore[arg-type]


async def test_a_plain_crewai_tool_in_a_kernel_process_is_journaled_and_not_run_again_on_resume(
        tmp_path: Path) -> None:
    import asyncio

    from tests import crew_programs

    crew_programs.PUBLISHED.clear()
    answered = asyncio.Event()

    calls = []

    async def hangs_after_the_tool(request: LLMRequest) -> str:
        calls.append(request)
        if len(calls) == 2:  # the answer after the tool's result
            answered.set()
            await asyncio.Event().wait()  # the host dies here, after publish ran
        return react_script(request)

    db = tmp_path / "k.db"
    async with Kernel(checkpointer=SqliteCheckpointer(db), llm=ScriptedProvider(hangs_after_the_tool)) as kernel:
        process = await kernel.spawn(crew_programs.publishing_program, name="writer")
        await asyncio.wait_for(answered.wait(), 60)
        journal = [(e.kind, e.summary) for e in await kernel.store.journal(process.pid)]
    assert crew_programs.PUBLISHED == ["hello world"]
    assert [kind for kind, _ in journal] == ["llm", "tool"] and journal[1][1].startswith("crewai:publish(")

    async with Kernel(checkpointer=SqliteCheckpointer(db), llm=ScriptedProvider(react_script)) as kernel:
        [handle] = await kernel.recover()
        assert await handle.wait(timeout=60) == "published: hello world"
        assert handle.replayed_syscalls == 2
    assert crew_programs.PUBLISHED == ["hello world"], "the resumed crew got publish's result from the journal"


async def test_a_crewai_tool_in_flight_at_a_crash_is_in_doubt_for_the_program_and_never_run_twice(
        tmp_path: Path) -> None:
    import asyncio
    import threading

    from tests import crew_programs

    crew_programs.PUBLISHED.clear()
    crew_programs.HOLD.clear()
    crew_programs.HOLD.add("hello world")
    released = threading.Event()
    crew_programs.RELEASE = released
    db = tmp_path / "k.db"
    try:
        async with Kernel(checkpointer=SqliteCheckpointer(db), llm=ScriptedProvider(react_script)) as kernel:
            await kernel.spawn(crew_programs.careful_publishing_program, name="writer")
            while not crew_programs.PUBLISHED:  # publish has run and hangs before returning: the host dies
                await asyncio.sleep(0.01)
    finally:
        released.set()
    crew_programs.HOLD.clear()
    async with Kernel(checkpointer=SqliteCheckpointer(db), llm=ScriptedProvider(react_script)) as kernel:
        [handle] = await kernel.recover()
        assert await handle.wait(timeout=60) == "in doubt: crewai:publish"
    assert crew_programs.PUBLISHED == ["hello world"], "the crew's agent did not get to publish again"


async def crash_while_held(db: Path, program: Any, held: str, ran: list[str], prompts: list[str] | None = None) -> None:
    """Run ``program`` until a tool run holding ``held`` has started, then stop the host;
    ``prompts`` gets what the model was shown."""
    import threading

    from tests import crew_programs

    crew_programs.HOLD.clear()
    crew_programs.HOLD.add(held)
    released = threading.Event()
    crew_programs.RELEASE = released
    try:
        def model(request: LLMRequest) -> str:
            if prompts is not None:
                prompts.append("\n".join(m.content for m in request.messages))
            return react_script(request)

        async with Kernel(checkpointer=SqliteCheckpointer(db), llm=ScriptedProvider(model)) as kernel:
            await kernel.spawn(program, name="writer")
            while not ran:
                await asyncio.sleep(0.01)
    finally:
        released.set()
        crew_programs.HOLD.clear()


async def test_a_keyed_crewai_tool_gets_the_kernels_key_hidden_from_the_agent_the_same_when_run_again(
        tmp_path: Path) -> None:
    from tests import crew_programs

    crew_programs.CHARGE_KEYS.clear()
    prompts: list[str] = []
    await crash_while_held(tmp_path / "k.db", crew_programs.charging_program, "12", crew_programs.CHARGE_KEYS,
                           prompts)
    assert prompts and all("charge" in p and "idempotency_key" not in p for p in prompts), prompts
    async with Kernel(checkpointer=SqliteCheckpointer(tmp_path / "k.db"), llm=ScriptedProvider(react_script)) as k:
        [handle] = await k.recover()
        answer = await handle.wait(timeout=60)
    first, again = crew_programs.CHARGE_KEYS
    assert first == again and first.startswith("rz-1-"), crew_programs.CHARGE_KEYS
    assert answer == f"charged 12 under {first}"
    assert "idempotency_key" not in crew_programs.charge.formatted_description
    assert list(crew_programs.charge.args_schema.model_fields) == ["amount"]


async def test_a_crewai_tool_in_doubt_is_reported_to_the_agent_with_in_doubt_report(tmp_path: Path) -> None:
    from tests import crew_programs

    crew_programs.PUBLISHED.clear()
    await crash_while_held(tmp_path / "k.db", crew_programs.reporting_publishing_program, "hello world",
                           crew_programs.PUBLISHED)
    async with Kernel(checkpointer=SqliteCheckpointer(tmp_path / "k.db"), llm=ScriptedProvider(react_script)) as k:
        [handle] = await k.recover()
        answer = await handle.wait(timeout=60)
    assert answer.startswith("Error: the outcome of this publish call is unknown"), answer
    assert crew_programs.PUBLISHED == ["hello world"], "the agent did not get to publish again"
