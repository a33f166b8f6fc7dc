"""Linux confinement for one sandboxed run, applied in the forked child before user code.

Each control is a function that raises OSError when the kernel refuses it, so that the
executor can probe the host once and report (or refuse) exactly what it cannot enforce:

- ``namespaces``: new network namespace (no interface is up: nothing is reachable) and a new
  PID namespace (killing its init kills every process the code started);
- ``rlimits``: CPU seconds, address space, file size, open files, processes, no core dumps;
- ``landlock``: the file system is read-only (only the interpreter's and system libraries'
  directories are readable at all) except the run's scratch directory; TCP bind/connect is
  denied; signals and abstract unix sockets cannot reach processes outside the sandbox;
- ``seccomp``: a deny-list of syscalls no agent code needs (ptrace, mount, bpf, keyctl, ...);
- ``unprivileged``: the code runs as ``nobody`` when the host is root.
"""

from __future__ import annotations

import ctypes
import errno
import functools
import os
import resource
import struct
import sys
from collections.abc import Iterable

__all__ = ["CONTROLS", "drop_privileges", "enter_namespaces", "landlock", "limit_resources", "no_new_privs",
           "readable_paths", "seccomp_deny"]

CONTROLS = ("namespaces", "rlimits", "landlock", "seccomp", "unprivileged")
NOBODY = 65534

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long
_CLONE_NEWNET = 0x40000000
_CLONE_NEWPID = 0x20000000
_PR_SET_NO_NEW_PRIVS = 38
_PR_SET_SECCOMP = 22
_SECCOMP_MODE_FILTER = 2
_SYS_LANDLOCK_CREATE_RULESET = 444
_SYS_LANDLOCK_ADD_RULE = 445
_SYS_LANDLOCK_RESTRICT_SELF = 446


def _check(result: int, what: str) -> int:
    if result < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")
    return result


def enter_namespaces() -> None:
    """New network and PID namespaces; the caller's next fork becomes the namespace's init."""
    _check(_libc.unshare(_CLONE_NEWNET | _CLONE_NEWPID), "unshare(CLONE_NEWNET|CLONE_NEWPID)")


def limit_resources(*, cpu_seconds: int, memory_bytes: int, file_bytes: int, open_files: int,
                    processes: int) -> None:
    for limit, value in ((resource.RLIMIT_CPU, cpu_seconds), (resource.RLIMIT_AS, memory_bytes),
                         (resource.RLIMIT_FSIZE, file_bytes), (resource.RLIMIT_NOFILE, open_files),
                         (resource.RLIMIT_NPROC, processes), (resource.RLIMIT_CORE, 0)):
        resource.setrlimit(limit, (value, value))


