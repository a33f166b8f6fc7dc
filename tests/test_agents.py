"""ringzero.agents: the code agent, tool discovery, background tasks and the recursive agent."""

from __future__ import annotations

import asyncio
import hashlib
import math
import re
import time
from pathlib import Path
from typing import Any

import pytest

from ringzero.agents import CodeAgent, RecursiveAgent, TaskManager, ToolRegistry, create_agent, execute_task
from ringzero.core.contract.errors import Closed, InvalidArgument, NoProvider
from ringzero.core.contract.types import LLMRequest
from ringzero.core.support.ranking import rank
from ringzero.testing import ScriptedProvider
from tests import agent_tools
from tests.agent_tools import (
    convert_currency,
    expected_totals,
    geocode,
    get_weather,
    load_sales,
    resize_image,
    send_email,
    stock_history,
    translate_text,
)

ALL_TOOLS = [load_sales, get_weather, convert_currency, send_email, resize_image, translate_text, stock_history,
             geocode]


def step(request: LLMRequest) -> int:
    """Which turn of the loop this request is (1 for the first)."""
    return 1 + sum(1 for m in request.messages if m.role == "assistant")


def code(text: str) -> str:
    return f"Let me compute it.\n```python\n{text}\n```"


def sales_script(request: LLMRequest) -> str:
    """A model that summarizes the sales table in the sandbox, then answers from the summary."""
    if step(request) == 1:
        return code("rows = load_sales(1000)\ntotals = {}\nfor r in rows:\n"
                    "    totals[r['region']] = totals.get(r['region'], 0) + r['amount']\nprint(totals)")
    observed = request.messages[-1].content
    totals = eval(observed.split("\n", 1)[1])  # the printed summary: what the model saw
    return code(f"final_answer({totals!r})")


# ---------------------------------------------------------------- the registry
def test_search_ranks_the_tools_a_query_needs_first() -> None:
    registry = ToolRegistry(ALL_TOOLS)
    assert registry.search("what is the weather forecast in Paris", 2)[0].name == "get_weather"
    assert registry.search("exchange rate for money", 1)[0].name == "convert_currency"
    assert registry.search("closing prices of a stock", 1)[0].name == "stock_history"
    assert registry.search("zebra", 3) == []
    assert "get_weather(city: str) -> str: Get the current weather forecast for a city." in registry.describe()


def test_search_can_rank_by_embeddings() -> None:
    def embed(texts: Any) -> list[list[float]]:  # hashed bag of character trigrams: a real, if small, embedding
        vectors = []
        for text in texts:
            vector = [0.0] * 64
            clean = re.sub(r"\W+", " ", text.lower())
            for i in range(len(clean) - 2):
                vector[int(hashlib.md5(clean[i:i + 3].encode()).hexdigest(), 16) % 64] += 1.0
            vectors.append(vector)
        return vectors

    registry = ToolRegistry(ALL_TOOLS, embed=embed)
    assert registry.search("translate this text to French", 1)[0].name == "translate_text"
    assert all(not math.isnan(x) for x in rank("x", [spec.text for spec in registry], embed))


def test_the_registry_refuses_what_a_resumed_agent_could_not_find() -> None:
    def local_tool() -> int:
        """Defined inside a function."""
        return 1

    with pytest.raises(InvalidArgument, match="already registered"):
        ToolRegistry([get_weather, get_weather])
    with pytest.raises(InvalidArgument, match="defined in __main__ or inside a function"):
        ToolRegistry([local_tool]).references()
    with pytest.raises(InvalidArgument, match="cannot import the tool"):
        ToolRegistry(["tests.agent_tools:no_such_tool"])
    assert ToolRegistry(["tests.agent_tools:get_weather"])["get_weather"].function is get_weather


# ---------------------------------------------------------------- the code agent
def test_the_code_agent_keeps_data_in_the_sandbox_and_answers(tmp_path: Path) -> None:
    provider = ScriptedProvider(sales_script)
    with create_agent(ALL_TOOLS, llm=provider, state_dir=tmp_path) as agent:
        answer, output, error = agent.execute_task("Total sales amount by region?")
    assert error is None and answer == expected_totals(1000)
    assert output.strip() == str(expected_totals(1000))
    sent = "\n".join(m.content for r in provider.requests for m in r.messages)
    assert "{'region': " not in sent, "raw rows reached the model"
    assert provider.calls == 2


def test_only_the_best_tools_are_described_and_the_rest_are_found_by_search(tmp_path: Path) -> None:
    def script(request: LLMRequest) -> str:
        if step(request) == 1:
            return code("print(search_tools('latitude of an address'))")
        if step(request) == 2:
            return code("final_answer(geocode('1 rue de Rivoli'))")
        raise AssertionError("one step too many")

    provider = ScriptedProvider(script)
    with create_agent(ALL_TOOLS, llm=provider, state_dir=tmp_path, tool_limit=2) as agent:
        answer, _, error = agent.execute_task("What is the weather forecast in Paris?")
    system = provider.requests[0].messages[0].content
    assert "get_weather(" in system and "geocode(" not in system  # two tools shown, chosen for the task
    assert "geocode(address: str)" in provider.requests[1].messages[-1].content  # found by search_tools
    assert (answer, error) == ([48.85, 2.35], None)


