"""The ProcessExecutor's fork server, and the runner that executes code inside the sandbox.

Started once per executor as ``python -c BOOT FD`` (``process._FORK_SERVER_BOOT``: ``main``
from here, with ringzero's packages bare so that none of the kernel is in the memory every
run inherits) with the sandbox's environment and nothing else of the host's (so that no fork
can find a host secret in its memory or ``/proc/self/environ``), it reads its configuration
from the control socket FD, imports ``COMMON_MODULES`` and the preloaded modules (so that
forks start warm), probes which confinement controls this host enforces, and keeps WARM
confined inits ready: each is one fork of the server, born as the init of a new PID
namespace and put in its own cgroup leaf, which enters new mount, network, IPC and UTS
namespaces with a private root, brings its loopback up and listens on it for the egress proxy
(``_mounts.egress_listener``), confines itself with Landlock, seccomp and an unprivileged
uid, and waits. A request from the host carries one end of a socket pair; the server greets
the host on it (``pid``) and hands it to a ready init, which applies the run's rlimits, hands
its listener to the host over the run's egress link where the run is given egress (and closes
it either way), and speaks a length-prefixed JSON protocol with the host: ``run`` (from the
host), ``started`` once the run is confined (or ``failed``, if it could not be), ``call``/``result``/
``error`` for host tools, and ``done``. A session's init (``"session": true`` in its header)
reads the next ``run`` after each ``done``, in the same globals, until the host closes the link.
"""

from __future__ import annotations

import collections
import contextlib
import itertools
import json
import os
import resource
import signal
import socket
import sys
import tempfile
from typing import Any

from ringzero.providers.executors import _confine, _mounts
from ringzero.providers.executors._cgroups import RunCgroups
from ringzero.providers.executors._runner import frame, read_frame, run_code

__all__ = ["COMMON_MODULES", "recv_msg", "send_msg"]

COMMON_MODULES = ("copy", "csv", "dataclasses", "datetime", "decimal", "fractions", "pathlib", "statistics", "string",
                  "textwrap", "urllib.parse", "uuid")
"""Standard library modules agent code often imports, imported by every fork server (with
``preload``) so that runs find them warm. Every run is a fork of the server's memory and
copies what it touches, so the server holds no more than that: not ringzero's kernel, not
asyncio or ssl (about 6 MB, a sixth of a trivial run's cost; a run that imports asyncio pays
about 20 ms for it, unless ``preload`` names it)."""


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


