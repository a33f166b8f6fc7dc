"""The ProcessExecutor's seccomp filter: a classic BPF program built here, for x86-64.

We build the program ourselves rather than through libseccomp so that the executor needs no
system package, and we check by hand the two things libseccomp would check for us (each has
its own test in ``tests/test_sandbox_attacks.py``):

- the **architecture**: a syscall entered through another ABI (``int 0x80`` runs the i386
  table on an x86-64 kernel with IA32 emulation) fails with EPERM, whatever its number;
- the **x32 bit**: a syscall number with ``__X32_SYSCALL_BIT`` set fails with EPERM, so the
  x32 table cannot be used to reach a denied call under another number.

Then, by number:

- a deny-list of calls no agent code needs (ptrace, mount, bpf, keyctl, kernel modules,
  namespaces, io_uring, userfaultfd, kernel log, the LDT, vmsplice, secret memory, mount
  listings, pidfds, fanotify marks, clock adjustment, ...): EPERM;
- ``clone`` with any namespace flag (CLONE_NEWUSER above all: a user namespace would hand the
  code every capability inside it): EPERM; a plain fork or thread passes;
- ``clone3``: ENOSYS, because its flags live in memory a filter cannot read; the C library
  falls back to ``clone``, which is checked;
- a file mode with S_ISUID or S_ISGID (``chmod`` and its kin, ``open``/``creat``/``mknod``
  creating a file): EPERM, so no run leaves a set-id file behind (``openat2``, whose mode a
  filter cannot read: ENOSYS);
- ``socket``: only AF_UNIX, AF_INET, AF_INET6 and AF_NETLINK may be created (in the run's
  own, empty network namespace and private root); AF_VSOCK (which a network namespace does
  not isolate from a VM's host), AF_PACKET and the rest fail with EAFNOSUPPORT.
"""

from __future__ import annotations

import ctypes
import errno
import os
import struct

__all__ = ["DENIED", "install", "program"]

# x86-64 numbers (arch/x86/entry/syscalls/syscall_64.tbl).
DENIED = {
    "syslog": 103, "ptrace": 101, "uselib": 134, "personality": 135, "pivot_root": 155, "chroot": 161,
    "acct": 163, "settimeofday": 164, "mount": 165, "umount2": 166, "swapon": 167, "swapoff": 168,
    "reboot": 169, "sethostname": 170, "setdomainname": 171, "iopl": 172, "ioperm": 173, "init_module": 175,
    "delete_module": 176, "quotactl": 179, "lookup_dcookie": 212, "kexec_load": 246, "add_key": 248,
    "request_key": 249, "keyctl": 250, "unshare": 272, "perf_event_open": 298, "fanotify_init": 300,
    "name_to_handle_at": 303, "open_by_handle_at": 304, "setns": 308, "process_vm_readv": 310,
    "process_vm_writev": 311, "kcmp": 312, "finit_module": 313, "kexec_file_load": 320, "bpf": 321,
    "userfaultfd": 323, "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427,
    "open_tree": 428, "move_mount": 429, "fsopen": 430, "fsconfig": 431, "fsmount": 432, "fspick": 433,
    "pidfd_getfd": 438, "process_madvise": 440, "mount_setattr": 442, "quotactl_fd": 443,
    # what untrusted Python has no use for, each a kernel surface of its own
    "modify_ldt": 154, "vmsplice": 278, "fanotify_mark": 301, "clock_adjtime": 305, "pidfd_open": 434,
    "memfd_secret": 447, "statmount": 457, "listmount": 458,
}
CLONE, CLONE3, SOCKET = 56, 435, 41
MODE_ARGUMENT = {"creat": (85, 1), "open": (2, 2), "openat": (257, 3), "chmod": (90, 1), "fchmod": (91, 1),
                 "fchmodat": (268, 2), "fchmodat2": (452, 2), "mknod": (133, 1), "mknodat": (259, 2)}
"""The calls that set a file's mode, and which argument holds it: none may set S_ISUID or S_ISGID."""
SET_ID_BITS = 0o6000
OPENAT2 = 437  # its mode lives in memory a filter cannot read: ENOSYS, and the C library uses openat
X32_SYSCALL_BIT = 0x40000000
# CLONE_NEWNS | NEWCGROUP | NEWUTS | NEWIPC | NEWUSER | NEWPID | NEWNET (clone's low byte is the
# exit signal, so CLONE_NEWTIME, which only clone3 and unshare take, is not among them).
CLONE_NAMESPACE_FLAGS = 0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000 | 0x40000000
SOCKET_FAMILIES = (1, 2, 10, 16)  # AF_UNIX, AF_INET, AF_INET6, AF_NETLINK

