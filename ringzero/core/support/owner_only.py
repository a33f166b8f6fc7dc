"""Folders and files ringzero keeps state in are its owner's alone, whatever the umask.

A store holds every prompt, answer and tool argument its agents sent; the MCP server's token and
the local PostgreSQL's password sit beside theirs. On a machine others share, the usual umask
(022) would leave all of that readable by every local user. So every folder ringzero creates for
state is made 0700 (each one it creates on the way too) and every file it creates there 0600,
by ``chmod`` after creation, so no umask can widen them; a folder named ``.ringzero`` is
ringzero's by name and is made 0700 even where an older version created it. What a user points
ringzero at (an existing folder, a store file of their own) keeps the user's modes:
``readable_by_others`` says where those let other users read (``ringzero doctor``).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

__all__ = ["OWN_FOLDER", "owner_only_file", "owner_only_folder", "readable_by_others"]

OWN_FOLDER = ".ringzero"
"""The name of ringzero's own state folder (``./.ringzero`` by default)."""


def owner_only_folder(path: str | os.PathLike[str]) -> Path:
    """``path`` as a folder: created where missing, with each folder created on the way, 0700;
    a ``.ringzero`` folder on it made 0700 if it is the caller's. Returns it."""
    folder = Path(path).absolute()
    missing = []
    for candidate in (folder, *folder.parents):
        if candidate.exists():
            break
        missing.append(candidate)
    for made in reversed(missing):
        try:
            made.mkdir(mode=0o700)
        except FileExistsError:  # another process made it meanwhile
            continue
        os.chmod(made, 0o700)
    for part in (folder, *folder.parents):
        if part.name == OWN_FOLDER and part.is_dir() and part.stat().st_uid == os.geteuid():
            os.chmod(part, 0o700)
    return folder


def owner_only_file(path: str | os.PathLike[str]) -> None:
    """Create the file ``path`` empty, 0600, where it does not exist; an existing one of the
    caller's is made 0600. (SQLite makes a database's WAL and shared-memory files with the
    database's own mode, so creating the database this way covers them.)"""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    except FileExistsError:
        if os.stat(path).st_uid == os.geteuid():
            os.chmod(path, 0o600)
        return
    os.fchmod(fd, 0o600)
    os.close(fd)


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
