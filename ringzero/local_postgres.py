"""A PostgreSQL server of your own on 127.0.0.1, from the server programs on this machine:
``ringzero postgres start`` (what ``PostgresCheckpointer`` and ``ringzero demo --ray`` need, in
one command, with no account or config to set up).

The server keeps its data in one folder (``.ringzero/postgres`` by default, its owner's alone),
listens on 127.0.0.1 only, and stays up until ``ringzero postgres stop``. Every connection needs
the password of its ``postgres`` user (``scram-sha-256``): generated when the folder is made and
kept owner-only in it, in ``password`` and in a libpq pass file (``pgpass``). The DSN ``start``
prints names the pass file (``?passfile=...``), never the password, so the password is in no
command line (where any local user could read it from ``/proc``), and another user of the
machine cannot connect. A folder made by an older ringzero, which trusted local connections,
gets a password at its next start. It needs PostgreSQL's server programs (``initdb``,
``pg_ctl``: Debian's and Ubuntu's ``postgresql`` package, Homebrew's ``postgresql``).

As root it runs them as the ``postgres`` user, as PostgreSQL requires, and changes nothing the
``postgres`` user could have replaced with a link: the folder, its password files and its
``data`` folder are made by root (``O_NOFOLLOW``); only ``data``, made empty, is handed to the
``postgres`` user (``fchown``), whose server writes its log there; the folder and each
``.ringzero`` above it are 0711, so that user passes through to its data without listing them.
"""

from __future__ import annotations

import glob
import os
import secrets
import shutil
import socket
import stat
import subprocess
from pathlib import Path
from urllib.parse import quote

from ringzero.core.contract.errors import RingzeroError
from ringzero.core.support.owner_only import OWN_FOLDER, owner_only_file, owner_only_folder

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
        self.pass_file = self.folder / "pgpass"
        """The same, as a libpq pass file: what the DSN names."""
        self.log = self.data / "log"
        """The server's log (in ``data``: the server's user writes it)."""

    @property
    def dsn(self) -> str:
        """How to connect: the server, its user, and the pass file that holds the password."""
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres?passfile={quote(str(self.pass_file), safe='/')}"

    def create(self) -> None:
        """Make the folder's database cluster, where it has none, with a password; give one to
        a cluster an older ringzero made without."""
        owner_only_folder(self.folder)
        self._reachable()
        if (self.data / "PG_VERSION").exists():
            if not self.password_file.exists():
                self._add_password()
            self._write_pass_file()
            return
        password = secrets.token_urlsafe(24)
        self._write("password", password)
        self._write("port", str(self.port))
        self._write_pass_file()
        self._make_data()
        handed = self.folder / "initdb-password"  # initdb reads it as the server's user; gone at once
        fd = os.open(handed, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            os.write(fd, password.encode())
            self._hand_over(fd)
        finally:
            os.close(fd)
        try:
            self._run("initdb", "-D", str(self.data), "-A", "scram-sha-256", "-U", "postgres", "--pwfile",
                      str(handed), "--no-instructions")
        finally:
            os.unlink(handed)

    def _write(self, name: str, text: str) -> None:
        path = self.folder / name
        owner_only_file(path)
        fd = os.open(path, os.O_WRONLY | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC)
        with open(fd, "w") as file:
            file.write(text)

    def _write_pass_file(self) -> None:
        password = self.password_file.read_text().strip()
        escaped = password.replace("\\", "\\\\").replace(":", "\\:")
        self._write("pgpass", f"127.0.0.1:{self.port}:*:postgres:{escaped}\n")

    def _make_data(self) -> None:
        """``data``, empty, 0700, the server user's (handed over by descriptor: no link followed)."""
        self.data.mkdir(mode=0o700, exist_ok=True)
        fd = os.open(self.data, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            os.fchmod(fd, 0o700)
            self._hand_over(fd)
        finally:
            os.close(fd)

    @staticmethod
    def _hand_over(fd: int) -> None:
        """As root, give the ``postgres`` user what ``fd`` is open on (PostgreSQL refuses to run as root)."""
        if os.geteuid() == 0:
            import pwd

            user = pwd.getpwnam("postgres")
            os.fchown(fd, user.pw_uid, user.pw_gid)

    def _reachable(self) -> None:
        """As root, let the ``postgres`` user pass through the folder (and each ``.ringzero`` above
        it) to its data, 0711; refuse, naming it, a folder above that it cannot pass."""
        if os.geteuid() != 0:
            return
        for part in (self.folder, *self.folder.parents):
            mode = stat.S_IMODE(part.stat().st_mode)
            if part == self.folder or part.name == OWN_FOLDER:
                os.chmod(part, mode | 0o011)
            elif not mode & 0o001:
                raise NoPostgres(f"the postgres user, which runs the server, cannot pass through {part} (mode "
                                 f"{mode:04o}) to {self.data}: give --dir a folder under one every user may pass "
                                 "through (e.g. /var/lib/ringzero-postgres)")

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
        # pg_hba.conf is in the server user's folder: opened without following a link, checked as a
        # file of that user's own with one name (never a link to another file)
        fd = os.open(self.data / "pg_hba.conf", os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
        with open(fd, "r+") as rules:
            found = os.fstat(rules.fileno())
            if found.st_nlink != 1 or found.st_uid != os.stat(self.data).st_uid:
                raise NoPostgres(f"{self.data / 'pg_hba.conf'} is not the server's own file: not changed")
            lines = rules.read().splitlines()
            rules.seek(0)
            rules.truncate()
            rules.write("\n".join(line if line.lstrip().startswith("#") else line.replace("trust", "scram-sha-256")
                                  for line in lines) + "\n")
        self._write("password", password)
        if running:
            self.start()

    def start(self) -> str:
        """Make the folder's database cluster if it has none, start the server (if it is not
        running already) and return its DSN."""
        self.create()
        if not self.running():
            options = f"-p {self.port} -k {self.data} -c listen_addresses=127.0.0.1"
            self._run("pg_ctl", "-D", str(self.data), "-o", options, "-w", "-l", str(self.log), "start")
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
            tail = self.log.read_text(errors="replace")[-800:] if self.log.is_file() else ""
            raise NoPostgres(f"{program} {args[0]} ... failed: {(done.stderr or done.stdout).strip()[-800:]}"
                             + (f"\n{tail}" if tail else ""))

    def _as_owner(self, program: str, *args: str) -> list[str]:
        command = [str(self.programs / program), *args]
        return ["runuser", "-u", "postgres", "--", *command] if os.geteuid() == 0 else command

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
