"""A cgroup leaf per sandboxed run, so that its limits hold for the whole run, not per process.

``memory`` caps every process the code starts together (and what it writes to its tmpfs
scratch, which is charged to it): five forks share one ``memory_bytes``. ``pids`` caps how
many processes and threads one run may have, whatever other processes of the same uid exist
on the host (``RLIMIT_NPROC`` counts those too, so it is only the fallback).

cgroup v2 is used when the fork server's own cgroup offers both controllers (its
``cgroup.subtree_control`` must already delegate them: cgroup v2 forbids enabling a
controller below a cgroup that still holds processes); else cgroup v1, with the ``memory``
and ``pids`` hierarchies mounted. Leaves live under ``<own cgroup>/ringzero-<fork server
pid>/``. Creating them needs write access there (root, or a delegated subtree).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import time

__all__ = ["RunCgroups"]

_ROOT = "/sys/fs/cgroup"


def _own_paths() -> dict[str, str]:
    """The calling process's cgroup path per controller ("" for the v2 hierarchy)."""
    paths: dict[str, str] = {}
    with open("/proc/self/cgroup") as lines:
        for line in lines:
            _, controllers, path = line.rstrip("\n").split(":", 2)
            for controller in controllers.split(",") if controllers else [""]:
                paths[controller] = path
    return paths


def _mounts() -> dict[str, str]:
    """Mount point per v1 controller, and "" for the cgroup2 mount."""
    points: dict[str, str] = {}
    with open("/proc/self/mountinfo") as lines:
        for line in lines:
            fields = line.split()
            fstype = fields[fields.index("-") + 1]
            if fstype == "cgroup2":
                points.setdefault("", fields[4])
            elif fstype == "cgroup":
                for option in fields[-1].split(","):
                    points.setdefault(option, fields[4])
    return points


def _write(path: str, value: str) -> None:
    with open(path, "w") as f:
        f.write(value)


class RunCgroups:
    """The leaves of one fork server's runs. ``RunCgroups.open()`` raises OSError saying why
    this host gives it none."""

    def __init__(self, bases: dict[str, str], version: int) -> None:
        self.bases = bases  # controller ("memory", "pids"; "" for v2) -> this server's directory
        self.cgroup_version = version

    @classmethod
    def open(cls) -> RunCgroups:
        own, points = _own_paths(), _mounts()
        # Unique, not just the pid: a server killed with SIGKILL leaves its directory behind, and a
        # later server with the same pid would find it taken (EEXIST) and lose its isolation.
        name = f"ringzero-{os.getpid()}-{secrets.token_hex(4)}"
        if "" in points and "" in own:
            v2 = points[""] + own[""]
            try:
                with open(os.path.join(v2, "cgroup.controllers")) as f:
                    offered = set(f.read().split())
                with open(os.path.join(v2, "cgroup.subtree_control")) as f:
                    delegated = set(f.read().split())
            except OSError:
                offered = delegated = set()
            if {"memory", "pids"} <= offered & delegated:
                base = os.path.join(v2, name)
                os.mkdir(base)
                try:
                    _write(os.path.join(base, "cgroup.subtree_control"), "+memory +pids")
                except OSError:
                    os.rmdir(base)
                    raise
                return cls({"": base}, 2)
        if "memory" in points and "pids" in points and "memory" in own and "pids" in own:
            bases: dict[str, str] = {}
            try:
                for controller in ("memory", "pids"):
                    base = points[controller] + own[controller].rstrip("/") + "/" + name
                    os.mkdir(base)
                    bases[controller] = base
            except OSError:
                for base in bases.values():
                    os.rmdir(base)
                raise
            return cls(bases, 1)
        raise OSError("no cgroup hierarchy with the memory and pids controllers that this process may "
                      "subdivide (cgroup v2 needs them in its cgroup.subtree_control)")

    def create(self, leaf: str, *, pids: int, memory_bytes: int) -> None:
        for base in self.bases.values():
            os.mkdir(os.path.join(base, leaf))
        self.set_memory(leaf, memory_bytes)
        self._set("pids", leaf, "pids.max", str(pids))

    def _set(self, controller: str, leaf: str, name: str, value: str, required: bool = True) -> None:
        base = self.bases.get("" if self.cgroup_version == 2 else controller)
        assert base is not None
        path = os.path.join(base, leaf, name)
        if required or os.path.exists(path):
            _write(path, value)

    def set_memory(self, leaf: str, memory_bytes: int) -> None:
        if self.cgroup_version == 2:
            self._set("memory", leaf, "memory.max", str(memory_bytes))
            self._set("memory", leaf, "memory.swap.max", "0", required=False)
        else:  # v1 wants memsw >= limit at every step: which goes first depends on the direction
            try:
                self._set("memory", leaf, "memory.limit_in_bytes", str(memory_bytes))
                self._set("memory", leaf, "memory.memsw.limit_in_bytes", str(memory_bytes), required=False)
            except OSError:
                self._set("memory", leaf, "memory.memsw.limit_in_bytes", str(memory_bytes), required=False)
                self._set("memory", leaf, "memory.limit_in_bytes", str(memory_bytes))

    def attach(self, leaf: str, pid: int) -> None:
        for base in self.bases.values():
            _write(os.path.join(base, leaf, "cgroup.procs"), str(pid))

    def remove(self, leaf: str) -> bool:
        """Remove an empty leaf; False while its processes are still being torn down."""
        done = True
        for base in self.bases.values():
            try:
                os.rmdir(os.path.join(base, leaf))
            except FileNotFoundError:
                pass
            except OSError:
                done = False
        return done

    def close(self, leaves: list[str], patience: float = 2.0) -> None:
        """Remove the given leaves (waiting up to ``patience`` s for dying runs), then the base."""
        deadline = time.monotonic() + patience
        while leaves and time.monotonic() < deadline:
            leaves = [leaf for leaf in leaves if not self.remove(leaf)]
            if leaves:
                time.sleep(0.02)
        for base in self.bases.values():
            with contextlib.suppress(OSError):
                os.rmdir(base)