class Server:
    """The fork server's configuration, probed controls and cgroups."""

    def __init__(self, config: dict[str, Any]) -> None:
        self.preload: list[str] = list(config["preload"])
        self.root: str = config["root"]  # an empty directory: the mount point of every private root
        self.warm = int(config["warm"])
        self.workspace: str = config["workspace"]
        self.workspace_uid = int(config.get("workspace_uid") or _confine.NOBODY)
        """The workspace's agent's uid, allocated by the host (``workspaces``)."""
        self.file_bytes = int(config["file_bytes"])
        self.scratch_inodes = int(config["scratch_inodes"])
        self.max_processes = int(config["max_processes"])
        self.memory_bytes = int(config["memory_bytes"])
        self.controls: list[str] = []
        self.cgroups: RunCgroups | None = None
        self._leaves = (f"run-{n}" for n in itertools.count())
        self._run_uids: _confine.RunUids | None = None

    @property
    def private_root(self) -> bool:
        return "namespaces" in self.controls

    @property
    def run_workspace(self) -> str:
        """Where a run finds the workspace: ``/workspace`` in its private root, else its host path."""
        return "" if not self.workspace else _mounts.WORKSPACE if self.private_root else self.workspace

    def unprivileged(self) -> bool:
        return os.geteuid() == 0 and "unprivileged" in self.controls

    def next_uid(self) -> int:
        """The uid the next run gets: its own, or with a workspace its agent's (``nobody`` where
        the host is not root: the run keeps the host's user, itself unprivileged)."""
        if not self.unprivileged():
            return _confine.NOBODY
        if self.workspace:
            return self.workspace_uid
        if self._run_uids is None:
            self._run_uids = _confine.RunUids()
        return self._run_uids.next()

    def confine(self, scratch: str, uid: int, egress: bool = False) -> None:
        """The controls that do not depend on a run's limits, in the order that keeps each
        possible. The run may write only in its scratch and, when one is given, the workspace
        (where it may make files and directories only: no symlink, FIFO, socket or device); it
        may connect over TCP only to the egress proxy's port, where ``egress`` (its listener,
        in the run's own network namespace, is the only thing there to connect to)."""
        if "landlock" in self.controls:  # /proc is the run's own PID namespace's, when it has a private root
            readable = [*_confine.readable_paths(), *(["/proc"] if self.private_root else [])]
            _confine.landlock(readable, [scratch], [self.run_workspace] if self.workspace else [],
                              connect_ports=[_mounts.EGRESS_PORT] if egress else [])
        if "seccomp" in self.controls:
            _confine.seccomp_deny()
        if "unprivileged" in self.controls:
            _confine.drop_privileges(uid)

    def limit(self, limits: dict[str, Any]) -> None:
        """The run's own limits: lowering rlimits needs no privilege, so they come last."""
        if "rlimits" in self.controls:
            _confine.limit_resources(
                cpu_seconds=int(limits["cpu_seconds"]), memory_bytes=int(limits["memory_bytes"]),
                file_bytes=int(limits["file_bytes"]), open_files=64,
                processes=None if self.cgroups is not None else int(limits["processes"]))

    def build_root(self, uid: int = _confine.NOBODY) -> None:
        _mounts.enter_namespaces()
        _mounts.build_root(self.root, _confine.readable_paths(), self.workspace, scratch_bytes=self.file_bytes,
                           scratch_inodes=self.scratch_inodes, owner=uid if self.unprivileged() else None)

    def spawn_ready(self, control: socket.socket) -> _Ready:
        """Fork the init of a run: born in a new PID namespace and put in its cgroup leaf by
        us, it makes its other namespaces and root, confines itself and waits for a run.
        Raises OSError when the host refuses a step here (the run fails); a step refused in
        the init is reported to the run it is handed."""
        leaf = ""
        if self.cgroups is not None:
            leaf = next(self._leaves)
            self.cgroups.create(leaf, pids=self.max_processes + 1, memory_bytes=self.memory_bytes)
        uid = self.next_uid()
        if self.private_root:
            scratch = _mounts.SCRATCH
        else:  # weaker isolation: a scratch directory on the host's disk
            scratch = tempfile.mkdtemp(prefix="run-", dir=self.root)
            if self.unprivileged():
                os.chown(scratch, uid, uid)
        ours, theirs = socket.socketpair()
        try:
            pid = _mounts.fork_into_pid_namespace() if self.private_root else os.fork()
        except BaseException:
            ours.close()
            theirs.close()
            raise
        if pid == 0:
            ours.close()
            control.close()
            try:
                self._init(theirs, scratch, uid)
            finally:
                os._exit(0)  # the fork server went away mid-spawn: leave quietly
        theirs.close()
        if leaf and self.cgroups is not None:
            # By us, before we return: a leaf is removed once it is empty after its run is handed
            # over, so an init that had not joined it yet would find it gone.
            try:
                self.cgroups.attach(leaf, pid)
            except OSError:
                os.kill(pid, signal.SIGKILL)
                ours.close()
                self.cgroups.remove(leaf)
                raise
        return _Ready(ours, scratch, leaf, pid)

    def _init(self, link: socket.socket, scratch: str, uid: int) -> None:
        """In the forked init: namespaces and root, confinement, then the run."""
        # What we hold open besides stdio and our link (the links of inits forked before us,
        # among them) is no business of the run's code.
        os.closerange(3, link.fileno())
        os.closerange(link.fileno() + 1, resource.getrlimit(resource.RLIMIT_NOFILE)[0])
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        os.setsid()
        failure = None
        listener: socket.socket | None = None  # the egress proxy's, made while the init may
        try:
            if self.private_root:
                self.build_root(uid)
                _mounts.mount_proc()
                with contextlib.suppress(OSError):  # an egress run says so, if this failed
                    listener = _mounts.egress_listener()
            devnull = os.open("/dev/null", os.O_RDWR)
            for fd in (0, 1, 2):
                os.dup2(devnull, fd)
            os.environ.update(HOME=scratch, TMPDIR=scratch, **({"RINGZERO_WORKSPACE": self.run_workspace}
                                                               if self.workspace else {}))
            self.confine(scratch, uid, egress=listener is not None)
            os.chdir(scratch)
        except BaseException as exc:
            failure = f"{type(exc).__name__}: {exc}"
        data, fds, _, _ = socket.recv_fds(link, 65536, 2)
        link.close()
        if not data or not fds:
            os._exit(0)  # the fork server is gone
        conn = socket.socket(fileno=fds[0])
        os.register_at_fork(after_in_child=conn.close)  # processes the code forks must not speak for it
        try:
            if failure is not None:
                raise RuntimeError(failure)
            header = json.loads(data)
            self.limit(header["limits"])
            _hand_over_listener(listener, fds[1] if len(fds) > 1 else None, bool(header.get("egress")))
            send_msg(conn, {"op": "started"})  # confined: from here on, a "failed" may be the code's own
            request = recv_msg(conn)
            if request.get("egress"):
                _egress_environment(request["egress"], scratch)
            output_bytes = int(header["limits"]["output_bytes"])
            namespace: dict[str, Any] = {"__name__": "__main__"}
            while True:  # a session's steps share one namespace; a run is a session of one step
                conn.sendall(run_code(request, conn.sendall, lambda: recv_msg(conn), output_bytes, namespace))
                if not header.get("session"):
                    break
                try:
                    request = recv_msg(conn)
                except EOFError:  # the host closed the session
                    break
        except BaseException as exc:
            with contextlib.suppress(OSError):
                send_msg(conn, {"op": "failed", "message": f"{type(exc).__name__}: {exc}"[:2000]})
        os._exit(0)

    def probe(self) -> dict[str, str | None]:
        """Which controls this host enforces: None for each that works, else why not. Tried
        in a throwaway child, born as a run's init is (in a new PID namespace, where the host
        allows one), in the order a run applies them."""
        read_end, write_end = os.pipe()
        try:
            pid, refused = _mounts.fork_into_pid_namespace(), None
        except OSError as exc:
            pid, refused = os.fork(), str(exc)
        if pid == 0:
            os.close(read_end)
            os.write(write_end, json.dumps(self._probe_steps(refused)).encode())
            os._exit(0)
        os.close(write_end)
        data = b""
        while chunk := os.read(read_end, 65536):
            data += chunk
        os.close(read_end)
        os.waitpid(pid, 0)
        results = json.loads(data) if data else {c: "the probe process died" for c in _confine.CONTROLS}
        try:
            self.cgroups = RunCgroups.open()
            results["cgroups"] = None
        except OSError as exc:
            results["cgroups"] = str(exc)
        return results

    def _probe_steps(self, pid_namespace_refused: str | None) -> dict[str, str | None]:
        results: dict[str, str | None] = {}
        self.controls = ["unprivileged"]  # the scratch owner, as a run would have it

        def namespaces() -> None:
            if pid_namespace_refused is not None:
                raise OSError(pid_namespace_refused)
            self.build_root()
            _mounts.mount_proc()
            if not os.path.exists("/proc/self/status"):
                raise OSError("/proc could not be mounted in the new PID namespace")

        def unprivileged() -> None:
            _confine.drop_privileges()
            stdlib = os.path.dirname(os.__file__)
            if os.geteuid() != 0 and not os.access(stdlib, os.R_OK | os.X_OK):
                raise OSError(f"{stdlib} is out of reach of the sandbox uid, and no private root makes a path "
                              "to it: code could not import what the fork server did not preload")

        steps = [("namespaces", namespaces),
                 ("rlimits", lambda: _confine.limit_resources(cpu_seconds=60, memory_bytes=2**31, file_bytes=2**20,
                                                              open_files=64, processes=64)),
                 ("landlock", lambda: _confine.landlock(_confine.readable_paths(), [_mounts.SCRATCH])),
                 ("seccomp", _confine.seccomp_deny),
                 ("unprivileged", unprivileged)]
        for name, step in steps:
            try:
                step()
                results[name] = None
            except OSError as exc:
                results[name] = str(exc)
        if os.geteuid() == 0 and results.get("unprivileged") is None:
            results["unprivileged"] = "still root after dropping privileges"
        return results


