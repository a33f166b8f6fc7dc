"""An agent's workspace on the host: a file system of its own, with a quota, owned by a uid of
its own. Host side of the process sandbox (root only), used before any fork server starts.

**Quota.** A workspace is kept between runs on the host's disk, so nothing in the kernel bounds
what runs write there; a bind mount has no size. So each workspace is an ext4 image (sparse: it
takes on disk what its files take) of ``max_bytes`` with ``max_files`` inodes, attached to a loop
device and mounted at the workspace's path (``nosuid,nodev``). A run that fills it gets
``ENOSPC`` inside its code; the host's disk is not touched beyond the image. The mount stays after
the executor closes, so the host reads the workspace's files at its path as before; ``release``
unmounts it (the files stay in the image, and come back at the next start). Files the directory
held before its first use move into the image. Where the host cannot do this (not root, no loop
device, no ``mke2fs``), ``prepare`` says why, and the executor refuses unless
``allow_weaker_isolation=True``.

**Images are root's.** Every image lives in one root-owned folder (``WORKSPACE_IMAGES``, 0700),
named by a hash of the workspace's real path, never beside the workspace: no other user, and no
agent writing in its own workspace, can put an image where one is looked for. An image is created
``O_EXCL | O_NOFOLLOW``; an existing one is used only where it is root's, 0600, a regular file
with one name. A workspace inside another workspace's mount is refused (its agent could shape
what the inner one holds). Preparing one takes an exclusive lock on its image's lock file, and
an image a loop device already backs is not attached a second time: two executors preparing one
workspace at once mount it once.

**Uid.** Each workspace gets a uid no other workspace has: allocated once, recorded in a
host-wide registry (``WORKSPACE_UID_REGISTRY``, a file per uid naming its workspace, created
exclusively, so two workspaces can never take the same one), and kept as the owner of the
workspace's root (a workspace found again keeps its uid).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import glob
import hashlib
import os
import shutil
import stat
import struct
import subprocess
import tempfile
import zlib
from collections.abc import Iterator

from ringzero.core.contract.errors import InvalidArgument
from ringzero.core.support.owner_only import owner_only_folder
from ringzero.providers.executors import _mounts
from ringzero.providers.executors._confine import RUN_UIDS, UID_SPAN

__all__ = [
    "WORKSPACE_BYTES",
    "WORKSPACE_FILES",
    "WORKSPACE_IMAGES",
    "WORKSPACE_UID_REGISTRY",
    "forget",
    "image_of",
    "prepare",
    "release",
    "workspace_uid",
]

WORKSPACE_BYTES = 1 << 30
"""A workspace's quota unless the executor is told otherwise: 1 GiB."""
WORKSPACE_FILES = 65_536
"""Files and folders a workspace may hold unless the executor is told otherwise."""
WORKSPACE_UID_REGISTRY = "/var/lib/ringzero/workspace-uids"
WORKSPACE_IMAGES = "/var/lib/ringzero/workspace-images"
"""Where every workspace's image lives: root's alone."""
_WORKSPACE_UIDS = RUN_UIDS + UID_SPAN  # the upper range; runs without a workspace take the lower one

_LOOP_CTL_GET_FREE = 0x4C82
_LOOP_CONFIGURE = 0x4C0A
_LO_FLAGS_AUTOCLEAR = 4
_MS_NOSUID, _MS_NODEV = 2, 4
_libc = ctypes.CDLL(None, use_errno=True)
_libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]


