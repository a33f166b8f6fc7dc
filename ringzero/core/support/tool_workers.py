"""Worker processes for host tools declared ``cpu_bound``: a tool that holds the GIL runs there,
so the host's event loop keeps its pace.

What ``concurrent.futures.ProcessPoolExecutor`` did not do, and this does:

- **The result is judged in the worker.** It is made JSON there and checked against the
  caller's byte limit (a run's ``tool_bytes``), so a tool that returns fifteen million items
  costs the host one refusal, not the memory and the seconds of unpickling them first.
- **A worker whose caller stopped waiting is killed**, and a fresh one takes its place when a
  call needs it: a slow call (a ReDoS input) cannot hold a worker past its run's wall limit.
- **A worker that dies** (a segfault, an OOM kill) fails its own call with ``ToolCrashed``;
  the next call starts a fresh worker, where a broken pool failed every later call.

Workers start from a ``forkserver`` (none inherits the host's threads, locks or event loop)
as calls need them, at most ``size`` at once, and stay for the next call. Each call's
exchange with its worker runs on a thread of its own, so that nothing on the event loop waits
on a pipe.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import multiprocessing
import pickle
import threading
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

from ringzero.core.contract.errors import ResultRefused, ToolCrashed, exception_named
from ringzero.core.support.json_cost import measure

__all__ = ["ToolWorkers", "as_exception"]

_EXCEPTION_BYTES = 64 * 1024
"""A tool's exception larger than this, pickled, comes back as its type and clipped text."""


def as_exception(exc: BaseException) -> Exception:
    """An Exception of ``exc``'s name and arguments: what a tool's SystemExit, KeyboardInterrupt
    or GeneratorExit becomes, so that every handler of a tool's failure sees it, and it never
    reaches the event loop (which stops on either of the first two)."""
    return exception_named(type(exc).__name__)(*exc.args)


class _Worker:
    """One worker process and the host's end of its pipe."""

    def __init__(self, context: Any) -> None:
        self.conn, child = context.Pipe()
        self.process = context.Process(target=_serve, args=(child,), daemon=True, name="ringzero-cpu-bound")
        self.process.start()
        child.close()

    def stop(self) -> None:
        """Kill the worker (its pipe closes: a call waiting on it ends)."""
        with contextlib.suppress(Exception):
            self.process.kill()
        with contextlib.suppress(Exception):
            self.conn.close()

    def death(self) -> str:
        """How the worker ended, once it has."""
        self.process.join(1)
        code = self.process.exitcode
        return f"killed by signal {-code}" if code is not None and code < 0 else f"exit status {code}"


class _Call:
    """One call's hand-off between the event loop and the call's thread."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.worker: _Worker | None = None
        self.abandoned = False


class ToolWorkers:
    """At most ``size`` worker processes for cpu_bound tools."""

    def __init__(self, size: int = 2) -> None:
        if not isinstance(size, int) or isinstance(size, bool) or size < 1:
            raise ValueError(f"cpu_bound tools need at least one worker process, not {size!r}")
        self.size = size
        self._idle: list[_Worker] = []
        self._free: asyncio.Semaphore | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._context = multiprocessing.get_context("forkserver")
        self.replaced = 0
        """Workers killed because their caller stopped waiting, or found dead."""

    def _slots(self) -> asyncio.Semaphore:
        loop = asyncio.get_running_loop()
        if self._free is None or self._loop is not loop:  # a semaphore belongs to one loop
            self._free, self._loop = asyncio.Semaphore(self.size), loop
        return self._free

    async def run(self, tool: Callable[..., Any], args: list[Any], kwargs: dict[str, Any],
                  result_bytes: int | None = None) -> Any:
        """Call ``tool(*args, **kwargs)`` in a worker; its result as JSON data, refused
        (``ResultRefused``) where its JSON is over ``result_bytes`` or is not JSON. Cancelling
        the wait kills the worker."""
        name = str(getattr(tool, "__name__", None) or type(tool).__name__)
        request = pickle.dumps((tool, args, kwargs, result_bytes, name))
        async with self._slots():
            call = _Call()
            loop = asyncio.get_running_loop()
            done: asyncio.Future[bytes | BaseException] = loop.create_future()
            idle = self._idle.pop() if self._idle else None
            threading.Thread(target=self._exchange, args=(call, idle, request, done), daemon=True,
                             name="ringzero-cpu-bound-call").start()
            try:
                reply = await asyncio.shield(done)
            except asyncio.CancelledError:
                with call.lock:
                    call.abandoned = True
                    worker = call.worker
                if worker is not None:
                    self.replaced += 1
                    worker.stop()
                raise
            if isinstance(reply, BaseException):
                raise reply
            assert call.worker is not None
            self._idle.append(call.worker)
        return _answer(reply)

    def _exchange(self, call: _Call, worker: _Worker | None, request: bytes,
                  done: asyncio.Future[bytes | BaseException]) -> None:
        """On the call's own thread: start a worker if none is idle, send, wait for the reply."""
        outcome: bytes | BaseException
        try:
            if worker is None or not worker.process.is_alive():
                worker = _Worker(self._context)
            with call.lock:
                call.worker = worker
                abandoned = call.abandoned
            if abandoned:  # the caller gave up while the worker started
                worker.stop()
                return
            worker.conn.send_bytes(request)
            outcome = worker.conn.recv_bytes()
        except Exception as failure:  # the worker died (or was killed for its caller), or could not start
            outcome = failure
            if worker is not None:
                worker.stop()
                self.replaced += not call.abandoned
                outcome = ToolCrashed(f"the worker process running a cpu_bound tool died ({worker.death()}); the "
                                      "next call starts a fresh one")
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits any more
            done.get_loop().call_soon_threadsafe(_settle, done, outcome)

    def close(self) -> None:
        """Stop the idle workers; a call in flight ends with its worker."""
        idle, self._idle = self._idle, []
        for worker in idle:
            worker.stop()


def _settle(done: asyncio.Future[Any], outcome: Any) -> None:
    if not done.done():  # a result, never an exception: nobody may be waiting to retrieve it
        done.set_result(outcome)


def _answer(reply: bytes) -> Any:
    kind, body = reply[:1], reply[1:]
    if kind == b"V":
        return json.loads(body)
    if kind == b"R":
        raise ResultRefused(body.decode())
    if kind == b"X":
        name, message = json.loads(body)
        raise exception_named(name)(message)
    raise pickle.loads(body)


def _serve(conn: Connection) -> None:  # pragma: no cover - runs in the worker process
    """A worker's life: calls in, replies out, until the host goes."""
    while True:
        try:
            request = conn.recv_bytes()
        except (EOFError, OSError):
            return
        try:
            tool, args, kwargs, limit, name = pickle.loads(request)
            result = tool(*args, **kwargs)
        except BaseException as exc:
            conn.send_bytes(_exception(exc))
            continue
        _, problem = measure(result, f"the result of {name}()", limit)
        if problem is not None:
            conn.send_bytes(b"R" + problem.encode())
        else:
            conn.send_bytes(b"V" + json.dumps(result, separators=(",", ":"), allow_nan=False).encode())


def _exception(exc: BaseException) -> bytes:
    """A tool's exception as it travels: pickled, or where that fails or is too large, its type
    and clipped text."""
    if isinstance(exc, Exception):
        try:
            data = pickle.dumps(exc)
            if len(data) <= _EXCEPTION_BYTES:
                pickle.loads(data)
                return b"E" + data
        except Exception:
            pass
    return b"X" + json.dumps([type(exc).__name__, str(exc)[:2000]]).encode()
