"""The kernel as an MCP server (``ringzero mcp``), on the official ``mcp`` SDK.

Tools it exposes: run code with the registered tools (``execute_code``), run a task with the
code agent (``execute_task``), discover tools (``list_available_tools``, ``search_tools``),
background tasks (``dispatch_background_task``, ``get_background_task_status``,
``wait_for_background_task``, ``list_background_tasks``, ``cancel_background_task``), durable
key-value state (``get_state``, ``save_state``) and the process table (``list_processes``).
Every run and task is a kernel process in the agent's SQLite store, so background tasks
survive a server restart.

    ringzero mcp --tools myapp.tools:search_docs --tools myapp.tools:fetch          # stdio
    ringzero mcp --transport http --port 8765 ...                                  # 127.0.0.1 only

Over HTTP the server runs code and the host's tools for whoever reaches 127.0.0.1: every local
user and program. So it needs a bearer token (``BearerToken``): a request without it gets 401
and no session. ``Host`` and ``Origin`` are checked as well (no browser reaches it through DNS
rebinding). stdio needs none: only the process that started the server speaks to it.
"""

from __future__ import annotations

import hmac
import json
import logging
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import ringzero
from ringzero.agents import CodeAgent, TaskManager
from ringzero.core.contract.errors import InvalidArgument, MissingExtra, RingzeroError
from ringzero.core.contract.ids import time_ordered_id
from ringzero.core.contract.types import JSON, Checkpoint
from ringzero.core.kernel import Kernel
from ringzero.core.support.tokens import check_token

try:
    import anyio
    from mcp.server.fastmcp import FastMCP
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise MissingExtra("ringzero.adapters.mcp", "mcp") from exc

__all__ = ["BearerToken", "create_server", "serve"]

_STATE_THREAD = "ringzero-mcp-state"

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
App = Callable[[Scope, Receive, Send], Awaitable[None]]




class BearerToken:
    """An ASGI app that lets through only HTTP requests carrying ``Authorization: Bearer
    <token>`` (compared in constant time); any other gets 401 before the MCP app sees it."""

    def __init__(self, app: App, token: str) -> None:
        check_token(token)
        self.app = app
        self._expected = f"Bearer {token}".encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            given = next((value for name, value in scope.get("headers", []) if name.lower() == b"authorization"), b"")
            if not hmac.compare_digest(given, self._expected):
                await send({"type": "http.response.start", "status": 401,
                            "headers": [(b"content-type", b"application/json"),
                                        (b"www-authenticate", b'Bearer realm="ringzero"')]})
                await send({"type": "http.response.body",
                            "body": b'{"error": "this MCP server needs its bearer token (Authorization: Bearer ...)"}'})
                return
        await self.app(scope, receive, send)


