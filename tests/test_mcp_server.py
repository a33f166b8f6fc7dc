"""`ringzero mcp` served over stdio, driven by the official MCP SDK's own client.

The server's model is OpenAIProvider talking to a local server in OpenAI's wire format (on
127.0.0.1), which answers as a scripted model would.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

from ringzero.compat.vendor_servers import openai_model, vendor_server
from tests.agent_tools import expected_totals
from tests.test_agents import sales_script

ROOT = Path(__file__).resolve().parent.parent


def text_of(result: Any) -> str:
    assert not result.isError, result.content
    return "\n".join(part.text for part in result.content)


async def test_an_mcp_client_lists_the_tools_runs_code_and_manages_background_tasks(tmp_path: Path) -> None:
    with vendor_server("openai", [openai_model(sales_script)] * 4) as model_server:
        env = {**os.environ, "PYTHONPATH": str(ROOT), "OPENAI_BASE_URL": model_server.url,
               "OPENAI_API_KEY": "sk-test", "OPENAI_MODEL": "gpt-test"}
        env.pop("ANTHROPIC_API_KEY", None)
        params = StdioServerParameters(
            command=sys.executable, cwd=str(ROOT), env=env,
            args=["-m", "ringzero.cli", "mcp", "--state-dir", str(tmp_path),
                  "--tools", "tests.agent_tools:load_sales", "--tools", "tests.agent_tools:get_weather"])
        async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
            await session.initialize()
            names = {tool.name for tool in (await session.list_tools()).tools}
            assert names == {"execute_code", "execute_task", "list_available_tools", "search_tools",
                             "dispatch_background_task", "get_background_task_status", "wait_for_background_task",
                             "list_background_tasks", "cancel_background_task", "get_state", "save_state",
                             "list_processes"}

            ran = text_of(await session.call_tool("execute_code", {
                "code": "print(get_weather('Paris'))\nlen(load_sales(100))"}))
            assert ran == "sunny\nResult: 100"
            hostile = text_of(await session.call_tool("execute_code", {"code": "open('/etc/passwd').read()"}))
            assert hostile.startswith("Error: ")
            assert "get_weather(city: str) -> str" in text_of(await session.call_tool("list_available_tools", {}))
            assert text_of(await session.call_tool("search_tools", {"query": "weather forecast", "limit": 1})
                           ).startswith("- get_weather(")

            task_id = text_of(await session.call_tool("dispatch_background_task", {"task": "Sales by region?"}))
            done = json.loads(text_of(await session.call_tool("wait_for_background_task",
                                                              {"task_id": task_id, "timeout_seconds": 30})))
            assert done["answer"] == expected_totals(1000) and done["error"] is None
            status = json.loads(text_of(await session.call_tool("get_background_task_status", {"task_id": task_id})))
            assert status["status"] == "exited" and status["llm_calls"] == 2
            listed = await session.call_tool("list_background_tasks", {})
            assert task_id in text_of(listed)
            assert text_of(await session.call_tool("cancel_background_task", {"task_id": task_id})) == "false"

            await session.call_tool("save_state", {"key": "plan", "value": {"step": 2, "done": ["a"]}})
            assert json.loads(text_of(await session.call_tool("get_state", {"key": "plan"}))) == {
                "step": 2, "done": ["a"]}
            processes = text_of(await session.call_tool("list_processes", {}))
            assert '"name": "code"' in processes and '"name": "task"' in processes
    assert len(model_server.requests) == 2  # the task's two model calls, through OpenAI's wire format


class HttpServer:
    """A ``ringzero mcp --transport http`` process on a free port of 127.0.0.1."""

    def __init__(self, port: int, process: asyncio.subprocess.Process) -> None:
        self.port, self.process = port, process
        self.url = f"http://127.0.0.1:{port}/mcp"
        self.stderr = b""
        """What it printed, once it stopped."""


@contextlib.asynccontextmanager
async def mcp_over_http(*args: str, cwd: Path, env: dict[str, str] | None = None) -> AsyncIterator[HttpServer]:
    """Start the server with these arguments, wait until it listens; stop it when the block ends."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "ANTHROPIC_", "RINGZERO_MCP"))}
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "ringzero.cli", "mcp", "--transport", "http", "--port", str(port), *args, cwd=cwd,
        env={**clean, "PYTHONPATH": str(ROOT), **(env or {})}, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    server = HttpServer(port, process)
    try:
        for _ in range(400):  # until it listens
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                await asyncio.sleep(0.05)
        yield server
    finally:
        process.terminate()
        _, server.stderr = await asyncio.wait_for(process.communicate(), 10)  # reaps it, closes its pipe


async def test_the_mcp_server_over_streamable_http_on_loopback(tmp_path: Path) -> None:
    import httpx
    from mcp.client.streamable_http import streamable_http_client

    async with mcp_over_http("--state-dir", str(tmp_path), "--tools", "tests.agent_tools:get_weather", cwd=ROOT,
                             env={"RINGZERO_MCP_TOKEN": "a-token-for-this-test"}) as server:
        client = httpx.AsyncClient(headers={"Authorization": "Bearer a-token-for-this-test"})
        async with client, streamable_http_client(server.url, http_client=client) as (read, write, _), \
                ClientSession(read, write) as session:
            await session.initialize()
            ran = await session.call_tool("execute_code", {"code": "get_weather('Oslo')"})
            assert text_of(ran) == "Result: 'snow'"
            no_model = await session.call_tool("execute_task", {"task": "anything"})
            assert no_model.isError and "no LLM provider" in no_model.content[0].text  # type: ignore[union-attr]


async def test_a_client_that_ends_its_session_cleanly_leaves_no_error_in_the_server_s_log(tmp_path: Path) -> None:
    """The MCP library logged an error with a traceback for every clean disconnect (its SSE
    writer finding the stream closed); an operator reading the log took each for a failure."""
    import httpx
    from mcp.client.streamable_http import streamable_http_client

    async with mcp_over_http("--state-dir", str(tmp_path), "--tools", "tests.agent_tools:get_weather", cwd=ROOT,
                             env={"RINGZERO_MCP_TOKEN": "a-token-for-this-test"}) as server:
        for _ in range(2):
            client = httpx.AsyncClient(headers={"Authorization": "Bearer a-token-for-this-test"})
            async with client, streamable_http_client(server.url, http_client=client) as (read, write, _), \
                    ClientSession(read, write) as session:
                await session.initialize()
                assert text_of(await session.call_tool("execute_code", {"code": "get_weather('Oslo')"})) == \
                    "Result: 'snow'"
        await asyncio.sleep(0.5)  # the server notices the closed streams
    log = server.stderr.decode()
    assert "Traceback" not in log and "ERROR" not in log, log[-2000:]
