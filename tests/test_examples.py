"""The examples run as a user runs them."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from ringzero.compat.vendor_servers import Reply, openai_answer, vendor_server
from ringzero.core.contract.types import LLMRequest, Message

ROOT = Path(__file__).resolve().parent.parent
MODEL_KEYS = ("OPENAI_API_KEY", "OPENAI_BASE_URL", "OPENAI_MODEL", "ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL")


def run_example(script: str, **env: str) -> str:
    clean = {k: v for k, v in os.environ.items() if k not in MODEL_KEYS}
    out = subprocess.run([sys.executable, script], cwd=ROOT, capture_output=True, text=True, timeout=120,
                         env={**clean, "PYTHONPATH": str(ROOT), **env})
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_the_langgraph_react_example_runs_offline() -> None:
    stdout = run_example("examples/langgraph_react.py")
    assert "model: ScriptedProvider" in stdout
    assert '"words": 8' in stdout and "syscalls journaled: llm, tool, llm" in stdout


def test_the_langgraph_react_example_talks_to_an_openai_compatible_server() -> None:
    def final_answer(body: dict[str, Any]) -> Reply:
        tool_result = body["messages"][-1]
        assert tool_result["role"] == "tool" and tool_result["tool_call_id"] == "call_ws"
        return openai_answer(f"The tool counted: {tool_result['content']}")

    first = openai_answer(None, [("call_ws", "word_stats", {"text": "the cat and the hat and the bat"})])
    with vendor_server("openai", [first, final_answer]) as server:
        stdout = run_example("examples/langgraph_react.py", OPENAI_BASE_URL=server.url, OPENAI_API_KEY="sk-test",
                             OPENAI_MODEL="gpt-test")
    assert "model: OpenAIProvider gpt-test" in stdout
    assert 'The tool counted: {"words": 8' in stdout  # computed in the sandbox, sent back through the server
    assert "syscalls journaled: llm, tool, llm" in stdout
    tools = server.requests[0].body["tools"]
    assert [t["function"]["name"] for t in tools] == ["word_stats"]


def load_example(name: str) -> Any:
    spec = importlib.util.spec_from_file_location(name, ROOT / "examples" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_crewai_example_runs_offline() -> None:
    stdout = run_example("examples/crewai_crew.py")
    assert "model: ScriptedProvider" in stdout
    assert "Report: 12 words; most common: the, and, bat" in stdout  # counted in the sandbox
    assert "syscalls journaled: llm, exec, llm, llm" in stdout and "exited, 3 model calls" in stdout


def test_the_crewai_example_talks_to_an_openai_compatible_server() -> None:
    """The real-model path, with a local server in OpenAI's wire format answering as the example's model."""
    example = load_example("crewai_crew")

    def model(body: dict[str, Any]) -> Reply:
        request = LLMRequest(messages=tuple(Message(m["role"], m["content"] or "") for m in body["messages"]))
        return openai_answer(example.scripted_model(request))

    with vendor_server("openai", [model, model, model]) as server:
        stdout = run_example("examples/crewai_crew.py", OPENAI_BASE_URL=server.url, OPENAI_API_KEY="sk-test",
                             OPENAI_MODEL="gpt-test")
    assert "model: OpenAIProvider gpt-test" in stdout
    assert "Report: 12 words; most common: the, and, bat" in stdout
    assert len(server.requests) == 3 and server.requests[0].body["stop"] == ["\nObservation:"]


def test_a_third_party_scheduler_passes_its_kit_through_the_pytest_plugin() -> None:
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "ringzero.compat",
                          "examples/third_party_scheduler.py"], cwd=ROOT, capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, out.stdout + out.stderr
    assert "ringzero SchedulerConformance on TestStrictPriorityScheduler: 7 passed" in out.stdout, out.stdout


def page_kit_example() -> str:
    """The backend authors' page's ``test_my_backends.py``: the python block after the words that name it."""
    text = (ROOT / "docs/backends.md").read_text()
    after = text[text.index("in a `test_my_backends.py`:"):]
    start = after.index("```python\n") + len("```python\n")
    return after[start:after.index("\n```", start)]


def run_fresh_project(tmp_path: Path, source: str) -> subprocess.CompletedProcess[str]:
    """Pytest in a new folder with no settings of its own, as the backend authors' page says to run it, with
    warnings as errors (``-W error``) so that one shows here as it would to a user."""
    (tmp_path / "test_my_backends.py").write_text(source)
    return subprocess.run([sys.executable, "-m", "pytest", "-W", "error", "-p", "no:cacheprovider",
                           "-p", "ringzero.compat", "test_my_backends.py"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)})


def test_the_kits_pass_in_a_fresh_project_following_the_readme_word_for_word(tmp_path: Path) -> None:
    out = run_fresh_project(tmp_path, page_kit_example())
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"rootdir: {tmp_path}\n" in out.stdout and "mode=Mode.STRICT" in out.stdout, out.stdout  # no settings
    for kit, cls in (("Checkpointer", "TestMyCheckpointer"), ("Executor", "TestMyExecutor"),
                     ("Scheduler", "TestMyScheduler")):
        assert f"ringzero {kit}Conformance on {cls}: " in out.stdout, out.stdout
    assert "failed" not in out.stdout and "error" not in out.stdout.lower(), out.stdout
    assert "Warning" not in out.stdout + out.stderr, out.stdout + out.stderr


def test_an_async_fixture_declared_as_pytest_fixture_gets_a_line_that_says_what_to_write(tmp_path: Path) -> None:
    out = run_fresh_project(tmp_path, page_kit_example().replace("@pytest_asyncio.fixture", "@pytest.fixture"))
    assert out.returncode != 0
    assert "an async fixture is declared with @pytest_asyncio.fixture, not @pytest.fixture" in out.stdout, out.stdout


def test_the_code_agent_egress_example_calls_an_api_with_a_key_the_code_never_holds() -> None:
    stdout = run_example("examples/code_agent_egress.py")
    assert "answer: Oslo: 4 C, light rain" in stdout and "error: None" in stdout
    assert "the API received the real key: True" in stdout
    assert "the request is in the agent's journal: True; the key is: False" in stdout


def test_the_threads_and_egress_example_runs_offline() -> None:
    """docs/frameworks.md: a model call journaled from a worker thread, and a code tool whose
    executor's egress policy refuses a host off its list."""
    stdout = run_example("examples/threads_and_egress.py")
    assert "summary: short: ringzero runs agents as processes" in stdout
    assert "EgressRefused: elsewhere.example.org:443 is not on this run's egress allow-list" in stdout
    assert "syscalls journaled: llm, tool" in stdout
