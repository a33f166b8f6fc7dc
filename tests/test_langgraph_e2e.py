"""LangGraph end to end on the kernel, with each sandboxing executor this host can run.

A ReAct graph runs as a kernel process: its model calls pass the LLM gate, its tool calls
are journaled syscalls whose bodies run in the kernel's executor (Monty, the process sandbox,
a microVM). Human-in-the-loop approval spans two separate Python processes on one SQLite file.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ringzero import Kernel
from ringzero.checkpointers import SqliteCheckpointer
from ringzero.core.contract.protocols import Executor, Tool
from ringzero.core.contract.types import JSON, ExecLimits, ExecResult, LLMRequest
from ringzero.testing import ScriptedProvider
from tests.programs import sandboxed_graph_agent

ROOT = Path(__file__).resolve().parent.parent


class CountingExecutor:
    """The real executor, with a count of the runs that reached it (replayed calls do not)."""

    def __init__(self, inner: Executor) -> None:
        self.inner = inner
        self.capabilities = inner.capabilities
        self.runs = 0

    async def run(self, code: str, *, inputs: Mapping[str, JSON] | None = None,
                  tools: Mapping[str, Tool] | None = None, limits: ExecLimits | None = None) -> ExecResult:
        self.runs += 1
        return await self.inner.run(code, inputs=inputs, tools=tools, limits=limits)

    async def aclose(self) -> None:
        """The test's fixture owns the real executor and closes it."""


def three_tools_at_once(request: LLMRequest) -> Any:
    """Asks for three tool calls in one turn, then answers with every result it got back."""
    last = request.messages[-1]
    if last.role == "user":
        return {"content": "", "tool_calls": [
            {"id": "r", "name": "read_file", "arguments": {"path": last.content}},
            {"id": "w", "name": "word_stats", "arguments": {"text": "to be or not to be", "top": 1}},
            {"id": "d", "name": "divide", "arguments": {"a": 1, "b": 0}}]}
    return "\x1e".join(f"{m.name}: {m.content}" for m in request.messages if m.role == "tool")  # errors span lines


def secret_file(tmp_path: Path) -> str:
    secret = tmp_path / "host-only.txt"
    secret.write_text("the host's secret")
    return str(secret)


async def test_a_react_graph_runs_its_tools_in_the_sandbox_in_parallel_with_errors(
        sandbox: Executor, tmp_path: Path) -> None:
    counting = CountingExecutor(sandbox)
    async with Kernel(checkpointer=SqliteCheckpointer(tmp_path / "k.db"), executor=counting,
                      llm=ScriptedProvider(three_tools_at_once)) as kernel:
        process = await kernel.spawn(sandboxed_graph_agent, secret_file(tmp_path))
        answer = str(await process.wait())
        journal = [e.kind for e in await kernel.store.journal(process.pid)]
    lines = dict(line.split(": ", 1) for line in answer.split("\x1e"))
    assert lines["word_stats"] == json.dumps({"words": 6, "top": ["be"]})
    assert "the host's secret" not in answer
    assert lines["read_file"].startswith("Error: ") and ("PermissionError" in lines["read_file"]
                                                         or "FileNotFoundError" in lines["read_file"])
    assert lines["divide"].startswith("Error: ") and "ZeroDivisionError" in lines["divide"]
    assert counting.runs == 3, "every tool body ran in the kernel's executor"
    assert journal.count("tool") == 3 and journal.count("llm") == 2


async def test_a_graph_stopped_mid_run_resumes_without_running_a_recorded_tool_again(
        sandbox: Executor, tmp_path: Path) -> None:
    async def hangs_once_tools_ran(request: LLMRequest) -> Any:
        if request.messages[-1].role == "tool":
            await asyncio.sleep(30)  # the model call after the tools hangs: the host "dies" here
        return three_tools_at_once(request)

    db, question = tmp_path / "k.db", secret_file(tmp_path)
    first_runs, hanging = CountingExecutor(sandbox), ScriptedProvider(hangs_once_tools_ran)
    first = Kernel(checkpointer=SqliteCheckpointer(db), executor=first_runs, llm=hanging)
    process = await first.spawn(sandboxed_graph_agent, question)
    while hanging.calls < 2:
        await asyncio.sleep(0.005)
    await first.aclose()
    assert first_runs.runs == 3

    second_runs = CountingExecutor(sandbox)
    async with Kernel(checkpointer=SqliteCheckpointer(db), executor=second_runs,
                      llm=ScriptedProvider(three_tools_at_once)) as again:
        [handle] = await again.recover()
        answer = str(await asyncio.wait_for(handle.wait(), 30))
    assert handle.pid == process.pid
    assert "word_stats: " + json.dumps({"words": 6, "top": ["be"]}) in answer
    assert second_runs.runs == 0, "a recorded tool call ran again after recovery"


def run_host(*args: str) -> dict[str, Any]:
    done = subprocess.run([sys.executable, "-m", "tests.interrupt_host", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=50, env={**os.environ, "PYTHONWARNINGS": "error"})
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def test_an_interrupt_in_one_python_process_is_resumed_by_another(tmp_path: Path) -> None:
    db = str(tmp_path / "review.db")
    asked = run_host("start", db)
    assert asked["interrupt"] == ["publish the draft?"] and asked["next"] == ["approve"]
    assert asked["log"] == ["draft: 5 words, mostly 'it'"]  # the draft ran in the sandbox
    [first_pid] = asked["ran_in"]

    resumed = run_host("resume", db, "yes, ship it")
    assert resumed["log"] == ["draft: 5 words, mostly 'it'", "approved: yes, ship it", "published"]
    draft_pid, approve_pid, publish_pid = resumed["ran_in"]
    assert draft_pid == first_pid, "the draft step ran again in the second process"
    assert approve_pid == publish_pid != first_pid
    assert resumed["checkpoints"] > asked["checkpoints"]