_AUDIT_ARCH_X86_64 = 0xC000003E
_ALLOW = 0x7FFF0000
_ERRNO = 0x00050000
_LD_W_ABS, _JEQ_K, _JGE_K, _JSET_K, _RET_K = 0x20, 0x15, 0x35, 0x45, 0x06
_NR, _ARCH, _ARG0 = 0, 4, 16  # offsets in struct seccomp_data (args[0]'s low half on little endian)
_ARG_SIZE = 8


class _Assembler:
    """Classic BPF with named jump targets, resolved when the program is finished."""

    def __init__(self) -> None:
        self.code: list[tuple[int, str | int, str | int, int]] = []
        self.labels: dict[str, int] = {}

    def label(self, name: str) -> None:
        self.labels[name] = len(self.code)

    def load(self, offset: int) -> None:
        self.code.append((_LD_W_ABS, 0, 0, offset))

    def jump(self, op: int, k: int, true: str | int, false: str | int = 0) -> None:
        self.code.append((op, true, false, k))

    def ret(self, value: int) -> None:
        self.code.append((_RET_K, 0, 0, value))

    def assemble(self) -> bytes:
        out = []
        for pc, (op, jt, jf, k) in enumerate(self.code):
            def offset(target: str | int, pc: int = pc) -> int:
                if isinstance(target, int):
                    return target
                distance = self.labels[target] - pc - 1
                if not 0 <= distance <= 255:
                    raise ValueError(f"a BPF jump to {target} is out of range")
                return distance
            out.append(struct.pack("=HBBI", op, offset(jt), offset(jf), k))
        return b"".join(out)


def program() -> bytes:
    """The filter as a classic BPF program."""
    asm = _Assembler()
    asm.load(_ARCH)
    asm.jump(_JEQ_K, _AUDIT_ARCH_X86_64, 0, "eperm")
    asm.load(_NR)
    asm.jump(_JGE_K, X32_SYSCALL_BIT, "eperm")
    for number in sorted(DENIED.values()):
        asm.jump(_JEQ_K, number, "eperm")
    asm.jump(_JEQ_K, CLONE, "clone")
    asm.jump(_JEQ_K, CLONE3, "enosys")
    asm.jump(_JEQ_K, OPENAT2, "enosys")
    asm.jump(_JEQ_K, SOCKET, "socket")
    for name, (number, _) in MODE_ARGUMENT.items():
        asm.jump(_JEQ_K, number, f"mode {name}")
    asm.ret(_ALLOW)
    for name, (_, argument) in MODE_ARGUMENT.items():
        asm.label(f"mode {name}")
        asm.load(_ARG0 + _ARG_SIZE * argument)
        asm.jump(_JSET_K, SET_ID_BITS, "eperm")
        asm.ret(_ALLOW)
    asm.label("clone")
    asm.load(_ARG0)
    asm.jump(_JSET_K, CLONE_NAMESPACE_FLAGS, "eperm")
    asm.ret(_ALLOW)
    asm.label("socket")
    asm.load(_ARG0)
    for family in SOCKET_FAMILIES:
        asm.jump(_JEQ_K, family, "allow")
    asm.ret(_ERRNO | errno.EAFNOSUPPORT)
    asm.label("allow")
    asm.ret(_ALLOW)
    asm.label("enosys")
    asm.ret(_ERRNO | errno.ENOSYS)
    asm.label("eperm")
    asm.ret(_ERRNO | errno.EPERM)
    return asm.assemble()


_PROGRAM = program() if os.uname().machine == "x86_64" else None
_PR_SET_NO_NEW_PRIVS = 38
_PR_SET_SECCOMP = 22
_SECCOMP_MODE_FILTER = 2


def install() -> None:
    """Apply the filter to the calling thread and its future children (x86-64 only)."""
    if _PROGRAM is None:
        raise OSError(errno.ENOSYS, "the seccomp filter is written for x86-64 only")
    libc = ctypes.CDLL(None, use_errno=True)
    filters = ctypes.create_string_buffer(_PROGRAM)
    fprog = ctypes.create_string_buffer(struct.pack("HxxxxxxQ", len(_PROGRAM) // 8, ctypes.addressof(filters)))
    for option, args in ((_PR_SET_NO_NEW_PRIVS, (1, 0, 0, 0)), (_PR_SET_SECCOMP, (_SECCOMP_MODE_FILTER, fprog, 0, 0))):
        if libc.prctl(option, *args) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"prctl({option}): {os.strerror(err)}")
