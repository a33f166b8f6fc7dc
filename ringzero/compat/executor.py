"""The Executor conformance kit: what every Executor must do, run against yours.

Subclass ``ExecutorConformance`` in your tests and provide an ``executor`` fixture that
yields a fresh instance of your backend (and closes it afterwards)::

    import pytest_asyncio
    from ringzero.compat.executor import ExecutorConformance

    class TestMyExecutor(ExecutorConformance):
        @pytest_asyncio.fixture
        async def executor(self):
            instance = MyExecutor()
            yield instance
            await instance.aclose()

The tests need pytest-asyncio (``pytest -p ringzero.compat`` checks it is there). They check
what ``capabilities`` declares: the tool tests run only where ``tools`` is True, the limit tests
for each limit named in ``enforces``. Tools are handed over as ``ctx.exec`` hands them (bound to
the kernel's boundary, ``ringzero.core.support.tool_boundary.bound_tools``), so an executor that
calls them itself is judged with what the kernel adds.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from pathlib import Path

import pytest

from ringzero.core.contract.protocols import Executor, Tool, backend_problems
from ringzero.core.contract.types import JSON, ExecLimits, ExecResult
from ringzero.core.support.tool_boundary import bound_tools
from ringzero.core.support.tool_parameters import code_may_set

__all__ = ["ExecutorConformance", "run"]


def needs_tools(executor: Executor) -> None:
    if not executor.capabilities.tools:
        pytest.skip("this executor declares no host tools (capabilities.tools is False)")


def needs_limit(executor: Executor, limit: str) -> None:
    if limit not in executor.capabilities.enforces:
        pytest.skip(f"this executor does not declare that it enforces {limit} (capabilities.enforces)")


async def run(executor: Executor, code: str, *, inputs: Mapping[str, JSON] | None = None,
              tools: Mapping[str, Tool] | None = None, limits: ExecLimits | None = None) -> ExecResult:
    """``executor.run`` with ``tools`` handed over as ``ctx.exec`` hands them."""
    return await executor.run(code, inputs=inputs, tools=None if tools is None else bound_tools(tools, limits),
                              limits=limits)


@pytest.mark.asyncio
class ExecutorConformance:
    """Values, stdout, user errors as data, limits, and tools called as plain functions with
    JSON values, exceptions crossing back, and every call seen by the host."""

    async def test_it_is_an_executor(self, executor: Executor) -> None:
        """What ``Kernel(executor=...)`` checks: every member of the protocol is there."""
        assert backend_problems(executor, Executor) == []
        assert executor.capabilities.isolation in ("none", "interpreter", "process", "microvm")
        assert "wall_seconds" in executor.capabilities.enforces, "every executor enforces wall_seconds"

    async def test_the_last_expression_is_the_value_and_print_is_captured(self, executor: Executor) -> None:
        result = await executor.run("total = a + b\nprint('sum', total)\ntotal * 2", inputs={"a": 2, "b": 3})
        assert (result.value, result.stdout, result.error) == (10, "sum 5\n", None)

    async def test_inputs_arrive_as_json_values(self, executor: Executor) -> None:
        data: JSON = {"rows": [{"k": "x", "v": 1.5}, {"k": "y", "v": None}], "ok": True}
        assert (await executor.run("data", inputs={"data": data})).value == data

    async def test_an_exception_in_the_code_is_data(self, executor: Executor) -> None:
        result = await executor.run("def f():\n    raise ValueError('bad input')\nf()")
        assert result.error is not None and (result.error.type, result.error.message) == ("ValueError", "bad input")
        assert (await executor.run("1 + 1")).value == 2  # and the executor serves the next run

    async def test_what_the_code_printed_before_it_raised_is_kept(self, executor: Executor) -> None:
        """The run's stdout is the code's, error or not: what it printed on its way to a failure
        is how a model (or a person) finds out why."""
        result = await executor.run("print('step 1 done')\nprint('step 2...')\nraise KeyError('price')")
        assert result.error is not None and result.error.type == "KeyError", result
        assert result.stdout == "step 1 done\nstep 2...\n", (
            f"the code printed two lines before it raised; stdout came back as {result.stdout!r}")

    async def test_a_syntax_error_is_data(self, executor: Executor) -> None:
        result = await executor.run("def broken(:\n    pass")
        assert result.error is not None and result.error.type == "SyntaxError"

    async def test_tools_are_plain_functions_with_json_arguments_and_results(self, executor: Executor) -> None:
        needs_tools(executor)

        @code_may_set("limit")
        def search_docs(query: str, limit: int = 2) -> list[dict[str, object]]:
            return [{"title": f"{query} {i}", "score": 1.0 / (i + 1)} for i in range(limit)]

        result = await run(executor, "hits = search_docs('kernel', limit=3)\n[h['title'] for h in hits]",
                                    tools={"search_docs": search_docs})
        assert result.value == ["kernel 0", "kernel 1", "kernel 2"]
        [call] = result.tool_calls
        assert (call.name, call.args, call.kwargs) == ("search_docs", ["kernel"], {"limit": 3})

    async def test_a_tool_s_other_defaults_stay_the_host_s(self, executor: Executor) -> None:
        """A parameter with a default is the host's unless the tool declares it
        (``code_may_set``), however the code passes it: ``HostTools`` decides this for you."""
        needs_tools(executor)
        seen: list[str] = []

        def fetch(path: str, base_url: str = "https://api.example.com") -> str:
            seen.append(base_url)
            return base_url + path

        code = ("out = []\nfor call in (lambda: fetch('/a', 'http://127.0.0.1:9'), "
                "lambda: fetch('/b', base_url='http://127.0.0.1:9')):\n    try:\n        call()\n"
                "    except TypeError:\n        out.append('refused')\nout.append(fetch('/c'))\nout")
        result = await run(executor, code, tools={"fetch": fetch})
        assert result.value == ["refused", "refused", "https://api.example.com/c"], result
        assert seen == ["https://api.example.com"]

    async def test_async_tools_are_plain_functions_too(self, executor: Executor) -> None:
        needs_tools(executor)
        async def fetch(url: str) -> str:
            await asyncio.sleep(0.01)
            return f"<page {url}>"

        result = await run(executor, "[fetch(u) for u in urls]", inputs={"urls": ["a", "b"]}, tools={"fetch": fetch})
        assert result.value == ["<page a>", "<page b>"]

    async def test_a_host_tool_exception_can_be_caught_by_the_code(self, executor: Executor) -> None:
        needs_tools(executor)
        def lookup(key: str) -> str:
            raise KeyError(key)

        code = ("try:\n    lookup('missing')\n    out = 'no error'\n"
                "except KeyError as e:\n    out = 'caught'\nout")
        result = await run(executor, code, tools={"lookup": lookup})
        assert result.value == "caught"
        assert result.tool_calls[0].error == "KeyError: 'missing'"  # the host's record has the whole error

    async def test_a_tool_error_s_message_reaches_the_code(self, executor: Executor) -> None:
        """A ``ToolError`` is how a tool tells the code why it failed; other exceptions' texts may
        stay with the host (the built-in executors show their type only)."""
        from ringzero.core.contract.errors import ToolError

        needs_tools(executor)
        def lookup(key: str) -> str:
            raise ToolError(f"no city named {key}")

        code = "try:\n    lookup('Atlantis')\n    out = 'no error'\nexcept Exception as e:\n    out = str(e)\nout"
        result = await run(executor, code, tools={"lookup": lookup})
        assert isinstance(result.value, str) and "no city named Atlantis" in result.value, result

    async def test_the_host_sees_every_tool_call(self, executor: Executor) -> None:
        needs_tools(executor)
        seen: list[int] = []

        def record(i: int) -> int:
            seen.append(i)
            return i

        result = await run(executor, "[record(i) for i in range(100)]", tools={"record": record})
        assert seen == list(range(100)) and len(result.tool_calls) == 100

    async def test_every_tool_call_is_journaled_whatever_the_executor_does(self, executor: Executor) -> None:
        """The tools ``ctx.exec`` hands ``run`` are bound to the process's journal: each call the
        code makes is journaled under the exec's slot, so that a resumed program's code gets the
        recorded results and no call runs twice."""
        from ringzero.checkpointers.memory import MemoryCheckpointer
        from ringzero.core.context import Context
        from ringzero.core.kernel import Kernel

        needs_tools(executor)

        def lookup(key: str) -> str:
            return key.upper()

        async def program(ctx: Context) -> JSON:
            return (await ctx.exec("[lookup('a'), lookup('b')]", tools={"lookup": lookup})).value

        store = MemoryCheckpointer()
        async with Kernel(checkpointer=store, executor=executor) as kernel:
            handle = await kernel.spawn(program)
            assert await handle.wait() == ["A", "B"]
            calls = sorted([cp.id async for cp in store.list(f"ringzero/process/{handle.pid}", "calls")])
        assert len(calls) == 2, f"{len(calls)} of the code's 2 tool calls were journaled"

    async def test_the_wall_time_limit_stops_a_run_that_sleeps(self, executor: Executor) -> None:
        """A timeout is the executor's outcome (``ExecError.origin`` ``"executor"``), never the
        code's: the code may raise TimeoutError itself, and the two must not be confused."""
        started = time.perf_counter()
        result = await executor.run("import time\ntime.sleep(2)\n'woke'", limits=ExecLimits(wall_seconds=0.3))
        assert result.error is not None and result.error.type == "TimeoutError"
        assert result.error.origin == "executor", "a timeout was reported as the code's own error"
        assert time.perf_counter() - started < 3
        own = await executor.run("raise TimeoutError('mine')")
        assert own.error is not None and (own.error.type, own.error.origin) == ("TimeoutError", "code")

    async def test_a_timeout_stops_the_code_for_good(self, executor: Executor, tmp_path: Path) -> None:
        """After the wall limit the code is gone: nothing it would have done later happens (a
        tool it calls later, and, where it shares the host's files, a file it writes later)."""
        late = tmp_path / "written-late"
        marks: list[str] = []

        def mark() -> None:
            marks.append("called")

        lines = ["import time", "time.sleep(0.6)"]
        if executor.capabilities.isolation == "none":
            lines.append(f"open({str(late)!r}, 'w').write('late')")
        tools = {"mark": mark} if executor.capabilities.tools else None
        if tools:
            lines.append("mark()")
        result = await run(executor, "\n".join(lines), tools=tools, limits=ExecLimits(wall_seconds=0.3))
        assert result.error is not None and result.error.type == "TimeoutError"
        await asyncio.sleep(1.2)  # the code, had it run on, would have acted 0.3 s after the run returned
        assert not late.exists(), "the code ran on after its timeout and wrote a file"
        assert marks == [], "the code ran on after its timeout and called a tool"

    async def test_the_memory_limit_stops_a_run_that_allocates_too_much(self, executor: Executor) -> None:
        needs_limit(executor, "memory_bytes")
        result = await executor.run("blob = 'x' * (512 * 1024 * 1024)\nlen(blob)",
                                    limits=ExecLimits(memory_bytes=128 * 1024 * 1024, wall_seconds=20))
        assert result.error is not None and result.value is None, result
        assert (await executor.run("1 + 1")).value == 2  # and the executor serves the next run

    async def test_the_output_limit_caps_what_is_printed_and_returned(self, executor: Executor) -> None:
        needs_limit(executor, "output_bytes")
        printed = await executor.run("print('x' * 100000)", limits=ExecLimits(output_bytes=10000))
        assert len(printed.stdout) <= 10000 + 100, f"{len(printed.stdout)} characters of stdout came back"
        returned = await executor.run("'y' * 100000", limits=ExecLimits(output_bytes=10000))
        assert returned.value is None and returned.error is not None, "a value over output_bytes came back"

    async def test_a_tool_result_over_tool_bytes_reaches_the_code_as_a_value_error(self, executor: Executor) -> None:
        needs_tools(executor)

        def page() -> str:
            return "z" * 50000

        code = "try:\n    page()\n    out = 'returned'\nexcept ValueError:\n    out = 'refused'\nout"
        result = await run(executor, code, tools={"page": page}, limits=ExecLimits(tool_bytes=1000))
        assert result.value == "refused", result

    async def test_an_undefined_name_is_a_name_error(self, executor: Executor) -> None:
        result = await executor.run("not_a_tool(1)")
        assert result.error is not None and result.error.type == "NameError"
