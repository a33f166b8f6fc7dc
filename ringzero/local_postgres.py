"""A PostgreSQL server of your own on 127.0.0.1, from the server programs on this machine:
``ringzero postgres start`` (what ``PostgresCheckpointer`` and ``ringzero demo --ray`` need, in
one command, with no account or config to set up).

The server keeps its data in one folder (``.ringzero/postgres`` by default), trusts local
connections on 127.0.0.1 only (no password: a server for one machine's development and tests,
not for a network), and stays up until ``ringzero postgres stop``. It needs PostgreSQL's server
programs (``initdb``, ``pg_ctl``: Debian's and Ubuntu's ``postgresql`` package, Homebrew's
``postgresql``); as root it runs them as the ``postgres`` user, as PostgreSQL requires.
"""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
from pathlib import Path

from ringzero.core.errors import RingzeroError

__all__ = ["LocalPostgres", "NoPostgres", "server_programs"]

DEFAULT_FOLDER = Path(".ringzero") / "postgres"


class NoPostgres(RingzeroError):
    """PostgreSQL's server programs are not on this machine, or the server would not start."""


def server_programs() -> Path | None:
    """The folder of ``initdb`` and ``pg_ctl``: Debian's newest version, else the one on PATH."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(p.split("/")[4]))
    if found:
        return Path(found[-1]).parent
    initdb = shutil.which("initdb")
    return None if initdb is None else Path(initdb).resolve().parent


class LocalPostgres:
    """One server: its data in ``folder``, listening on 127.0.0.1:``port`` (a free port, chosen
    when the folder is made and kept in it)."""

    def __init__(self, folder: Path | str = DEFAULT_FOLDER, port: int | None = None) -> None:
        programs = server_programs()
        if programs is None:
            raise NoPostgres("PostgreSQL's server programs (initdb, pg_ctl) are not on this machine: install them "
                             "(apt-get install postgresql on Debian or Ubuntu, brew install postgresql on macOS), "
                             "or give a postgresql:// DSN of a server you have")
        self.programs = programs
        self.folder = Path(folder).absolute()
        self.data = self.folder / "data"
        kept = self.folder / "port"
        self.port = port or (int(kept.read_text()) if kept.exists() else _free_port())
        self.dsn = f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def create(self) -> None:
        """Make the folder's database cluster, where it has none."""
        if (self.data / "PG_VERSION").exists():
            return
        self.folder.mkdir(parents=True, exist_ok=True)
        self.data.mkdir(exist_ok=True)
        self._own(self.folder)
        self._run("initdb", "-D", str(self.data), "-A", "trust", "-U", "postgres", "--no-instructions")
        (self.folder / "port").write_text(str(self.port))

    def start(self) -> str:
        """Make the folder's database cluster if it has none, start the server (if it is not
        running already) and return its DSN."""
        self.create()
        if not self.running():
            options = f"-p {self.port} -k {self.data} -c listen_addresses=127.0.0.1"
            self._run("pg_ctl", "-D", str(self.data), "-o", options, "-w", "-l", str(self.folder / "log"), "start")
        return self.dsn

    def running(self) -> bool:
        if not (self.data / "PG_VERSION").exists():
            return False
        status = subprocess.run(self._as_owner("pg_ctl", "-D", str(self.data), "status"), capture_output=True,
                                text=True, timeout=60)
        return status.returncode == 0

    def stop(self, mode: str = "fast") -> None:
        """Stop the server: ``fast`` as an operator does, ``immediate`` as a crash would (no
        shutdown checkpoint; the tests' restart scenarios use it). Its data stays."""
        if self.running():
            self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "stop")

    def remove(self) -> None:
        """Stop the server and delete its folder, data and all."""
        self.stop("immediate")
        shutil.rmtree(self.folder, ignore_errors=True)

    # ------------------------------------------------------------------ helpers
    def _run(self, program: str, *args: str) -> None:
        done = subprocess.run(self._as_owner(program, *args), capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            log = self.folder / "log"
            tail = log.read_text(errors="replace")[-800:] if log.exists() else ""
            raise NoPostgres(f"{program} {args[0]} ... failed: {(done.stderr or done.stdout).strip()[-800:]}"
                             + (f"\n{tail}" if tail else ""))

    def _as_owner(self, program: str, *args: str) -> list[str]:
        command = [str(self.programs / program), *args]
        return ["runuser", "-u", "postgres", "--", *command] if os.geteuid() == 0 else command

    @staticmethod
    def _own(folder: Path) -> None:
        """As root, the ``postgres`` user must own the folder: PostgreSQL refuses to run as root."""
        if os.geteuid() == 0:
            for path in (folder, *folder.rglob("*")):
                shutil.chown(path, "postgres", "postgres")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
