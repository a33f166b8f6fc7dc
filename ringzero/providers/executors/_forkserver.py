"""The ProcessExecutor's fork server, and the runner that executes code inside the sandbox.

Started once per executor as ``python -m ringzero.providers.executors._forkserver FD PRELOAD
SCRATCH_ROOT WARM``, it imports the preloaded modules (so that forks start warm), probes which
confinement controls this host enforces, and keeps WARM confined inits ready: each was forked
into new namespaces, confined by Landlock (with its own scratch directory), seccomp and an
unprivileged uid, and waits. A request from the host carries one end of a socket pair; the
server greets the host on it (``pid``, ``scratch``) and hands it to a ready init, which applies
the run's rlimits and speaks a length-prefixed JSON protocol with the host: ``run`` (from the
host), ``call``/``result``/``error`` for host tools, and ``done`` (or ``failed``).
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import signal
import socket
import sys
import tempfile
from typing import Any

from ringzero.providers.executors import _confine
from ringzero.providers.executors._runner import frame, read_frame, run_code

__all__ = ["recv_msg", "send_msg"]


def send_msg(sock: socket.socket, message: Any) -> None:
    sock.sendall(frame(message))


def recv_msg(sock: socket.socket) -> Any:
    def exactly(n: int) -> bytes:
        chunks = b""
        while len(chunks) < n:
            chunk = sock.recv(n - len(chunks))
            if not chunk:
                raise EOFError("the host closed the connection")
            chunks += chunk
        return chunks

    return read_frame(exactly)


def confine(controls: list[str], scratch: str, keep_read_search: bool, workspace: str = "") -> None:
    """The controls that do not depend on a run's limits, in the order that keeps each possible.
    The run may write only in its scratch directory and, when one is given, the workspace."""
    if "landlock" in controls:
        _confine.landlock(_confine.readable_paths(), [scratch, *([workspace] if workspace else [])])
    if "seccomp" in controls:
        _confine.seccomp_deny()
    if "unprivileged" in controls:
        _confine.drop_privileges(keep_read_search=keep_read_search)


def limit(controls: list[str], limits: dict[str, Any]) -> None:
    """The run's own limits: lowering rlimits needs no privilege, so they come last."""
    if "rlimits" in controls:
        _confine.limit_resources(
            cpu_seconds=int(limits["cpu_seconds"]), memory_bytes=int(limits["memory_bytes"]),
            file_bytes=int(limits["file_bytes"]), open_files=64, processes=int(limits["processes"]),
        )


class _Ready:
    """A confined init waiting for its run: its link to us and its scratch dir. Its host pid
    arrives on the link once its namespaces exist; it is read only when the run is handed over,
    so that the fork server never waits for a spawn to finish."""

    def __init__(self, link: socket.socket, scratch: str) -> None:
        self.link, self.scratch = link, scratch

    def pid(self) -> int:
        return int(recv_msg(self.link)["pid"])


def spawn_ready(controls: list[str], scratch_root: str, control: socket.socket, workspace: str = "") -> _Ready:
    """Fork a process, give it new namespaces, fork its init, confine the init; it then waits."""
    scratch = tempfile.mkdtemp(prefix="run-", dir=scratch_root)
    if os.geteuid() == 0 and "unprivileged" in controls:
        os.chown(scratch, _confine.NOBODY, _confine.NOBODY)
    ours, theirs = socket.socketpair()
    if os.fork() == 0:
        ours.close()
        control.close()
        try:
            _prepare(theirs, controls, scratch, workspace)
        finally:
            os._exit(0)  # the fork server went away mid-spawn: leave quietly
    theirs.close()
    return _Ready(ours, scratch)


