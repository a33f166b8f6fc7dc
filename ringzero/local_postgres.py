"""A PostgreSQL server of your own on 127.0.0.1, from the server programs on this machine:
``ringzero postgres start`` (what ``PostgresCheckpointer`` and ``ringzero demo --ray`` need, in
one command, with no account or config to set up).

The server keeps its data in one folder (``.ringzero/postgres`` by default, its owner's alone),
listens on 127.0.0.1 only, and stays up until ``ringzero postgres stop``. Every connection needs
the password of its ``postgres`` user (``scram-sha-256``): generated when the folder is made,
kept owner-only in it (``password``), and carried by the DSN ``start`` prints, so another user
of the machine cannot connect (a superuser can run programs as the server's user). A folder
made by an older ringzero, which trusted local connections, gets a password at its next start.
It needs PostgreSQL's server programs (``initdb``, ``pg_ctl``: Debian's and Ubuntu's
``postgresql`` package, Homebrew's ``postgresql``); as root it runs them as the ``postgres``
user, as PostgreSQL requires.
"""

from __future__ import annotations

import glob
import os
import secrets
import shutil
import socket
import subprocess
from pathlib import Path
from urllib.parse import quote

from ringzero.core.contract.errors import RingzeroError
from ringzero.core.support.owner_only import owner_only_file, owner_only_folder

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
        self.password_file = self.folder / "password"
        """The ``postgres`` user's password, owner-only."""

    @property
    def dsn(self) -> str:
        """How to connect, password included (once the folder is made)."""
        password = self.password_file.read_text().strip() if self.password_file.exists() else ""
        user = f"postgres:{quote(password, safe='')}" if password else "postgres"
        return f"postgresql://{user}@127.0.0.1:{self.port}/postgres"

    def create(self) -> None:
        """Make the folder's database cluster, where it has none, with a password; give one to
        a cluster an older ringzero made without."""
        if (self.data / "PG_VERSION").exists():
            if not self.password_file.exists():
                self._add_password()
            return
        owner_only_folder(self.folder)
        self.data.mkdir(mode=0o700, exist_ok=True)
        self._write("password", secrets.token_urlsafe(24))
        self._write("port", str(self.port))
        self._own(self.folder)
        self._run("initdb", "-D", str(self.data), "-A", "scram-sha-256", "-U", "postgres", "--pwfile",
                  str(self.password_file), "--no-instructions")

    def _write(self, name: str, text: str) -> None:
        path = self.folder / name
        owner_only_file(path)
        path.write_text(text)

    def _add_password(self) -> None:
        """A cluster made when local connections were trusted: set a password (in single-user
        mode, the server stopped) and ask every connection for it from now on."""
        running = self.running()
        if running:
            self.stop()
        password = secrets.token_urlsafe(24)
        single = subprocess.run(self._as_owner("postgres", "--single", "-D", str(self.data), "postgres"),
                                input=f"ALTER ROLE postgres PASSWORD '{password}';\n", capture_output=True,
                                text=True, timeout=120)
        if single.returncode != 0:
            raise NoPostgres(f"could not give the postgres user a password: {single.stderr.strip()[-800:]}")
        rules = self.data / "pg_hba.conf"
        lines = rules.read_text().splitlines()
        rules.write_text("\n".join(line if line.lstrip().startswith("#") else line.replace("trust", "scram-sha-256")
                                   for line in lines) + "\n")
        self._write("password", password)
        self._own(self.folder)
        if running:
            self.start()

    def start(self) -> str:
        """Make the folder's database cluster if it has none, start the server (if it is not
        running already) and return its DSN."""
        self.create()
        if not self.running():
            log = self.folder / "log"
            owner_only_file(log)
            self._own(log)
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
    def _own(path: Path) -> None:
        """As root, the ``postgres`` user must own the folder: PostgreSQL refuses to run as root."""
        if os.geteuid() == 0:
            for each in (path, *(path.rglob("*") if path.is_dir() else ())):
                shutil.chown(each, "postgres", "postgres")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
