"""What every Executor must do: values, stdout, user errors as data, limits, and tools
called as plain functions with JSON values, exceptions crossing back, every call seen."""

from __future__ import annotations

import asyncio
import time

from ringzero.core.protocols import Executor
from ringzero.core.types import ExecLimits


async def test_the_last_expression_is_the_value_and_print_is_captured(executor: Executor) -> None:
    result = await executor.run("total = a + b\nprint('sum', total)\ntotal * 2", inputs={"a": 2, "b": 3})
    assert (result.value, result.stdout, result.error) == (10, "sum 5\n", None)


async def test_inputs_arrive_as_json_values(executor: Executor) -> None:
    data = {"rows": [{"k": "x", "v": 1.5}, {"k": "y", "v": None}], "ok": True}
    assert (await executor.run("data", inputs={"data": data})).value == data


async def test_an_exception_in_the_code_is_data(executor: Executor) -> None:
    result = await executor.run("def f():\n    raise ValueError('bad input')\nf()")
    assert result.error is not None and (result.error.type, result.error.message) == ("ValueError", "bad input")
    assert (await executor.run("1 + 1")).value == 2  # and the executor serves the next run


async def test_a_syntax_error_is_data(executor: Executor) -> None:
    result = await executor.run("def broken(:\n    pass")
    assert result.error is not None and result.error.type == "SyntaxError"


async def test_tools_are_plain_functions_with_json_arguments_and_results(executor: Executor) -> None:
    def search_docs(query: str, limit: int = 2) -> list[dict[str, object]]:
        return [{"title": f"{query} {i}", "score": 1.0 / (i + 1)} for i in range(limit)]

    result = await executor.run("hits = search_docs('kernel', limit=3)\n[h['title'] for h in hits]",
                                tools={"search_docs": search_docs})
    assert result.value == ["kernel 0", "kernel 1", "kernel 2"]
    [call] = result.tool_calls
    assert (call.name, call.args, call.kwargs) == ("search_docs", ["kernel"], {"limit": 3})


async def test_async_tools_are_plain_functions_too(executor: Executor) -> None:
    async def fetch(url: str) -> str:
        await asyncio.sleep(0.01)
        return f"<page {url}>"

    result = await executor.run("[fetch(u) for u in urls]", inputs={"urls": ["a", "b"]}, tools={"fetch": fetch})
    assert result.value == ["<page a>", "<page b>"]


async def test_a_host_tool_exception_can_be_caught_by_the_code(executor: Executor) -> None:
    def lookup(key: str) -> str:
        raise KeyError(key)

    code = "try:\n    lookup('missing')\n    out = 'no error'\nexcept KeyError as e:\n    out = 'caught ' + str(e)\nout"
    result = await executor.run(code, tools={"lookup": lookup})
    assert result.value == "caught 'missing'"
    assert result.tool_calls[0].error == "KeyError: 'missing'"


async def test_the_host_sees_every_tool_call(executor: Executor) -> None:
    seen: list[int] = []

    def record(i: int) -> int:
        seen.append(i)
        return i

    result = await executor.run("[record(i) for i in range(100)]", tools={"record": record})
    assert seen == list(range(100)) and len(result.tool_calls) == 100


async def test_the_wall_time_limit_stops_a_run_that_sleeps(executor: Executor) -> None:
    started = time.perf_counter()
    result = await executor.run("import time\ntime.sleep(2)\n'woke'", limits=ExecLimits(wall_seconds=0.3))
    assert result.error is not None and result.error.type == "TimeoutError"
    assert time.perf_counter() - started < 3


async def test_an_undefined_name_is_a_name_error(executor: Executor) -> None:
    result = await executor.run("not_a_tool(1)")
    assert result.error is not None and result.error.type == "NameError"