def _prepare(link: socket.socket, controls: list[str], scratch: str, workspace: str) -> None:
    """In the forked process: namespaces, then the init that confines itself and waits."""
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    os.setsid()
    if "namespaces" in controls:
        _confine.enter_namespaces()
    init = os.fork()
    if init:
        send_msg(link, {"pid": init})
        link.close()
        os.waitpid(init, 0)
        os._exit(0)
    devnull = os.open("/dev/null", os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    os.environ.update(HOME=scratch, TMPDIR=scratch, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1",
                      RINGZERO_WORKSPACE=workspace)
    failure = None
    try:
        confine(controls, scratch, KEEP_READ_SEARCH, workspace)
        os.chdir(scratch)
    except BaseException as exc:  # reported to the run instead of running unconfined
        failure = f"{type(exc).__name__}: {exc}"
    data, fds, _, _ = socket.recv_fds(link, 65536, 1)
    if not data or not fds:
        os._exit(0)  # the fork server is gone
    conn = socket.socket(fileno=fds[0])
    os.register_at_fork(after_in_child=conn.close)  # processes the code forks must not speak for it
    try:
        if failure is not None:
            raise RuntimeError(failure)
        header = json.loads(data)
        limit(controls, header["limits"])
        request = recv_msg(conn)
        result = run_code(request, lambda m: send_msg(conn, m), lambda: recv_msg(conn),
                          int(header["limits"]["output_bytes"]))
        send_msg(conn, result)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            send_msg(conn, {"op": "failed", "message": f"{type(exc).__name__}: {exc}"})
    os._exit(0)


KEEP_READ_SEARCH = os.geteuid() == 0 and not _confine.interpreter_readable_by_nobody()


def probe() -> dict[str, str | None]:
    """Which controls this host enforces: None for each that works, else why not."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read_end)
        results: dict[str, str | None] = {}
        steps = [("namespaces", _confine.enter_namespaces),
                 ("rlimits", lambda: _confine.limit_resources(cpu_seconds=60, memory_bytes=2**31, file_bytes=2**20,
                                                              open_files=64, processes=64)),
                 ("landlock", lambda: _confine.landlock(_confine.readable_paths(), ["/tmp"])),
                 ("seccomp", _confine.seccomp_deny),
                 ("unprivileged", lambda: _confine.drop_privileges(keep_read_search=KEEP_READ_SEARCH))]
        for name, step in steps:
            try:
                step()
                results[name] = None
            except OSError as exc:
                results[name] = str(exc)
        if os.geteuid() == 0 and results.get("unprivileged") is None:
            results["unprivileged"] = "still root after dropping privileges"
        os.write(write_end, json.dumps(results).encode())
        os._exit(0)
    os.close(write_end)
    data = b""
    while chunk := os.read(read_end, 65536):
        data += chunk
    os.close(read_end)
    os.waitpid(pid, 0)
    return json.loads(data) if data else {c: "the probe process died" for c in _confine.CONTROLS}


def main() -> None:
    control = socket.socket(fileno=int(sys.argv[1]))
    preload, scratch_root, warm = json.loads(sys.argv[2]), sys.argv[3], int(sys.argv[4])
    workspace = sys.argv[5] if len(sys.argv) > 5 else ""
    _confine.readable_paths()  # computed once, before any fork
    for module in preload:  # warm forks: what the parent imported, children share
        with contextlib.suppress(ImportError):
            __import__(module)
    results = probe()
    controls = [c for c in _confine.CONTROLS if results.get(c) is None]
    send_msg(control, {"op": "ready", "controls": results, "keep_read_search": KEEP_READ_SEARCH})
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # children are reaped by the kernel
    ready = collections.deque(spawn_ready(controls, scratch_root, control, workspace) for _ in range(warm))
    while True:
        try:
            data, fds, _, _ = socket.recv_fds(control, 65536, 1)
        except OSError:
            break
        if not data or not fds:
            break  # the host is gone: so are we (and the waiting inits, whose links close)
        run = ready.popleft() if ready else spawn_ready(controls, scratch_root, control, workspace)
        conn = socket.socket(fileno=fds[0])
        try:
            send_msg(conn, {"op": "pid", "pid": run.pid(), "scratch": run.scratch})
            socket.send_fds(run.link, [data], [conn.fileno()])
        except (OSError, EOFError) as exc:  # that init died while it waited: the host sees the run fail
            with contextlib.suppress(OSError):
                send_msg(conn, {"op": "failed", "message": f"the prepared sandbox died: {exc}"})
        conn.close()
        run.link.close()
        if len(ready) < warm:
            ready.append(spawn_ready(controls, scratch_root, control, workspace))


if __name__ == "__main__":
    main()
