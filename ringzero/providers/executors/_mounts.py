"""A private root for one sandboxed run: only what the interpreter needs exists in it.

The run's init is forked straight into a new PID namespace (``fork_into_pid_namespace``: one
fork of the fork server, whose memory each fork copies on write, not two). After
``unshare(CLONE_NEWNS)`` (with new network, IPC and UTS namespaces), it builds a fresh tmpfs
root holding, at their host paths:

- read-only bind mounts of the interpreter's directories and system libraries (the same paths
  Landlock lets it read: ``_confine.readable_paths``), top-level symlinks such as ``/lib ->
  usr/lib`` recreated as symlinks;
- ``/dev/null``, ``/dev/zero``, ``/dev/urandom`` and ``/dev/random`` bound from the host;
- ``/tmp``: the run's scratch, a tmpfs of its own with a size and an inode limit, owned by the
  sandbox uid; ``HOME`` and ``TMPDIR`` point there;
- the agent's workspace, when one is given, bound read-write at ``/workspace`` (``WORKSPACE``:
  never under the scratch, so Landlock can give it rules of its own), ``nosuid,nodev``;
- ``/proc``, mounted by the namespace's init, so it shows the sandbox's processes only.

Then ``pivot_root`` moves into it and the host's root is detached. Nothing else of the host
exists for the code: no unix socket under ``/run`` or ``/tmp``, no other run's scratch, no
directory to watch or stat. Because every directory on the way to the interpreter is a fresh
``0755`` tmpfs directory, the sandbox uid reaches the interpreter without any capability,
even when it lives under a ``0700`` home (pyenv under ``/root``).
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import functools
import os
import signal
import socket
import struct
from collections.abc import Iterable

__all__ = ["DEVICES", "EGRESS_PORT", "SCRATCH", "WORKSPACE", "build_root", "egress_listener", "enter_namespaces",
           "fork_into_pid_namespace", "mount", "mount_proc", "plan"]

SCRATCH = "/tmp"
WORKSPACE = "/workspace"  # ProcessExecutor.WORKSPACE
DEVICES = ("/dev/null", "/dev/zero", "/dev/urandom", "/dev/random")

_CLONE_NEWNS, _CLONE_NEWUTS, _CLONE_NEWIPC = 0x00020000, 0x04000000, 0x08000000
_CLONE_NEWPID, _CLONE_NEWNET = 0x20000000, 0x40000000
_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_NOEXEC = 1, 2, 4, 8
_MS_REMOUNT, _MS_BIND, _MS_REC, _MS_PRIVATE = 32, 4096, 16384, 1 << 18
_MNT_DETACH = 2
_SYS_PIVOT_ROOT = 155

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
_libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]
_libc.syscall.restype = ctypes.c_long


def _check(result: int, what: str) -> None:
    if result < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    """``mount(2)``; OSError naming the call where the kernel refuses it."""
    _check(_libc.mount(None if source is None else source.encode(), target.encode(),
                       None if fstype is None else fstype.encode(), flags, None if data is None else data.encode()),
           f"mount({source!r}, {target!r}, {fstype!r})")


def fork_into_pid_namespace() -> int:
    """``os.fork()`` whose child is the init (pid 1) of a new PID namespace; the caller's own
    namespace is untouched. Returns what ``os.fork()`` returns (the child's host pid, or 0).

    ``unshare(CLONE_NEWPID)`` changes only where the caller's next child is born, so the caller
    forks once and then points its children back at its own namespace (``setns``), ready for
    the next call. Needs CAP_SYS_ADMIN (the fork server runs as root). Raises OSError, with
    no child left, when a step is refused."""
    _check(_libc.unshare(_CLONE_NEWPID), "unshare(CLONE_NEWPID)")
    pid = -1
    try:
        pid = os.fork()
    finally:
        if pid != 0:  # the caller (also when the fork failed): its own namespace for its next children
            own = os.open("/proc/self/ns/pid", os.O_RDONLY | os.O_CLOEXEC)  # the active one, not the new
            try:
                _check(_libc.setns(own, _CLONE_NEWPID), "setns(own PID namespace)")
            except OSError:
                if pid > 0:  # a child the caller will not know of
                    os.kill(pid, signal.SIGKILL)
                    with contextlib.suppress(ChildProcessError):
                        os.waitpid(pid, 0)
                raise
            finally:
                os.close(own)
    return pid


def enter_namespaces() -> None:
    """New mount, network, IPC and UTS namespaces for the caller, the init of its run's PID
    namespace. The IPC namespace dies with the run, and SysV shared memory with it."""
    _check(_libc.unshare(_CLONE_NEWNS | _CLONE_NEWNET | _CLONE_NEWIPC | _CLONE_NEWUTS),
           "unshare(CLONE_NEWNS|CLONE_NEWNET|CLONE_NEWIPC|CLONE_NEWUTS)")
    _check(_libc.sethostname(b"sandbox", 7), "sethostname")


@functools.lru_cache(maxsize=4)
def plan(readable: tuple[str, ...]) -> tuple[tuple[str, ...], dict[str, str]]:
    """The bind mounts (outermost only, real paths) and the top-level symlinks to recreate.
    The fork server asks once, before it forks, so that no run's init pays for the lookups."""
    binds: set[str] = set()
    links: dict[str, str] = {}
    for path in readable:
        path = os.path.abspath(path)
        if os.path.islink(path):
            links[path] = os.readlink(path)
        if os.path.exists(path):
            binds.add(os.path.realpath(path))
    kept: list[str] = []
    for path in sorted(binds):
        if not any(path == k or path.startswith(k.rstrip("/") + "/") for k in kept):
            kept.append(path)
    return tuple(kept), links


def _covered(path: str, binds: Iterable[str]) -> bool:
    return any(path == b or path.startswith(b.rstrip("/") + "/") for b in binds)


def _make_target(root: str, path: str, like: str) -> str:
    """An empty file or directory at ``path`` inside the new root, parents included."""
    target = root + path
    os.makedirs(os.path.dirname(target), mode=0o755, exist_ok=True)
    if os.path.isdir(like):
        os.makedirs(target, mode=0o755, exist_ok=True)
    elif not os.path.exists(target):
        os.close(os.open(target, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644))
    return target


def build_root(root: str, readable: Iterable[str], workspace: str, *, scratch_bytes: int,
               scratch_inodes: int, owner: int | None) -> None:
    """Build the private root on the (empty) directory ``root`` and pivot into it.

    Runs as root, in the mount namespace ``enter_namespaces`` made; ``owner`` is the uid that
    will own the scratch (None: the current user's)."""
    mount(None, "/", None, _MS_REC | _MS_PRIVATE)  # nothing done here propagates to the host
    binds, links = plan(tuple(readable))
    mount("tmpfs", root, "tmpfs", _MS_NOSUID | _MS_NODEV, "size=1m,nr_inodes=4096,mode=0755")
    # The scratch first: a path the host keeps under /tmp (a workspace, a virtualenv) is bound on
    # top of it afterwards, read-only unless it is a workspace.
    scratch = _make_target(root, SCRATCH, "/")
    ids = "" if owner is None else f",uid={owner},gid={owner}"
    mount("tmpfs", scratch, "tmpfs", _MS_NOSUID | _MS_NODEV,
           f"size={scratch_bytes},nr_inodes={scratch_inodes},mode=0700{ids}")
    for path in binds:
        target = _make_target(root, path, path)
        mount(path, target, None, _MS_BIND | _MS_REC)
        flags = _MS_REMOUNT | _MS_BIND | _MS_RDONLY | _MS_NOSUID
        mount(None, target, None, flags if path in DEVICES else flags | _MS_NODEV)
    for path, destination in links.items():
        if not _covered(path, binds) and not os.path.lexists(root + path):
            os.makedirs(os.path.dirname(root + path), mode=0o755, exist_ok=True)
            os.symlink(destination, root + path)
    if workspace:  # setuid bits and device nodes in it mean nothing to a run
        target = _make_target(root, WORKSPACE, "/")
        mount(os.path.realpath(workspace), target, None, _MS_BIND | _MS_REC)
        mount(None, target, None, _MS_REMOUNT | _MS_BIND | _MS_NOSUID | _MS_NODEV)
    os.makedirs(root + "/proc", mode=0o555, exist_ok=True)
    os.chdir(root)
    _check(_libc.syscall(_SYS_PIVOT_ROOT, b".", b"."), "pivot_root")  # the old root now sits on top of "/"
    _check(_libc.umount2(b".", _MNT_DETACH), "umount2(old root)")
    os.chdir("/")
    mount(None, "/", None, _MS_REMOUNT | _MS_RDONLY | _MS_NOSUID | _MS_NODEV)


def mount_proc() -> None:
    """A /proc of the run's own PID namespace (called by its init)."""
    mount("proc", "/proc", "proc", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC)


EGRESS_PORT = 3128
"""Where a run's egress proxy listens, on 127.0.0.1 in the run's own network namespace."""
_SIOCGIFFLAGS, _SIOCSIFFLAGS, _IFF_UP = 0x8913, 0x8914, 0x1


def egress_listener() -> socket.socket:
    """In a run's init, in its new network namespace (before it drops its capabilities): bring
    the loopback interface up and listen on 127.0.0.1:``EGRESS_PORT``. Nothing else is up in
    the namespace; the host accepts on this socket when the run is given egress, and the init
    closes it otherwise."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as control:
        request = struct.pack("16sh14x", b"lo", 0)
        flags = struct.unpack("16sh14x", fcntl.ioctl(control, _SIOCGIFFLAGS, request))[1]
        fcntl.ioctl(control, _SIOCSIFFLAGS, struct.pack("16sh14x", b"lo", flags | _IFF_UP))
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        listener.bind(("127.0.0.1", EGRESS_PORT))
        listener.listen(64)
    except BaseException:
        listener.close()
        raise
    return listener
