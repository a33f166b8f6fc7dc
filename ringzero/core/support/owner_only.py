"""Folders and files ringzero keeps state in are its owner's alone, whatever the umask.

A store holds every prompt, answer and tool argument its agents sent; the MCP server's token and
the local PostgreSQL's password sit beside theirs. On a machine others share, the usual umask
(022) would leave all of that readable by every local user. So every folder ringzero creates for
state is made 0700 (each one it creates on the way too) and every file it creates there 0600,
by ``chmod`` after creation, so no umask can widen them; a folder named ``.ringzero`` is
ringzero's by name and is made 0700 even where an older version created it. What a user points
ringzero at (an existing folder, a store file of their own) keeps the user's modes:
``readable_by_others`` says where those let other users read (``ringzero doctor``).

What ringzero finds must be the user's (git's ``safe.directory`` rule): an existing state
folder, or a state file, owned by another user, or a folder others may write in, is refused with
an ``InvalidArgument`` naming it (``refuse_unless_yours``), so a ``.ringzero`` folder, a token or
a store another user planted is never used. Files are created with ``O_EXCL | O_NOFOLLOW``: a
link planted where one goes is refused, never followed.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from ringzero.core.contract.errors import InvalidArgument

__all__ = ["OWN_FOLDER", "owner_only_file", "owner_only_folder", "readable_by_others", "refuse_unless_yours"]

OWN_FOLDER = ".ringzero"
"""The name of ringzero's own state folder (``./.ringzero`` by default)."""


def owner_only_folder(path: str | os.PathLike[str]) -> Path:
    """``path`` as a folder: created where missing, with each folder created on the way, 0700;
    a ``.ringzero`` folder on it made 0700 (root's may stay 0711: ``LocalPostgres``'s server,
    run as the ``postgres`` user, passes through it to its data). An existing one, and each
    ``.ringzero`` on the way, must be the caller's (``refuse_unless_yours``). Returns it."""
    folder = Path(path).absolute()
    missing = []
    for candidate in (folder, *folder.parents):
        if candidate.exists():
            break
        missing.append(candidate)
    for made in reversed(missing):
        try:
            made.mkdir(mode=0o700)
        except FileExistsError:  # another process made it meanwhile: checked below as any found one
            continue
        os.chmod(made, 0o700)
    for part in (folder, *folder.parents):
        if part == folder or part.name == OWN_FOLDER:
            refuse_unless_yours(part)
        if part.name == OWN_FOLDER:
            kept = stat.S_IMODE(part.stat().st_mode) & 0o011 if os.geteuid() == 0 else 0
            os.chmod(part, 0o700 | kept)
    return folder


def owner_only_file(path: str | os.PathLike[str]) -> None:
    """Create the file ``path`` empty, 0600, where it does not exist (``O_EXCL | O_NOFOLLOW``:
    never through a link); an existing one must be the caller's regular file
    (``refuse_unless_yours``), and is made 0600. (SQLite makes a database's WAL and
    shared-memory files with the database's own mode, so creating the database this way
    covers them.)"""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except FileExistsError:
        refuse_unless_yours(path, file=True)
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        os.fchmod(fd, 0o600)
    finally:
        os.close(fd)


def refuse_unless_yours(path: str | os.PathLike[str], *, file: bool = False) -> None:
    """Raise InvalidArgument naming ``path`` where it is not the caller's to keep state in: owned
    by another user, writable by other users, a link (for a ``file``), or
    not a regular file (for a ``file``). A missing path passes."""
    try:
        found = os.lstat(path) if file else os.stat(path)
    except FileNotFoundError:
        return
    mode = stat.S_IMODE(found.st_mode)
    why = None
    if file and stat.S_ISLNK(found.st_mode):
        why = "is a link, which ringzero does not follow for its state"
    elif file and not stat.S_ISREG(found.st_mode):
        why = "is not a regular file"
    elif found.st_uid != os.geteuid():
        why = f"belongs to another user (uid {found.st_uid}; you are {os.geteuid()})"
    elif mode & 0o002:
        why = f"may be written by other users (mode {mode:04o})"
    if why is not None:
        raise InvalidArgument(f"{path} {why}: ringzero keeps state only in folders and files of yours that no other "
                              "user may write; another user may have planted it. Remove it (or give another "
                              "folder), and ringzero makes its own")


def readable_by_others(path: str | os.PathLike[str]) -> str | None:
    """Why other local users can read the file ``path`` (its mode, and its folder's), or None.
    A file they may not reach through its folder is safe whatever its own mode."""
    file = Path(path).absolute()
    try:
        mode = stat.S_IMODE(file.stat().st_mode)
        folder = stat.S_IMODE(file.parent.stat().st_mode)
    except OSError:
        return None
    if not mode & 0o044 or not folder & 0o011:
        return None
    return (f"{file} is readable by other users (mode {mode:04o}, its folder {folder:04o}): "
            f"chmod 600 {file}* and chmod 700 {file.parent}")