def no_new_privs() -> None:
    _check(_libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(PR_SET_NO_NEW_PRIVS)")


# ---------------------------------------------------------------------------------- landlock
_FS_READ = (1 << 0) | (1 << 2) | (1 << 3)  # EXECUTE, READ_FILE, READ_DIR
_FS_WRITE_V1 = (1 << 1) | sum(1 << b for b in range(4, 13))  # WRITE_FILE, REMOVE_*, MAKE_*
_FS_REFER, _FS_TRUNCATE, _FS_IOCTL_DEV = 1 << 13, 1 << 14, 1 << 15
_NET_ALL = (1 << 0) | (1 << 1)  # BIND_TCP, CONNECT_TCP
_SCOPE_ALL = (1 << 0) | (1 << 1)  # ABSTRACT_UNIX_SOCKET, SIGNAL


def _landlock_abi() -> int:
    return _check(_libc.syscall(_SYS_LANDLOCK_CREATE_RULESET, None, 0, 1), "landlock_create_ruleset(version)")


def landlock(readable: Iterable[str], writable: Iterable[str]) -> None:
    """Allow reading ``readable`` and everything in ``writable``; deny the rest of the file
    system, TCP, and (ABI 6+) signals and abstract sockets reaching outside the sandbox."""
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
        for paths, access in ((readable, _FS_READ), (writable, fs_all)):
            for path in paths:
                _landlock_allow(ruleset, path, access)
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


# ----------------------------------------------------------------------------------- seccomp
_DENIED_X86_64 = {
    "ptrace": 101, "mount": 165, "umount2": 166, "pivot_root": 155, "chroot": 161, "swapon": 167,
    "swapoff": 168, "reboot": 169, "sethostname": 170, "setdomainname": 171, "init_module": 175,
    "delete_module": 176, "kexec_load": 246, "add_key": 248, "request_key": 249, "keyctl": 250,
    "unshare": 272, "perf_event_open": 298, "process_vm_readv": 310, "process_vm_writev": 311,
    "finit_module": 313, "kexec_file_load": 320, "bpf": 321, "userfaultfd": 323, "io_uring_setup": 425,
    "setns": 308, "open_by_handle_at": 304, "fsopen": 430, "fsmount": 432, "move_mount": 429,
}
_AUDIT_ARCH_X86_64 = 0xC000003E
_SECCOMP_RET_ALLOW = 0x7FFF0000
_SECCOMP_RET_ERRNO = 0x00050000
_SECCOMP_RET_KILL_PROCESS = 0x80000000


def _seccomp_program() -> bytes | None:
    """The deny-list as a classic BPF program, built once (None off x86-64)."""
    if os.uname().machine != "x86_64":
        return None

    def op(code: int, jt: int, jf: int, k: int) -> bytes:
        return struct.pack("=HBBI", code, jt, jf, k)

    ld_w_abs, jeq_k, ret_k = 0x20, 0x15, 0x06
    numbers = sorted(_DENIED_X86_64.values())
    prog = [op(ld_w_abs, 0, 0, 4), op(jeq_k, 1, 0, _AUDIT_ARCH_X86_64), op(ret_k, 0, 0, _SECCOMP_RET_KILL_PROCESS),
            op(ld_w_abs, 0, 0, 0)]
    for i, nr in enumerate(numbers):  # jump to the EPERM return at the end when nr matches
        prog.append(op(jeq_k, len(numbers) - i, 0, nr))
    prog += [op(ret_k, 0, 0, _SECCOMP_RET_ALLOW), op(ret_k, 0, 0, _SECCOMP_RET_ERRNO | errno.EPERM)]
    return b"".join(prog)


_SECCOMP_PROGRAM = _seccomp_program()


def seccomp_deny() -> None:
    """Install a filter that fails the syscalls in the deny-list with EPERM (x86-64 only)."""
    if _SECCOMP_PROGRAM is None:
        raise OSError(errno.ENOSYS, "the seccomp deny-list is written for x86-64 only")
    filters = ctypes.create_string_buffer(_SECCOMP_PROGRAM)
    fprog = ctypes.create_string_buffer(struct.pack("HxxxxxxQ", len(_SECCOMP_PROGRAM) // 8, ctypes.addressof(filters)))
    no_new_privs()
    _check(_libc.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, fprog, 0, 0), "prctl(PR_SET_SECCOMP)")


_PR_SET_KEEPCAPS = 8
_SYS_CAPSET = 126
_CAP_DAC_READ_SEARCH = 2


def drop_privileges(keep_read_search: bool = False) -> None:
    """Become ``nobody`` when running as root (a non-root host already runs unprivileged).

    ``keep_read_search`` keeps one capability, CAP_DAC_READ_SEARCH, for hosts whose
    interpreter lives where ``nobody`` cannot read (pyenv under a 0700 /root): Landlock still
    limits every read to the interpreter's directories, and seccomp denies open_by_handle_at.
    """
    if os.geteuid() != 0:
        return
    if keep_read_search:
        _check(_libc.prctl(_PR_SET_KEEPCAPS, 1, 0, 0, 0), "prctl(PR_SET_KEEPCAPS)")
    os.setgroups([])
    os.setgid(NOBODY)
    os.setuid(NOBODY)
    if keep_read_search:
        header = ctypes.create_string_buffer(struct.pack("=Ii", 0x20080522, 0))
        bit = 1 << _CAP_DAC_READ_SEARCH
        data = ctypes.create_string_buffer(struct.pack("=IIIIII", bit, bit, 0, 0, 0, 0))
        _check(_libc.syscall(_SYS_CAPSET, header, data), "capset(CAP_DAC_READ_SEARCH)")


def interpreter_readable_by_nobody() -> bool:
    """Whether an unprivileged uid can reach the standard library's files."""
    stdlib = os.path.dirname(os.__file__)
    path = "/"
    for part in stdlib.strip("/").split("/"):
        path = os.path.join(path, part)
        mode = os.stat(path).st_mode
        if not mode & 0o001:  # "others" may not traverse this directory
            return False
    return True


SYSTEM_READABLE = ("/usr", "/lib", "/lib64", "/bin", "/etc/ld.so.cache", "/etc/localtime", "/etc/ssl",
                   "/dev/null", "/dev/zero", "/dev/urandom", "/proc/self")


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