def workspace_uid(path: str, registry: str = WORKSPACE_UID_REGISTRY) -> int:
    """The uid of the workspace at ``path``: the one it was given before (it owns the
    workspace's root, and the registry names this path for it), else the first free one."""
    real = os.path.realpath(path)
    os.makedirs(registry, mode=0o700, exist_ok=True)
    with contextlib.suppress(OSError):
        owner = os.stat(real).st_uid
        if _WORKSPACE_UIDS <= owner < _WORKSPACE_UIDS + UID_SPAN and _named(registry, owner) == real:
            return owner
    start = zlib.crc32(real.encode()) % UID_SPAN  # where this path's search starts: stable, not unique
    for step in range(UID_SPAN):
        uid = _WORKSPACE_UIDS + (start + step) % UID_SPAN
        try:
            fd = os.open(os.path.join(registry, str(uid)), os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        except FileExistsError:
            if _named(registry, uid) == real:  # this workspace's own, from before
                return uid
            continue
        with os.fdopen(fd, "w") as entry:
            entry.write(real)
        return uid
    raise OSError(errno.ENOSPC, f"every workspace uid in {registry} is taken")


def _named(registry: str, uid: int) -> str | None:
    try:
        with open(os.path.join(registry, str(uid))) as entry:
            return entry.read()
    except OSError:
        return None


def image_of(path: str, images: str = WORKSPACE_IMAGES) -> str:
    """Where the workspace at ``path`` keeps its files: an image in root's ``images`` folder."""
    real = os.path.realpath(path)
    return os.path.join(images, hashlib.sha256(real.encode()).hexdigest()[:40] + ".ext4")


def prepare(path: str, uid: int, *, max_bytes: int, max_files: int) -> str | None:
    """Make the workspace at ``path`` ready for its agent's runs: a folder owned by ``uid``,
    mode 0700, holding a file system of ``max_bytes`` and ``max_files`` (mounted now, unless it
    already is). Returns why the quota cannot be enforced on this host (the folder is then a
    plain folder), or None. Raises InvalidArgument, naming it, for a path inside another
    workspace's mount or a folder that is neither the host's nor this workspace's."""
    real = os.path.realpath(path)
    outer = _workspace_around(real)
    if outer is not None:
        raise InvalidArgument(f"the workspace {path} lies inside the workspace mounted at {outer}: an agent's files "
                              "cannot hold another agent's workspace; give a path outside it")
    if os.path.exists(real):
        found = os.stat(real)
        if found.st_uid not in (os.geteuid(), uid) or stat.S_IMODE(found.st_mode) & 0o002:
            raise InvalidArgument(f"the workspace {path} is uid {found.st_uid}'s, mode "
                                  f"{stat.S_IMODE(found.st_mode):04o}: neither the host's nor its agent's alone, so "
                                  "another user may have made it; give a folder of yours")
    else:
        owner_only_folder(path)
    with _preparing(image_of(real)) as lock:
        refused = _quota(real, uid, max_bytes, max_files, lock)
        fd = os.open(real, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            os.fchown(fd, uid, uid)
            os.fchmod(fd, 0o700)
        finally:
            os.close(fd)
    return refused


@contextlib.contextmanager
def _preparing(image: str) -> Iterator[int]:
    """An exclusive lock on ``image``'s lock file, in root's images folder, while it is prepared;
    yields the lock file, which names the workspace the image is for (``_record``)."""
    _images_folder(os.path.dirname(image))
    lock = os.open(_lock_of(image), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield lock
    finally:
        os.close(lock)


def _lock_of(image: str) -> str:
    return image[:-len(".ext4")] + ".lock"


def _record(lock: int, real: str) -> None:
    """Name the workspace in its image's lock file (``release_under`` finds images by it)."""
    os.ftruncate(lock, 0)
    os.pwrite(lock, f"{real}\n".encode(), 0)


def _images_folder(folder: str) -> None:
    """Make ``folder`` (root's, 0700) where missing; refuse one that is not root's alone."""
    os.makedirs(folder, mode=0o700, exist_ok=True)
    found = os.lstat(folder)
    if not stat.S_ISDIR(found.st_mode) or found.st_uid != 0 or stat.S_IMODE(found.st_mode) & 0o077:
        raise InvalidArgument(f"{folder} holds workspace images and must be a folder of root's alone (0700); it is "
                              f"uid {found.st_uid}, mode {stat.S_IMODE(found.st_mode):04o}: remove it")


def _workspace_around(real: str) -> str | None:
    """The mount point of a workspace that holds ``real`` (above it), or None."""
    for point, image in _loop_mounts():
        if os.path.dirname(image) == WORKSPACE_IMAGES and real != point and \
                real.startswith(point.rstrip(os.sep) + os.sep):
            return point
    return None


def _loop_mounts() -> list[tuple[str, str]]:
    """``(mount point, backing file)`` of every loop-device mount this process sees."""
    try:
        with open("/proc/self/mountinfo") as lines:
            mounts = [line.split() for line in lines]
    except OSError:
        return []
    found = []
    for fields in mounts:
        backing = _backing_file(os.path.basename(fields[fields.index("-") + 2]))
        if backing is not None:
            found.append((_unescape(fields[4]), backing))
    return found


def _backing_file(device: str) -> str | None:
    """The file loop device ``device`` (``loop3``) is backed by, or None."""
    if not device.startswith("loop"):
        return None
    try:
        with open(f"/sys/block/{device}/loop/backing_file") as backing:
            return backing.read().strip()
    except OSError:
        return None


def _attached(image: str) -> list[str]:
    """The loop devices backed by ``image``."""
    devices = (path.split("/")[3] for path in glob.glob("/sys/block/loop*/loop/backing_file"))
    return [f"/dev/{device}" for device in devices if _backing_file(device) == image]


def _mke2fs() -> str | None:
    return shutil.which("mke2fs") or shutil.which("mke2fs", path="/usr/sbin:/sbin")


def unavailable() -> str | None:
    """Why this host cannot give a workspace a file system with a quota, or None."""
    if os.geteuid() != 0:
        return "the host is not root: a workspace gets no uid or file system of its own"
    if _mke2fs() is None:
        return "no mke2fs on this host (Debian: e2fsprogs) to make a workspace's file system"
    if not os.path.exists("/dev/loop-control"):
        return "no loop devices on this host (/dev/loop-control)"
    return None


def _quota(real: str, uid: int, max_bytes: int, max_files: int, lock: int) -> str | None:
    image = image_of(real)
    if _mounted_from(real) == image:
        return None
    mkfs = _mke2fs()
    refused = unavailable()
    if refused is not None or mkfs is None:
        return refused
    attached = _attached(image)
    if attached:  # mounted elsewhere, or left attached: a second mount of one ext4 damages it
        raise InvalidArgument(f"the image of the workspace {real} is attached already ({', '.join(attached)}) but "
                              "not mounted there: unmount it (or detach the loop device) first")
    _record(lock, real)
    try:
        backing = os.open(image, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        fresh = True
    except FileExistsError:
        backing, fresh = _existing_image(image, real), False
    try:
        if fresh:
            os.fchmod(backing, 0o600)
            os.ftruncate(backing, max_bytes)  # sparse: the image takes on disk what its files take
            inodes = min(max_files, max(64, max_bytes // 4096))  # no more than one per block: the table must fit
            made = subprocess.run([mkfs, "-q", "-F", "-t", "ext4", "-m", "0", "-N", str(inodes), "-E",
                                   f"root_owner={uid}:{uid},lazy_itable_init=1,lazy_journal_init=1",
                                   f"/proc/self/fd/{backing}"], capture_output=True, text=True, check=False,
                                  pass_fds=(backing,))
            if made.returncode != 0:
                os.unlink(image)
                return f"mke2fs could not make the workspace's file system: {made.stderr.strip()[-300:]}"
        try:
            if fresh and os.listdir(real):
                _move_in(real, backing, image, uid)
            _mount(backing, image, real)
        except OSError as exc:
            return f"the workspace's file system could not be mounted: {exc}"
    finally:
        os.close(backing)
    if fresh:
        with contextlib.suppress(OSError):
            os.rmdir(os.path.join(real, "lost+found"))  # mke2fs's; a run should find its workspace empty
    return None


def _existing_image(image: str, real: str) -> int:
    """``image`` opened without following a link, where it is root's, 0600, a regular file with
    one name; else InvalidArgument naming it."""
    try:
        fd = os.open(image, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno != errno.ELOOP:
            raise
        raise InvalidArgument(f"{image}, the image of the workspace {real}, is a link, which is never followed: "
                              "it is not mounted; remove it") from None
    found = os.fstat(fd)
    if (not stat.S_ISREG(found.st_mode) or found.st_uid != 0 or stat.S_IMODE(found.st_mode) != 0o600
            or found.st_nlink != 1):
        os.close(fd)
        raise InvalidArgument(f"{image}, the image of the workspace {real}, is not a file of root's alone (uid "
                              f"{found.st_uid}, mode {stat.S_IMODE(found.st_mode):04o}, {found.st_nlink} names): "
                              "it is not mounted; remove it")
    return fd


def _move_in(real: str, backing: int, image: str, uid: int) -> None:
    """Move what the folder held before its first use into the new file system, owned by the
    workspace's agent."""
    staging = tempfile.mkdtemp(prefix="ringzero-workspace-")
    try:
        _mount(backing, image, staging)
        try:
            for entry in os.listdir(real):
                source, target = os.path.join(real, entry), os.path.join(staging, entry)
                if os.path.isdir(source) and not os.path.islink(source):
                    shutil.copytree(source, target, symlinks=True)
                else:
                    shutil.copy2(source, target, follow_symlinks=False)
            for folder, dirs, files in os.walk(staging):
                for name in [*dirs, *files]:
                    os.chown(os.path.join(folder, name), uid, uid, follow_symlinks=False)
            for entry in os.listdir(real):
                source = os.path.join(real, entry)
                if os.path.isdir(source) and not os.path.islink(source):
                    shutil.rmtree(source)
                else:
                    os.unlink(source)
        finally:
            _unmount(staging)
    finally:
        os.rmdir(staging)


def _mount(backing: int, image: str, target: str) -> None:
    """Attach the open image ``backing`` to a free loop device (cleared once nothing uses it)
    and mount it at ``target``."""
    control = os.open("/dev/loop-control", os.O_RDWR | os.O_CLOEXEC)
    try:
        for _ in range(8):  # another process may take the free device first
            number = fcntl.ioctl(control, _LOOP_CTL_GET_FREE)
            device = f"/dev/loop{number}"
            loop = os.open(device, os.O_RDWR | os.O_CLOEXEC)
            info = struct.pack("=QQQQQIIII64s64s32sQQ", 0, 0, 0, 0, 0, 0, 0, 0, _LO_FLAGS_AUTOCLEAR,
                               image.encode()[-63:], b"", b"", 0, 0)
            config = struct.pack("=II", backing, 0) + info + bytes(64)
            try:
                fcntl.ioctl(loop, _LOOP_CONFIGURE, config)
            except OSError as exc:
                os.close(loop)
                if exc.errno == errno.EBUSY:
                    continue
                raise
            try:  # mounted before the device is closed: autoclear would detach it
                _mounts.mount(device, target, "ext4", _MS_NOSUID | _MS_NODEV)
            finally:
                os.close(loop)
            return
        raise OSError(errno.EBUSY, "no loop device stayed free long enough to attach the workspace")
    finally:
        os.close(control)


def _mounted_from(real: str) -> str | None:
    """The image mounted at ``real`` through a loop device, or None."""
    try:
        with open("/proc/self/mountinfo") as lines:
            mounts = [line.split() for line in lines]
    except OSError:
        return None
    for fields in reversed(mounts):  # the last mount at a path is the one seen there
        if _unescape(fields[4]) == real:
            return _backing_file(os.path.basename(fields[fields.index("-") + 2]))
    return None


def _unescape(field: str) -> str:
    """A mountinfo path: spaces and the like are written as octal escapes."""
    return field.encode().decode("unicode_escape").encode("latin-1").decode()


def _unmount(target: str) -> None:
    if _libc.umount2(target.encode(), 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"umount({target!r}): {os.strerror(err)}")


def release(path: str) -> None:
    """Unmount the workspace at ``path`` (its files stay in its image; the next executor given
    it mounts it again). Nothing happens where it is not mounted."""
    real = os.path.realpath(path)
    if _mounted_from(real) == image_of(real):
        _unmount(real)


def forget(path: str) -> None:
    """Release the workspace at ``path`` and delete its image, its files with it (the folder
    itself is the caller's to remove)."""
    real = os.path.realpath(path)
    release(real)
    image = image_of(real)
    for each in (image, _lock_of(image)):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(each)


def release_under(folder: str, *, forget_images: bool = False) -> None:
    """``release`` every workspace mounted under ``folder`` (before removing the folder); with
    ``forget_images``, ``forget`` every workspace whose image names a path under it."""
    top = os.path.realpath(folder) + os.sep
    try:
        with open("/proc/self/mountinfo") as lines:
            points = [_unescape(line.split()[4]) for line in lines]
    except OSError:
        return
    for point in reversed(points):
        if point.startswith(top):
            release(point)
    if forget_images:
        for lock in glob.glob(os.path.join(WORKSPACE_IMAGES, "*.lock")):
            path = ""
            with contextlib.suppress(OSError), open(lock) as named:
                path = named.readline().rstrip("\n")
            if path.startswith(top):
                forget(path)
