"""A second wall around Monty's worker processes: what starts each ``monty`` worker.

pydantic-monty runs its interpreter in worker processes it starts itself (``monty
subprocess``, talking over pipes). Its own wall is the interpreter: the code has no file,
network or process API to call. Should that wall ever break, the worker is the next one, so
it is confined as a process-sandbox run is, before it ``exec``s the real binary:

- ``namespaces``: its own network namespace (no interface up), IPC and UTS namespaces;
- ``rlimits``: no core dumps, at most 64 open files;
- ``landlock``: reads only the binary's directory and the system libraries, writes nothing,
  no TCP (ABI 4+), no signals or abstract sockets out of its own domain (ABI 6+);
- ``unprivileged``: ``nobody`` with no capability, where the host runs as root;
- ``seccomp``: the process sandbox's filter (``_seccomp``);
- ``environment``: empty.

``probe()`` says which hold on this host (``MontyExecutor.missing_controls``, ``ringzero
doctor``): one that does not is skipped (the interpreter stays the first wall, so a laptop
without root still runs Monty). One that held when probed is required: a worker that cannot
apply it when it starts does not start (it fails closed), and says why in a report file the
executor reads.

Run as ``python -I -S -c BOOT <required,controls> <report file> <real monty binary> <its
arguments>`` (``launcher_script``); with ``--probe`` in place of the controls it applies them in
a throwaway process and prints which failed, as JSON.
"""

from __future__ import annotations

import ctypes
import functools
import json
import os
import resource
import shlex
import subprocess
import sys

from ringzero.providers.executors import _confine

__all__ = ["WALL_CONTROLS", "apply", "launcher_script", "main", "probe"]

WALL_CONTROLS = ("namespaces", "rlimits", "landlock", "unprivileged", "seccomp")
_CLONE_NEWNET, _CLONE_NEWIPC, _CLONE_NEWUTS, _CLONE_NEWUSER = 0x40000000, 0x08000000, 0x04000000, 0x10000000
_PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def _unshare(flags: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(flags) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"unshare: {os.strerror(err)}")


def _namespaces() -> None:
    flags = _CLONE_NEWNET | _CLONE_NEWIPC | _CLONE_NEWUTS
    if os.geteuid() != 0:  # without root, a user namespace of its own makes the others possible
        flags |= _CLONE_NEWUSER
    _unshare(flags)


def _rlimits() -> None:
    for limit, value in ((resource.RLIMIT_CORE, 0), (resource.RLIMIT_NOFILE, 64)):
        resource.setrlimit(limit, (value, value))


def _unprivileged() -> None:
    _confine.drop_privileges()


def apply(binary: str) -> dict[str, str | None]:
    """Apply every control this host allows, in order; None for each that holds, else why not."""
    readable = (os.path.dirname(os.path.realpath(binary)), *_confine.SYSTEM_READABLE)
    steps = (("namespaces", _namespaces), ("rlimits", _rlimits),
             ("landlock", lambda: _confine.landlock(readable, ())), ("unprivileged", _unprivileged),
             ("seccomp", _confine.seccomp_deny))
    report: dict[str, str | None] = {}
    for name, step in steps:
        try:
            step()
            report[name] = None
        except OSError as exc:
            report[name] = exc.strerror or str(exc)
    return report


def main() -> None:
    if sys.argv[1] == "--probe":
        print(json.dumps(apply(sys.argv[2])))
        return
    required, report, target, args = sys.argv[1].split(","), sys.argv[2], sys.argv[3], sys.argv[4:]
    fd = os.open(target, os.O_RDONLY | os.O_CLOEXEC)  # opened as the host's user, run as nobody
    # opened before Landlock forbids writing, and closed by the exec
    out = os.open(report, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
    failed = {name: why for name, why in apply(target).items() if why is not None and name in required}
    if failed:  # a control that held when probed does not hold now: this worker does not start
        os.write(out, (json.dumps(failed) + "\n").encode())
        sys.stderr.write(f"ringzero: the Monty worker's second wall failed ({failed}); it does not start\n")
        sys.exit(70)
    os.execve(fd, [target, *args], {})


_BOOT = (
    "import sys, types\n"
    "for name in ('ringzero', 'ringzero.providers', 'ringzero.providers.executors'):\n"
    "    package = types.ModuleType(name)\n"
    f"    package.__path__ = [{_PACKAGE_ROOT!r} + '/' + name.replace('.', '/')]\n"
    "    sys.modules[name] = package\n"
    "from ringzero.providers.executors._monty_wall import main\n"
    "main()\n")
"""A bare interpreter's start: none of ringzero's kernel, only this module and ``_confine``."""


def _launcher() -> list[str]:
    return [sys.executable, "-I", "-S", "-c", _BOOT]


def launcher_script(binary: str, required: list[str], report: str) -> str:
    """The ``/bin/sh`` script pydantic-monty is given as its binary: it starts this module in a
    bare interpreter with nothing of the host's environment, which confines itself and
    ``exec``s ``binary``, or, where one of the ``required`` controls fails, writes why to
    ``report`` and exits instead."""
    command = " ".join(shlex.quote(part) for part in (*_launcher(), ",".join(required), report, binary))
    return f"#!/bin/sh\nexec {command} \"$@\"\n"


@functools.lru_cache(maxsize=4)
def probe(binary: str) -> dict[str, str | None]:
    """Which controls hold on this host, tried in a throwaway process: None for each that does
    (once per binary and host process: the answer is the host's)."""
    out = subprocess.run([*_launcher(), "--probe", binary], capture_output=True, text=True, env={}, timeout=30,
                         check=False)
    try:
        report = json.loads(out.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return dict.fromkeys(WALL_CONTROLS, f"the probe did not answer: {out.stderr.strip()[-300:]}")
    return {str(k): None if v is None else str(v) for k, v in report.items()}