def test_an_error_is_shown_to_the_model_which_fixes_its_code(tmp_path: Path) -> None:
    def script(request: LLMRequest) -> str:
        if step(request) == 1:
            return code("final_answer(get_weather())")
        assert "Error: TypeError" in request.messages[-1].content
        return code("final_answer(get_weather('Oslo'))")

    answer, _, error = execute_task("Weather in Oslo?", tools=[get_weather], llm=ScriptedProvider(script),
                                    state_dir=tmp_path)
    assert (answer, error) == ("snow", None)


def test_a_plain_reply_is_the_answer_and_the_step_limit_holds(tmp_path: Path) -> None:
    with create_agent([get_weather], llm=ScriptedProvider(["It is sunny."]), state_dir=tmp_path) as agent:
        assert tuple(agent.execute_task("Weather?")) == ("It is sunny.", "", None)
    looping = ScriptedProvider(lambda r: code("print('still thinking')"))
    with create_agent([get_weather], llm=looping, state_dir=tmp_path, max_steps=3) as agent:
        answer, output, error = agent.execute_task("Weather?")
    assert answer is None and error == "no final answer after 3 steps" and output.count("still thinking") == 3


def test_an_agent_without_a_model_says_how_to_give_it_one(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("OPENAI_API_KEY", "OPENAI_BASE_URL", "ANTHROPIC_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(NoProvider, match="needs a model"):
        create_agent([get_weather])


# ---------------------------------------------------------------- background tasks
def test_tasks_run_in_the_background_and_report_their_status(tmp_path: Path) -> None:
    with create_agent(ALL_TOOLS, llm=ScriptedProvider(sales_script), state_dir=tmp_path) as agent:
        manager = TaskManager(agent)
        ids = [manager.dispatch_task(f"Sales by region, run {i}") for i in range(3)]
        results = [manager.wait_for_task(i) for i in ids]
        listing = manager.list_tasks()
        status = manager.get_status(ids[0])
        with pytest.raises(InvalidArgument, match="looks like 'task-12'"):
            TaskManager(agent).get_status("12")
    assert all(r.answer == expected_totals(1000) and r.error is None for r in results)
    assert [t["id"] for t in listing] == ids and all(t["status"] == "exited" for t in listing)
    assert status["task"] == "Sales by region, run 0" and status["done"] and status["llm_calls"] == 2
    with pytest.raises(Closed, match="closed"):  # a closed agent says so; it does not start a new kernel
        manager.get_status(ids[0])


async def test_a_task_can_be_cancelled(tmp_path: Path) -> None:
    async def hangs(request: LLMRequest) -> str:
        await asyncio.sleep(60)
        return "too late"

    provider = ScriptedProvider(hangs)
    agent = create_agent([get_weather], llm=provider, state_dir=tmp_path)
    manager = TaskManager(agent)
    task = await manager.adispatch_task("Weather?")
    while provider.calls == 0:
        await asyncio.sleep(0.01)
    assert await manager.acancel_task(task) is True
    result = await manager.await_for_task(task, timeout=5)
    assert result.answer is None and "killed" in str(result.error)
    assert (await manager.aget_status(task))["status"] == "killed"
    assert await manager.acancel_task(task) is False
    await agent.aclose()


def test_unfinished_tasks_resume_after_a_restart_without_repeating_calls(tmp_path: Path) -> None:
    async def second_call_hangs(request: LLMRequest) -> str:
        if step(request) == 2:
            await asyncio.sleep(60)  # the host goes down while the model thinks
        return sales_script(request)

    agent_tools.TOOL_CALLS.clear()
    first_model = ScriptedProvider(second_call_hangs)
    first = create_agent(ALL_TOOLS, llm=first_model, state_dir=tmp_path)
    task = TaskManager(first).dispatch_task("Sales by region?")
    while first_model.calls < 2:
        time.sleep(0.01)
    first.close()  # a host shutdown: the task stays resumable in the store
    assert agent_tools.TOOL_CALLS == ["load_sales"]

    second_model = ScriptedProvider(sales_script)
    with create_agent(ALL_TOOLS, llm=second_model, state_dir=tmp_path) as second:
        manager = TaskManager(second)
        assert [t["id"] for t in manager.list_tasks()] == [task]
        result = manager.wait_for_task(task, timeout=30)
    assert result.answer == expected_totals(1000) and result.error is None
    assert second_model.calls == 1, "only the model call that had not finished was made again"
    assert agent_tools.TOOL_CALLS == ["load_sales"], "the recorded code run was not repeated"


# ---------------------------------------------------------------- the recursive agent
def test_the_recursive_agent_reads_a_large_file_through_code_and_ask_llm(tmp_path: Path) -> None:
    log = tmp_path / "service.log"
    lines = [f"2026-11-{1 + i % 28:02d} {'ERROR disk full' if i % 7 == 0 else 'INFO ok'} request {i}"
             for i in range(5000)]
    log.write_text("\n".join(lines))

    def model(request: LLMRequest) -> str:
        prompt = request.messages[-1].content
        if prompt.startswith("How many lines contain ERROR?"):  # a nested ask_llm call on one piece
            return str(sum("ERROR" in line for line in prompt.splitlines()[1:]))
        if step(request) == 1:
            assert "5,000 lines" in request.messages[0].content
            return code("lines = data.splitlines()\ncounts = []\nfor i in range(0, len(lines), 1000):\n"
                        "    piece = '\\n'.join(lines[i:i + 1000])\n"
                        "    counts.append(int(ask_llm('How many lines contain ERROR?\\n' + piece)))\n"
                        "print(counts, sum(counts))")
        return code(f"final_answer({request.messages[-1].content.split()[-1]})")

    provider = ScriptedProvider(model)
    with RecursiveAgent(llm=provider, state_dir=tmp_path) as agent:
        answer, output, error = agent.analyze(log, "How many errors are in the log?")
    assert (answer, error) == (sum(1 for line in lines if "ERROR" in line), None)
    assert output.strip() == "[143, 143, 143, 143, 143] 715"  # what the code printed: per-piece counts
    assert provider.calls == 2 + 5  # two turns of the loop, five pieces asked about
    main_turns = [r for r in provider.requests if r.messages[0].role == "system"]
    assert all("request 4999" not in m.content for r in main_turns for m in r.messages), "the data reached the context"
    with pytest.raises(InvalidArgument, match="is not one"):
        agent.analyze(tmp_path / "missing.log", "?")


def test_code_agent_is_a_kernel_program_with_its_own_store(tmp_path: Path) -> None:
    agent = CodeAgent([get_weather], llm=ScriptedProvider(["sunny"]), state_dir=tmp_path)
    assert agent.execute_task("Weather?")[0] == "sunny"
    agent.close()
    assert (tmp_path / "agent.db").exists()


# ---------------------------------------------------------------- the agent's workspace
def test_an_agents_workspace_persists_between_its_tasks_and_nothing_else_is_writable(tmp_path: Path) -> None:
    def script(request: LLMRequest) -> str:
        task = request.messages[1].content
        if "remember" in task:
            return code("import os\nwith open(os.path.join(workspace, 'notes.txt'), 'w') as f:\n"
                        "    f.write('meeting at noon')\nfinal_answer('noted')")
        return code("import os\nfinal_answer(open(os.path.join(workspace, 'notes.txt')).read())")

    with create_agent([get_weather], llm=ScriptedProvider(script), state_dir=tmp_path, name="planner",
                      executor="process") as agent:
        assert agent.workspace == tmp_path / "workspaces" / "planner"
        assert agent.execute_task("remember the meeting")[0] == "noted"
        assert agent.execute_task("what did I note?")[0] == "meeting at noon"  # another run, another process
        escaped = agent.execute_code(f"open({str(tmp_path / 'x.txt')!r}, 'w')")
    assert (tmp_path / "workspaces" / "planner" / "notes.txt").read_text() == "meeting at noon"
    # the host's folder does not exist in the run's private root (read-only where it would)
    assert escaped.startswith(("Error: FileNotFoundError", "Error: PermissionError")), escaped
    assert not (tmp_path / "x.txt").exists()


def test_a_long_task_with_a_context_budget_folds_its_oldest_steps(tmp_path: Path) -> None:
    from ringzero.core.context import SUMMARIZE
    from ringzero.testing import count_tokens

    def script(request: LLMRequest) -> str:
        text = "\n".join(m.content for m in request.messages)
        pages = sorted({int(n) for n in re.findall(r"page (\d+)", text)})
        if request.messages[0].content == SUMMARIZE:  # a good note keeps which pages were read
            return "Read so far: " + ", ".join(f"page {n}" for n in pages)
        turn = pages[-1] + 1 if pages else 0
        if turn >= 12:
            return code("final_answer('read 12 pages')")
        return code(f"print('page {turn}: ' + 'lorem ipsum ' * 30)")

    provider = ScriptedProvider(script)
    with create_agent([get_weather], llm=provider, state_dir=tmp_path, max_steps=20, context_budget=400) as agent:
        answer, _, error = agent.execute_task("Read the pages one by one.")
    main_loop = [r for r in provider.requests if r.messages[0].content != SUMMARIZE]
    assert (answer, error) == ("read 12 pages", None)
    assert all(sum(count_tokens(m.content) for m in r.messages) <= 400 for r in main_loop)
    assert all("Your task: Read the pages one by one." in r.messages[0].content for r in main_loop)
    assert len(provider.requests) > len(main_loop), "nothing was folded"
