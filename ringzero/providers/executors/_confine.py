"""Linux confinement for one sandboxed run, applied in the forked child before user code.

Each control is a function that raises OSError when the kernel refuses it, so that the
executor can probe the host once and report (or refuse) exactly what it cannot enforce:

- ``namespaces``: new mount, network, PID, IPC and UTS namespaces and a private root (see
  ``_mounts``): no interface is up, so nothing is reachable; killing the PID namespace's init
  kills every process the code started; SysV IPC dies with the run; only the interpreter,
  system libraries, the run's tmpfs scratch and the workspace exist;
- ``rlimits``: CPU seconds, address space, file size, open files, processes, no core dumps;
- ``landlock``: the file system is read-only (only the interpreter's and system libraries'
  directories are readable at all) except the run's scratch directory; TCP bind/connect is
  denied; signals and abstract unix sockets cannot reach processes outside the sandbox;
- ``seccomp``: see ``_seccomp`` (architecture and x32 checks, a deny-list, no namespaces from
  clone, a short list of socket families);
- ``unprivileged``: the code runs as a uid of its own (``RunUids``; its agent's, with a
  workspace) with no capability when the host is root;
- ``cgroups``: a cgroup per run caps memory and processes for the whole run (``_cgroups``).
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import functools
import itertools
import os
import resource
import struct
import sys
from collections.abc import Iterable

from ringzero.providers.executors import _seccomp

__all__ = ["CONTROLS", "RUN_UIDS", "UID_SPAN", "RunUids", "capabilities", "drop_privileges", "landlock",
           "limit_resources", "no_new_privs", "readable_paths", "seccomp_deny"]

CONTROLS = ("namespaces", "rlimits", "landlock", "seccomp", "unprivileged", "cgroups")
NOBODY = 65534
RUN_UIDS = 2_100_000_000
"""Where the host is root, each run gets a uid of its own from here (the lower 2**23), or, with
a workspace, its agent's uid (the upper 2**23, one per workspace: ``workspaces``), so that
per-uid kernel limits (inotify instances, RLIMIT_NPROC) and file ownership never cross agents.
No account has these uids; the code sees itself as an unnamed user."""
UID_SPAN = 1 << 23
RUN_UID_BLOCK = 4096
"""Run uids a fork server holds at a time: it hands them out in turn, and the one it hands out
again after 4,096 runs belongs to a run that has long been killed."""
RUN_UID_LOCKS = "/run/ringzero/run-uids"


class RunUids:
    """The run uids of one fork server: a block of ``RUN_UID_BLOCK`` no other live fork server
    on this host holds. The block is taken with a lock (``flock``) on its file under
    ``RUN_UID_LOCKS``, held as long as the server lives and let go by the kernel when it dies, so
    that two live servers never hand out the same uid, whatever their pids."""

    def __init__(self, locks: str = RUN_UID_LOCKS) -> None:
        os.makedirs(locks, mode=0o700, exist_ok=True)
        for block in range(UID_SPAN // RUN_UID_BLOCK):
            fd = os.open(os.path.join(locks, str(block)), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                os.close(fd)
                continue
            self.fd, self.block = fd, block
            self._serials = itertools.count()
            return
        raise OSError(errno.EAGAIN, f"every block of run uids under {locks} is held by a live fork server")

    def next(self) -> int:
        return RUN_UIDS + self.block * RUN_UID_BLOCK + next(self._serials) % RUN_UID_BLOCK


_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long
_PR_SET_NO_NEW_PRIVS = 38
_SYS_LANDLOCK_CREATE_RULESET = 444
_SYS_LANDLOCK_ADD_RULE = 445
_SYS_LANDLOCK_RESTRICT_SELF = 446


def _check(result: int, what: str) -> int:
    if result < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")
    return result


def limit_resources(*, cpu_seconds: int, memory_bytes: int, file_bytes: int, open_files: int,
                    processes: int | None) -> None:
    """Per-process limits. ``processes`` (RLIMIT_NPROC) counts every process of the uid on the
    host, so it is only set where no pids cgroup bounds the run (None: leave it)."""
    limits = [(resource.RLIMIT_CPU, cpu_seconds), (resource.RLIMIT_AS, memory_bytes),
              (resource.RLIMIT_FSIZE, file_bytes), (resource.RLIMIT_NOFILE, open_files), (resource.RLIMIT_CORE, 0)]
    if processes is not None:
        limits.append((resource.RLIMIT_NPROC, processes))
    for limit, value in limits:
        resource.setrlimit(limit, (value, value))


def no_new_privs() -> None:
    _check(_libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(PR_SET_NO_NEW_PRIVS)")


# ---------------------------------------------------------------------------------- landlock
_FS_READ = (1 << 0) | (1 << 2) | (1 << 3)  # EXECUTE, READ_FILE, READ_DIR
_FS_WRITE_V1 = (1 << 1) | sum(1 << b for b in range(4, 13))  # WRITE_FILE, REMOVE_*, MAKE_*
_FS_REFER, _FS_TRUNCATE, _FS_IOCTL_DEV = 1 << 13, 1 << 14, 1 << 15
_FS_MAKE_SPECIAL = (1 << 6) | (1 << 9) | (1 << 10) | (1 << 11) | (1 << 12)  # MAKE_CHAR, SOCK, FIFO, BLOCK, SYM
_NET_ALL = (1 << 0) | (1 << 1)  # BIND_TCP, CONNECT_TCP
_NET_CONNECT, _RULE_NET_PORT = 1 << 1, 2
_SCOPE_ALL = (1 << 0) | (1 << 1)  # ABSTRACT_UNIX_SOCKET, SIGNAL


def _landlock_abi() -> int:
    return _check(_libc.syscall(_SYS_LANDLOCK_CREATE_RULESET, None, 0, 1), "landlock_create_ruleset(version)")


def landlock(readable: Iterable[str], writable: Iterable[str], files_only: Iterable[str] = (),
             connect_ports: Iterable[int] = ()) -> None:
    """Allow reading ``readable``, everything in ``writable``, and in ``files_only`` everything
    but making a symlink, FIFO, socket or device node (what the host could be tricked by when it
    reads the directory later); deny the rest of the file system, TCP (but connecting to
    ``connect_ports``: the egress proxy's, in the run's own network namespace), and (ABI 6+)
    signals and abstract sockets reaching outside the sandbox."""
    abi = _landlock_abi()
    fs_all = _FS_READ | _FS_WRITE_V1 | (_FS_REFER if abi >= 2 else 0) | (_FS_TRUNCATE if abi >= 3 else 0)
    fs_all |= _FS_IOCTL_DEV if abi >= 5 else 0
    net = _NET_ALL if abi >= 4 else 0
    scoped = _SCOPE_ALL if abi >= 6 else 0
    attr = struct.pack("QQQ", fs_all, net, scoped)
    size = 8 if abi < 4 else (16 if abi < 6 else 24)
    buf = ctypes.create_string_buffer(attr[:size], size)
    ruleset = _check(_libc.syscall(_SYS_LANDLOCK_CREATE_RULESET, buf, ctypes.c_size_t(size), 0),
                     "landlock_create_ruleset")
    try:
        for paths, access in ((readable, _FS_READ), (writable, fs_all), (files_only, fs_all & ~_FS_MAKE_SPECIAL)):
            for path in paths:
                _landlock_allow(ruleset, path, access)
        for port in connect_ports if net else ():
            rule = ctypes.create_string_buffer(struct.pack("=QQ", _NET_CONNECT, port), 16)
            _check(_libc.syscall(_SYS_LANDLOCK_ADD_RULE, ruleset, _RULE_NET_PORT, rule, 0),
                   f"landlock_add_rule(connect to port {port})")
        no_new_privs()
        _check(_libc.syscall(_SYS_LANDLOCK_RESTRICT_SELF, ruleset, 0), "landlock_restrict_self")
    finally:
        os.close(ruleset)


def _landlock_allow(ruleset: int, path: str, access: int) -> None:
    try:
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    except OSError:
        return  # a path this host does not have needs no rule
    try:
        if not os.path.isdir(path):
            access &= (1 << 0) | (1 << 1) | (1 << 2) | _FS_TRUNCATE | _FS_IOCTL_DEV  # file rights only
        rule = ctypes.create_string_buffer(struct.pack("=Qi", access, fd), 12)
        _check(_libc.syscall(_SYS_LANDLOCK_ADD_RULE, ruleset, 1, rule, 0), f"landlock_add_rule({path})")
    finally:
        os.close(fd)


def seccomp_deny() -> None:
    """Install the seccomp filter (``_seccomp``: architecture and x32 checks, deny-list,
    namespace flags on clone, socket families)."""
    _seccomp.install()


def drop_privileges(uid: int = NOBODY) -> None:
    """Become ``uid`` (and its own group) with no capability left, when running as root (a
    non-root host already runs unprivileged). Raises OSError if any capability survives."""
    if os.geteuid() != 0:
        return
    os.setgroups([])
    os.setgid(uid)
    os.setuid(uid)
    if capabilities() != 0:
        raise OSError(errno.EPERM, f"capabilities survived the change to uid {uid}: {capabilities():#x}")


_SYS_CAPGET = 125
_LINUX_CAPABILITY_VERSION_3 = 0x20080522


def capabilities() -> int:
    """The calling process's effective and permitted capabilities, as one bit mask (capget:
    /proc may be out of Landlock's reach by then)."""
    header = ctypes.create_string_buffer(struct.pack("=Ii", _LINUX_CAPABILITY_VERSION_3, 0))
    data = ctypes.create_string_buffer(24)
    _check(_libc.syscall(_SYS_CAPGET, header, data), "capget")
    eff0, perm0, _, eff1, perm1, _ = struct.unpack("=6I", data.raw)
    return int(eff0 | perm0 | (eff1 | perm1) << 32)


SYSTEM_READABLE = ("/usr", "/lib", "/lib64", "/bin", "/etc/ld.so.cache", "/etc/localtime", "/etc/ssl",
                   "/dev/null", "/dev/zero", "/dev/urandom", "/dev/random")


@functools.lru_cache(maxsize=1)
def readable_paths() -> tuple[str, ...]:
    """What sandboxed code may read: the interpreter, its installed packages, system libraries.

    Only directories under the interpreter's own prefixes count, so neither the working
    directory nor an editable install's project folder (with its .env) is ever readable.
    """
    prefixes = {os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)}
    paths = set(prefixes) | {os.path.dirname(os.path.realpath(sys.executable))}
    for entry in sys.path:
        real = os.path.realpath(entry) if entry else ""
        if real and os.path.isdir(real) and any(real == p or real.startswith(p + os.sep) for p in prefixes):
            paths.add(real)
    return tuple(sorted(paths | set(SYSTEM_READABLE)))
