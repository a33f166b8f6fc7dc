"""An executor that runs code in a plain subprocess of the host's Python and calls the tools
it was handed itself, as a framework author writes one from the Executor protocol alone.

The child reads the run's request (the code, its inputs, the tools' names) as one JSON line on
stdin and writes JSON lines back: ``call`` for a tool call (answered on its stdin) and
``done`` at the end. The host side calls each tool exactly as it was handed over: awaited when
it is a coroutine function, else in a thread. The child runs as the host's user, with the
host's files and network: that is isolation ``"none"``."""

from __future__ import annotations

import asyncio
import inspect
import json
import sys
import time
from collections.abc import Mapping
from typing import Any

from ringzero import ExecError, ExecLimits, ExecResult, ExecutorCapabilities, Tool, ToolCallRecord

CHILD = r"""
import ast, builtins, contextlib, io, json, os, sys

def send(message):
    sys.__stdout__.write(json.dumps(message) + "\n")
    sys.__stdout__.flush()

def tool(name):
    def call(*args, **kwargs):
        send({"op": "call", "name": name, "args": list(args), "kwargs": kwargs})
        line = sys.stdin.readline()
        if not line:  # the host is gone
            os._exit(1)
        reply = json.loads(line)
        if reply["op"] == "result":
            return reply["value"]
        kind = getattr(builtins, reply["type"], None)
        raise (kind if isinstance(kind, type) and issubclass(kind, Exception) else Exception)(reply["message"])
    return call

request = json.loads(sys.stdin.readline())
scope = dict(request["inputs"])
scope.update({name: tool(name) for name in request["tools"]})
printed = io.StringIO()
try:
    tree = ast.parse(request["code"])
    last = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) else None
    with contextlib.redirect_stdout(printed):
        exec(compile(tree, "<code>", "exec"), scope)
        value = None if last is None else eval(compile(ast.Expression(last.value), "<code>", "eval"), scope)
    send({"op": "done", "value": value, "stdout": printed.getvalue()})
except BaseException as exc:
    send({"op": "done", "error": {"type": type(exc).__name__, "message": str(exc)}, "stdout": printed.getvalue()})
"""


class PipeExecutor:
    """Code in a subprocess; tool calls come back over its pipes and are made here."""

    capabilities = ExecutorCapabilities(isolation="none", full_cpython=True, tools=True)

    def __init__(self, wall_seconds: float = 30.0) -> None:
        self.wall_seconds = wall_seconds

    async def run(self, code: str, *, inputs: Mapping[str, Any] | None = None,
                  tools: Mapping[str, Tool] | None = None, limits: ExecLimits | None = None) -> ExecResult:
        tools = dict(tools or {})
        wall = limits.wall_seconds if limits is not None and limits.wall_seconds is not None else self.wall_seconds
        started = time.perf_counter()
        child = await asyncio.create_subprocess_exec(sys.executable, "-c", CHILD, stdin=asyncio.subprocess.PIPE,
                                                     stdout=asyncio.subprocess.PIPE, limit=2**24)
        assert child.stdin is not None and child.stdout is not None
        child.stdin.write(json.dumps({"code": code, "inputs": dict(inputs or {}), "tools": sorted(tools)}).encode()
                          + b"\n")
        records: list[ToolCallRecord] = []
        try:
            done = await asyncio.wait_for(self._converse(child, tools, records), wall)
        except asyncio.TimeoutError:
            await self.stop(child)
            return ExecResult(error=self.timed_out(wall), duration=time.perf_counter() - started,
                              tool_calls=tuple(records))
        await child.wait()
        error = done.get("error")
        return ExecResult(value=done.get("value"), stdout=done.get("stdout", ""),
                          error=None if error is None else ExecError(error["type"], error["message"]),
                          duration=time.perf_counter() - started, tool_calls=tuple(records))

    async def _converse(self, child: asyncio.subprocess.Process, tools: dict[str, Tool],
                        records: list[ToolCallRecord]) -> dict[str, Any]:
        assert child.stdin is not None and child.stdout is not None
        while True:
            line = await child.stdout.readline()
            if not line:
                return {"error": {"type": "RuntimeError", "message": "the child exited without an answer"}}
            message = json.loads(line)
            if message["op"] == "done":
                return dict(message)
            name, args, kwargs = message["name"], message["args"], message["kwargs"]
            try:
                tool = tools[name]
                if inspect.iscoroutinefunction(tool):
                    value = await tool(*args, **kwargs)
                else:
                    value = await asyncio.to_thread(tool, *args, **kwargs)
                reply = {"op": "result", "value": value}
                records.append(ToolCallRecord(name, args, kwargs, value))
            except Exception as exc:
                reply = {"op": "error", "type": type(exc).__name__, "message": str(exc)}
                records.append(ToolCallRecord(name, args, kwargs, None, f"{type(exc).__name__}: {exc}"))
            child.stdin.write(json.dumps(reply).encode() + b"\n")
            await child.stdin.drain()

    async def stop(self, child: asyncio.subprocess.Process) -> None:
        """The run is over: its child goes, with whatever it was doing."""
        child.kill()
        await child.wait()

    def timed_out(self, wall: float) -> ExecError:
        """The run's outcome when it passed its wall limit: the executor's, not the code's."""
        return ExecError("TimeoutError", f"the code ran past {wall} s", origin="executor")

    async def aclose(self) -> None:
        """Nothing is kept between runs."""