class _KernelMCP(FastMCP):
    """FastMCP whose ``serverInfo.version`` is ringzero's (FastMCP takes no version, and would
    report the MCP library's)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._mcp_server.version = ringzero.__version__


def create_server(agent: CodeAgent, *, name: str = "ringzero", host: str = "127.0.0.1", port: int = 8765) -> FastMCP:
    """An MCP server over ``agent``'s kernel (its tools, model and store)."""
    if host not in ("127.0.0.1", "localhost", "::1"):
        raise InvalidArgument(f"the MCP server listens on loopback only, not {host!r}")
    server = _KernelMCP(name, instructions="An agent kernel: run Python with tools in a sandbox, run agent tasks in "
                     "the background, keep state.", host=host, port=port, log_level="WARNING")
    tasks = TaskManager(agent)

    @server.tool()
    async def execute_code(code: str) -> str:
        """Run Python in the sandbox; the registered tools are functions inside it. Returns what the
        code printed and the value of its last expression (or its error)."""
        return await agent.aexecute_code(code)

    @server.tool()
    async def execute_task(task: str) -> dict[str, JSON]:
        """Have the code agent solve a task (it writes and runs code until it has an answer)."""
        return (await agent.aexecute_task(task)).to_dict()

    @server.tool()
    def list_available_tools() -> str:
        """Every registered tool: name(signature): what it does."""
        return agent.registry.describe() or "no tools are registered"

    @server.tool()
    def search_tools(query: str, limit: int = 5) -> str:
        """The registered tools that best match a description of what you need."""
        found = agent.registry.search(query, limit)
        return agent.registry.describe(spec.name for spec in found) or "no matching tools"

    @server.tool()
    async def dispatch_background_task(task: str) -> str:
        """Start a task in the background; returns its id. It survives a server restart."""
        return await tasks.adispatch_task(task)

    @server.tool()
    async def get_background_task_status(task_id: str) -> dict[str, JSON]:
        """Status of a background task: running or ended, and its answer once it has one."""
        return await tasks.aget_status(task_id)

    @server.tool()
    async def wait_for_background_task(task_id: str, timeout_seconds: float = 60.0) -> dict[str, JSON]:
        """Wait (up to timeout_seconds) for a background task to end and return its result."""
        try:
            return (await tasks.await_for_task(task_id, timeout_seconds)).to_dict()
        except TimeoutError:
            return {**await tasks.aget_status(task_id), "timed_out": True}

    @server.tool()
    async def list_background_tasks() -> list[dict[str, JSON]]:
        """Every background task, with its status."""
        return await tasks.alist_tasks()

    @server.tool()
    async def cancel_background_task(task_id: str) -> bool:
        """Stop a background task; false if it had already ended."""
        return await tasks.acancel_task(task_id)

    @server.tool()
    async def save_state(key: str, value: Any) -> str:
        """Keep a JSON value under a key, durably (it survives a server restart)."""
        if not key:
            raise InvalidArgument("a state key must be a non-empty string")
        payload = json.dumps(value).encode()

        async def put(kernel: Kernel) -> None:
            await kernel.checkpointer.put(Checkpoint(_STATE_THREAD, key, time_ordered_id(), payload))

        await agent.host.acall(put)
        return f"saved {key!r}"

    @server.tool()
    async def get_state(key: str) -> Any:
        """The value last saved under a key (null if none)."""
        async def get(kernel: Kernel) -> Any:
            record = await kernel.checkpointer.get(_STATE_THREAD, key)
            return None if record is None else json.loads(record.payload)

        return await agent.host.acall(get)

    @server.tool()
    async def list_processes() -> list[dict[str, JSON]]:
        """The kernel's process table: every run and task, with status and what it spent."""
        async def ps(kernel: Kernel) -> list[dict[str, JSON]]:
            return [{"pid": row.pid, "name": row.name, "status": row.status.value,
                     "stop_reason": row.stop_reason.value if row.stop_reason else None,
                     "llm_calls": row.llm_calls, "tokens": row.tokens, "wall_seconds": round(row.wall_seconds, 3)}
                    for row in await kernel.ps(all=True)]

        return await agent.host.acall(ps)

    return server


def serve(agent: CodeAgent, transport: str = "stdio", port: int = 8765, *, token: str | None = None,
          no_auth: bool = False) -> None:
    """Run the server until it is stopped: ``stdio``, or streamable ``http`` on 127.0.0.1, which
    needs ``token`` (clients send ``Authorization: Bearer <token>``) unless ``no_auth``."""
    if transport not in ("stdio", "http"):
        raise RingzeroError(f"transport must be 'stdio' or 'http', not {transport!r}")
    if transport == "http" and token is None and not no_auth:
        raise InvalidArgument("the MCP server over HTTP needs a bearer token (token=...), or no_auth=True")
    server = create_server(agent, port=port)
    try:
        if transport == "stdio":
            server.run("stdio")
        else:
            anyio.run(_serve_http, server, None if no_auth else token)
    finally:
        agent.close()


class _ClientWentAway(logging.Filter):
    """The MCP library logs an error with a traceback when a client ends its session cleanly
    (its standalone SSE stream's writer finds the stream closed); that is no error: it is left
    out. Any other record passes."""

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        return not isinstance(error, (anyio.ClosedResourceError, anyio.BrokenResourceError, anyio.EndOfStream))


_STREAMABLE_HTTP_LOGGER = "mcp.server.streamable_http"


async def _serve_http(server: FastMCP, token: str | None) -> None:
    """FastMCP's own streamable-HTTP app and server, behind the token where there is one."""
    import uvicorn

    quiet = logging.getLogger(_STREAMABLE_HTTP_LOGGER)
    if not any(isinstance(f, _ClientWentAway) for f in quiet.filters):
        quiet.addFilter(_ClientWentAway())

    app: Any = server.streamable_http_app()
    if token is not None:
        app = BearerToken(app, token)
    config = uvicorn.Config(app, host=server.settings.host, port=server.settings.port,
                            log_level=server.settings.log_level.lower())
    await uvicorn.Server(config).serve()
