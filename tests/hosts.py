"""Host processes the durability tests start and kill -9: one helper for the kill."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path


def kill_host_when(host: subprocess.Popen[str] | subprocess.Popen[bytes], ready: Callable[[], bool],
                   deadline: float = 60) -> int:
    """SIGKILL ``host`` once ``ready()`` is true (or ``deadline`` seconds have passed); wait for
    it, close its stdout, and return its exit status (``-SIGKILL`` where the kill ended it)."""
    try:
        give_up = time.monotonic() + deadline
        while not ready() and time.monotonic() < give_up:
            time.sleep(0.005)
        os.kill(host.pid, signal.SIGKILL)
        host.wait(30)
    finally:
        stop_host(host)
    return host.returncode


def stop_host(host: subprocess.Popen[str] | subprocess.Popen[bytes]) -> None:
    """Kill ``host`` if it still runs, wait for it and close its stdout."""
    if host.poll() is None:
        host.kill()
        host.wait(30)
    if host.stdout is not None:
        host.stdout.close()


def append_synced(path: str, line: str) -> None:
    """Append ``line`` to the log at ``path`` and sync it: a tool's mark that outlives a kill -9
    of its host the moment the tool returns."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, f"{line}\n".encode())
        os.fsync(fd)
    finally:
        os.close(fd)


def logged_effect(log: Path, what: object, key: str, die_inside: bool) -> None:
    """An effect a host's tool makes: ``start WHAT KEY`` and ``end WHAT KEY`` lines in ``log``.
    With ``die_inside``, the first time (``first_time``), the host kills itself with SIGKILL
    between the two: the effect begun, its end never written."""
    with log.open("a") as out:
        out.write(f"start {what} {key}\n")
    if die_inside and first_time(log):
        os.kill(os.getpid(), signal.SIGKILL)
    with log.open("a") as out:
        out.write(f"end {what} {key}\n")


def first_time(log: Path) -> bool:
    """True once per ``log``: a marker file beside it says a kill already happened."""
    marker = log.with_suffix(".killed")
    if marker.exists():
        return False
    marker.touch()
    return True