def _hand_over_listener(listener: socket.socket | None, to_host: int | None, egress: bool) -> None:
    """Send the egress proxy's listener to the host (over ``to_host``) for a run given egress;
    either way, the run keeps no copy of it."""
    try:
        if egress:
            if listener is None or to_host is None:
                raise RuntimeError("egress needs the run's own network namespace, and this sandbox has none")
            with socket.socket(fileno=to_host) as host:
                socket.send_fds(host, [b"listener"], [listener.fileno()])
        elif to_host is not None:
            os.close(to_host)
    finally:
        if listener is not None:
            listener.close()


def _egress_environment(egress: dict[str, Any], scratch: str) -> None:
    """The run's CA in its scratch, and the proxy, CA and placeholders in its environment."""
    with open(os.path.join(scratch, str(egress["ca_file"])), "w", encoding="ascii") as file:
        file.write(str(egress["ca"]))
    os.environ.update({str(k): str(v) for k, v in egress["env"].items()})


class _Ready:
    """An init waiting for its run (perhaps still confining itself: the fork server never
    waits for it): its link to us, its scratch, cgroup leaf and host pid."""

    def __init__(self, link: socket.socket, scratch: str, leaf: str, pid: int) -> None:
        self.link, self.scratch, self.leaf, self.pid = link, scratch, leaf, pid


