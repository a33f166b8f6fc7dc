"""sandboxed() and code_tool(): LangChain tools whose code runs in each executor this host has."""

from __future__ import annotations

import asyncio
import datetime
from pathlib import Path

import pytest
from langchain_core.callbacks import CallbackManagerForToolRun

from ringzero.adapters.langgraph import code_tool, sandboxed
from ringzero.core.contract.errors import InvalidArgument
from ringzero.core.contract.protocols import Executor
from tests.executors import ISOLATING, _started
from tests.tool_bodies import read_file, shout, uses_module_constant, uses_module_json, word_stats


@pytest.fixture(params=ISOLATING)
async def tool_executor(request: pytest.FixtureRequest) -> Executor:
    instance = await _started(request.param)
    yield instance  # type: ignore[misc]
    await instance.aclose()


async def test_a_sandboxed_function_keeps_its_name_description_and_schema(tool_executor: Executor) -> None:
    tool = sandboxed(word_stats, executor=tool_executor)
    assert tool.name == "word_stats" and tool.description.startswith("Count the words")
    assert set(tool.args_schema.model_json_schema()["properties"]) == {"text", "top"}  # type: ignore[union-attr]
    assert await tool.ainvoke({"text": "b a b c b a"}) == {"words": 6, "top": ["b", "a"]}


async def test_the_tool_body_provably_runs_in_the_sandbox(tool_executor: Executor, tmp_path: Path) -> None:
    secret = tmp_path / "host-only.txt"
    secret.write_text("the host's secret")
    assert read_file(str(secret)) == "the host's secret"  # on the host it works
    tool = sandboxed(read_file, executor=tool_executor)
    with pytest.raises((PermissionError, FileNotFoundError)):  # as the function raises them, from the sandbox
        await tool.ainvoke({"path": str(secret)})


def test_a_decorated_tool_keeps_its_identity_and_runs_sync() -> None:
    tool = sandboxed(shout)
    assert (tool.name, tool.description) == (shout.name, shout.description)
    assert tool.invoke({"text": "hi"}) == "HI!"


def test_what_cannot_be_shipped_is_refused_when_wrapping() -> None:
    factor = 3

    def uses_closure(x: int) -> int:
        return x * factor

    with pytest.raises(InvalidArgument, match="uses factor from an enclosing function"):
        sandboxed(uses_closure)
    with pytest.raises(InvalidArgument, match="module-level SECRET_SETTING"):
        sandboxed(uses_module_constant)
    with pytest.raises(InvalidArgument, match="lambda"):
        sandboxed(lambda x: x)


async def test_code_tool_calls_tools_inside_and_returns_only_output_and_value(tool_executor: Executor) -> None:
    run_python = code_tool([shout, word_stats], executor=tool_executor)
    assert run_python.name == "run_python" and "shout(text)" in run_python.description
    code = "stats = word_stats('x y x z x', top=1)\nprint(shout('done'))\nstats['top']"
    assert await run_python.ainvoke({"code": code}) == "DONE!\nResult: ['x']"
    failing = await run_python.ainvoke({"code": "1 / 0"})
    assert failing.startswith("Error: ZeroDivisionError")


async def test_code_tool_caps_what_goes_back_to_the_model(tool_executor: Executor) -> None:
    run_python = code_tool([], executor=tool_executor, max_output=100)
    text = await run_python.ainvoke({"code": "for i in range(1000):\n    print('line', i)"})
    assert len(text) < 160 and text.endswith("more characters truncated]")


async def test_type_annotations_are_not_shipped(tool_executor: Executor) -> None:
    from tests.tool_bodies import annotated

    tool = sandboxed(annotated, executor=tool_executor)
    assert await tool.ainvoke({"values": [1, 2, 3]}) == {"total": 6}


def test_a_sandboxed_tool_is_a_copy_of_the_original_with_every_field() -> None:
    """Its class, schema (a dict one too), return_direct, response_format and func are the
    original's; a single-input Tool takes its string; the artifact pair comes back a pair."""
    from langchain_core.messages import ToolMessage
    from langchain_core.tools import StructuredTool, Tool

    from tests.tool_bodies import echo_line, split_words

    pair = StructuredTool.from_function(split_words, response_format="content_and_artifact", return_direct=True,
                                        metadata={"team": "search"}, tags=["t"])
    wrapped = sandboxed(pair)
    assert type(wrapped).__name__ == "StructuredTool" and isinstance(wrapped, StructuredTool)
    assert (wrapped.return_direct, wrapped.metadata, wrapped.tags, wrapped.func) == (True, {"team": "search"}, ["t"],
                                                                                     split_words)
    message = wrapped.invoke({"type": "tool_call", "name": pair.name, "id": "c1", "args": {"text": "a b c"}})
    assert isinstance(message, ToolMessage) and message.content == "3 words" and message.artifact == ["a", "b", "c"]
    single = sandboxed(Tool(name="echo", func=echo_line, description="Echo a line."))
    assert type(single).__name__ == "Tool" and single.invoke("hi") == "echo hi"
    schema = {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}
    by_dict = sandboxed(StructuredTool(name="echo2", description="d", func=echo_line, args_schema=schema))
    assert by_dict.args_schema == schema and by_dict.invoke({"line": "x"}) == "echo x"
    with pytest.raises(InvalidArgument, match="sandboxed already"):
        sandboxed(single)
    for tool in (wrapped, single, by_dict):
        tool.close()


def test_a_function_that_needs_host_objects_or_non_json_arguments_is_refused_by_cause() -> None:
    def with_run_manager(text: str, run_manager: CallbackManagerForToolRun | None = None) -> str:
        return text

    def with_date(when: datetime.date) -> str:
        return str(when)

    with pytest.raises(InvalidArgument, match="takes run_manager, which its framework fills with a host object"):
        sandboxed(with_run_manager)
    with pytest.raises(InvalidArgument, match="takes when of type date, which is not JSON"):
        sandboxed(with_date)


async def test_an_async_function_and_a_tool_class_ship_as_a_function_does() -> None:
    """An async body runs to its end in the sandbox; a sync call of an async-only tool is refused
    as LangChain's own is. A BaseTool subclass's _run ships without self (run_manager stays None)."""
    from tests.tool_bodies import Upper, add_later

    adder = sandboxed(add_later)
    assert await adder.ainvoke({"a": 2, "b": 40}) == 42
    with pytest.raises(NotImplementedError):
        adder.invoke({"a": 1, "b": 1})
    upper = sandboxed(Upper())
    assert type(upper).__name__ == "Upper" and await upper.ainvoke({"text": "hi"}) == "HI"
    assert await asyncio.to_thread(upper.invoke, {"text": "yo"}) == "YO"
    for tool in (adder, upper):
        await tool.aclose()


def test_a_module_the_body_imports_at_module_level_is_imported_again_in_the_sandbox() -> None:
    tool = sandboxed(uses_module_json)
    assert tool.invoke({"data": '{"a": 1}'}) == '{\n  "a": 1\n}'
    tool.close()