def main() -> None:
    control = socket.socket(fileno=int(sys.argv[1]))
    server = Server(recv_msg(control))
    _mounts.plan(_confine.readable_paths())  # computed once, before any fork
    for module in (*COMMON_MODULES, *server.preload):  # warm forks: what the parent imported, children share
        with contextlib.suppress(ImportError):
            __import__(module)
    results = server.probe()
    server.controls = [c for c in _confine.CONTROLS if results.get(c) is None]
    send_msg(control, {"op": "ready", "controls": results})
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # children are reaped by the kernel
    ready: collections.deque[_Ready] = collections.deque()
    handed: list[str] = []  # cgroup leaves of runs handed over, removed once their processes are gone
    try:
        _serve(server, control, ready, handed)
    finally:
        for waiting in ready:  # their links close: each waiting init leaves
            waiting.link.close()
            handed.append(waiting.leaf)
        if server.cgroups is not None:
            server.cgroups.close([leaf for leaf in handed if leaf])


def _serve(server: Server, control: socket.socket, ready: collections.deque[_Ready], handed: list[str]) -> None:
    def refill() -> None:
        while len(ready) < server.warm:
            try:
                ready.append(server.spawn_ready(control))
            except OSError:
                return  # the next request will try again, and report the failure to its run

    refill()
    while True:
        try:
            data, fds, _, _ = socket.recv_fds(control, 65536, 2)
        except OSError:
            return
        if not data or not fds:
            return  # the host is gone: so are we (and the waiting inits, whose links close)
        conn = socket.socket(fileno=fds[0])
        egress = fds[1:]  # the run's egress link, handed on to its init
        try:
            run = ready.popleft() if ready else server.spawn_ready(control)
            handed.append(run.leaf)
            if run.leaf and server.cgroups is not None:
                server.cgroups.set_memory(run.leaf, int(json.loads(data)["limits"]["memory_bytes"]))
            greeting = {"op": "pid", "pid": run.pid, **({} if server.private_root else {"scratch": run.scratch})}
            send_msg(conn, greeting)
            socket.send_fds(run.link, [data], [conn.fileno(), *egress])
            run.link.close()
        except (OSError, EOFError, ValueError, KeyError) as exc:  # no sandbox for this run: it fails, we serve on
            with contextlib.suppress(OSError):
                send_msg(conn, {"op": "failed", "message": f"the sandbox could not be prepared: {exc}"})
        conn.close()
        for fd in egress:
            os.close(fd)
        if server.cgroups is not None:
            handed[:] = [leaf for leaf in handed if leaf and not server.cgroups.remove(leaf)]
        refill()


if __name__ == "__main__":
    main()
