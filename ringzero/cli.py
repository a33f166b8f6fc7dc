"""The ``ringzero`` command: ``demo``, ``doctor``, ``ps``, ``top``, ``resume``, ``serve``, ``send``,
``show``, ``settle``, ``retry``, ``fork``, ``replay --check``, ``ui``, ``mcp`` and ``--version``."""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import socket
import stat
import sys
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console
from rich.markup import escape

import ringzero
from ringzero.checkpointers import SqliteCheckpointer, open_checkpointer, scheme_of, sqlite_file
from ringzero.core.contract.errors import InvalidArgument, RingzeroError
from ringzero.core.contract.protocols import Checkpointer
from ringzero.core.support.owner_only import owner_only_file, owner_only_folder
from ringzero.core.support.references import import_reference
from ringzero.top import SORT_KEYS

if TYPE_CHECKING:
    from ringzero import Kernel
    from ringzero.resuming import Start

__all__ = ["main"]

DEFAULT_DB = Path(".ringzero") / "state.db"
STORE_COMMANDS = ("ps", "top", "resume", "serve", "send", "show", "settle", "retry", "fork", "replay", "ui")
"""The commands that read or write a state database (``--db``)."""


def _port(text: str) -> int:
    """A TCP port for ``--port``: argparse reports anything else as a usage error."""
    try:
        port = int(text)
    except ValueError:
        port = -1
    if not 1 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"a port is a whole number from 1 to 65535, not {text!r}")
    return port


def _seconds(text: str) -> float:
    """A refresh interval for ``--interval``: a positive number of seconds."""
    try:
        seconds = float(text)
    except ValueError:
        seconds = 0.0
    if not 0.05 <= seconds <= 3600:
        raise argparse.ArgumentTypeError(f"an interval is a number of seconds from 0.05 to 3600, not {text!r}")
    return seconds


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ringzero", description="An agent kernel for Python.")
    parser.add_argument("--version", action="version", version=f"ringzero {ringzero.__version__}")
    commands = parser.add_subparsers(dest="command", required=True)
    demo = commands.add_parser("demo", help="run agents sharing one rate-limited model, with a live process table")
    demo.add_argument("--state-dir", type=Path, default=Path(".ringzero") / "demo",
                      help="where the demo keeps its SQLite state (default: %(default)s)")
    demo.add_argument("--ray", action="store_true",
                      help="instead: agents on a local Ray cluster, one node killed mid-run (needs --db)")
    demo.add_argument("--db", metavar="POSTGRESQL_DSN", help="the PostgreSQL store the --ray demo's nodes share")
    doctor = commands.add_parser("doctor", help="probe which executors and isolation controls work on this host, "
                                 "and whether other users can read a store")
    doctor.add_argument("--db", type=Path, action="append", default=None,
                        help="a SQLite store to check (default: .ringzero/state.db; repeat for more)")
    db_help = ("SQLite state file, a postgresql:// DSN (a cluster's shared store), or the URL of a store a package "
               "registered (default: %(default)s)")
    ps = commands.add_parser("ps", help="list the processes recorded in a state database (every node's)")
    ps.add_argument("--db", default=str(DEFAULT_DB), help=db_help)
    top = commands.add_parser("top", help="a live view of the processes in a state database, with keys to pause, "
                                          "resume and kill them (in whichever process or node runs them)")
    top.add_argument("--db", default=str(DEFAULT_DB), help=db_help)
    top.add_argument("--interval", type=_seconds, default=1.0, help="seconds between reads (default: %(default)s)")
    top.add_argument("--sort", choices=SORT_KEYS, default="pid", help="the column to sort by (default: %(default)s)")
    top.add_argument("--filter", default="", help="show processes whose name, status or syscall has this text")
    top.add_argument("--once", action="store_true", help="print one view and exit (what a pipe or a log gets)")
    kernel_help = ("a function taking the database (a pathlib.Path for SQLite, the DSN string for PostgreSQL) and "
                   "returning your configured Kernel (LLM provider, tools, executor): def make_kernel(db): return "
                   "Kernel(checkpointer=SqliteCheckpointer(db), llm=..., tools=...). Its module is imported: keep "
                   "the lines that run your agents under if __name__ == '__main__'. Default: a Kernel with none of "
                   "them")
    for name, text in (("resume", "finish what a crash left: run unfinished processes until each ends or waits "
                                  "for a message, a resume or a timer more than 10 s off, then say what was "
                                  "replayed, made live and in doubt, and when each sleeper wakes"),
                       ("serve", "resume, then keep hosting: processes waiting for a message or a timer are let go "
                                 "and resumed when one arrives (ringzero send) or the first timer is due, until "
                                 "every process has ended")):
        resume = commands.add_parser(name, help=text)
        resume.add_argument("--db", default=str(DEFAULT_DB), help=db_help)
        resume.add_argument("--kernel", metavar="MODULE:FUNCTION", help=kernel_help)
        if name == "resume":
            resume.add_argument("--serve", action="store_true", help="then keep hosting, as ringzero serve does")
    send = commands.add_parser("send", help="send a message (JSON) to a process, whichever host runs it, or none")
    send.add_argument("--db", default=str(DEFAULT_DB), help=db_help)
    send.add_argument("--priority", type=int, default=10, help="lower numbers are received first (default: 10)")
    send.add_argument("pid", type=int, help="the process to send to")
    send.add_argument("message", help="the message as JSON, e.g. '{\"approved\": true}' or '\"yes\"'")
    show = commands.add_parser("show", help="a process's journal: each syscall and tool call, its outcome, when, "
                                           "and whether it is in doubt")
    show.add_argument("--db", default=str(DEFAULT_DB), help=db_help)
    show.add_argument("--json", action="store_true", help="one JSON document, for machines")
    show.add_argument("pid", type=int, help="the process")
    settle = commands.add_parser("settle", help="decide a call in doubt (its host died while it ran): the decision "
                                                "is journaled, and the next resume (or retry) goes on from it")
    settle.add_argument("--db", default=str(DEFAULT_DB), help=db_help)
    settle.add_argument("pid", type=int, help="the process")
    settle.add_argument("slot", help="the slot in doubt, as ringzero show lists it (7, or 7.3 for a tool call "
                                     "made by the code of exec 7)")
    decision = settle.add_mutually_exclusive_group(required=True)
    decision.add_argument("--result", metavar="JSON", help="what the call returned (it took effect)")
    decision.add_argument("--error", metavar="MESSAGE", help="it failed: the program sees this error raised")
    decision.add_argument("--run-again", action="store_true", help="it did not take effect: run it again")
    kernel_of = {}
    for name, text in (("retry", "resume a failed process from its journal (after a fix to its program, or a "
                                 "rollback: a NonDeterminismError keeps the journal)"),
                       ("fork", "a new process that replays a process's journal up to a slot and runs live from "
                                "there; the old one is untouched")):
        command = commands.add_parser(name, help=text)
        command.add_argument("--db", default=str(DEFAULT_DB), help=db_help)
        command.add_argument("--kernel", metavar="MODULE:FUNCTION", help=kernel_help)
        command.add_argument("pid", type=int, help="the process")
        kernel_of[name] = command
    kernel_of["fork"].add_argument("--at", type=int, required=True, metavar="SLOT",
                                   help="the first slot that runs live (ringzero show lists them)")
    replay = commands.add_parser("replay", help="replay stored journals against the current code, with no live "
                                                "call at all: exit 1 where one diverges (before you deploy)")
    replay.add_argument("--check", action="store_true", required=True, help="check only (nothing is written)")
    replay.add_argument("--db", default=str(DEFAULT_DB), help=db_help)
    replay.add_argument("--kernel", metavar="MODULE:FUNCTION",
                        help="imported (not called) so that programs beside it import as they do in production")
    replay.add_argument("pids", type=int, nargs="*", help="the processes to check (default: all)")
    postgres = commands.add_parser("postgres", help="a PostgreSQL server of your own on 127.0.0.1, for "
                                                    "PostgresCheckpointer and demo --ray: start prints its DSN")
    postgres.add_argument("action", choices=("start", "stop", "status"))
    postgres.add_argument("--dir", type=Path, default=Path(".ringzero") / "postgres",
                          help="where the server keeps its data (default: %(default)s)")
    ui = commands.add_parser("ui", help="a web page over the store for operators (processes, journals, actions), "
                                        "on 127.0.0.1 with a token")
    ui.add_argument("--db", default=str(DEFAULT_DB), help=db_help)
    ui.add_argument("--kernel", metavar="MODULE:FUNCTION",
                    help="what retry and fork run the programs with (without it the page offers neither)")
    ui.add_argument("--host", default="127.0.0.1",
                    help="the address to listen on (default: %(default)s; another exposes the page to that network)")
    ui.add_argument("--port", type=_port, default=8787, help="(default: %(default)s)")
    ui.add_argument("--token", default=None, help="the token the page asks for (default: RINGZERO_UI_TOKEN, else a "
                                                  "new one, printed in the address)")
    ui.add_argument("--read-only", action="store_true", help="pages only, no action")
    mcp = commands.add_parser("mcp", help="serve the kernel over MCP (stdio, or streamable HTTP on 127.0.0.1)")
    mcp.add_argument("--transport", choices=("stdio", "http"), default="stdio")
    mcp.add_argument("--port", type=_port, default=8765, help="HTTP port on 127.0.0.1 (default: %(default)s)")
    mcp.add_argument("--tools", action="append", default=[], metavar="MODULE:FUNCTION",
                     help="a tool the code may call (repeat for more)")
    mcp.add_argument("--executor", choices=("monty", "process"), default="monty",
                     help="where code runs (default: %(default)s)")
    mcp.add_argument("--state-dir", type=Path, default=Path(".ringzero") / "mcp",
                     help="where tasks and state are kept (default: %(default)s)")
    mcp.add_argument("--token", default=None,
                     help="the bearer token HTTP clients must send (default: $RINGZERO_MCP_TOKEN, else one generated "
                          "once and kept owner-only in the state folder's mcp-token)")
    mcp.add_argument("--no-auth", action="store_true",
                     help="serve HTTP without a token: any local user or program may then run code and your tools")
    return parser


def _serve_mcp(args: argparse.Namespace) -> int:
    from ringzero.adapters.mcp import serve
    from ringzero.agents import CodeAgent
    from ringzero.core.contract.protocols import Executor
    from ringzero.providers.executors import MontyExecutor, ProcessExecutor
    from ringzero.providers.llm import provider_from_environment

    token = None
    if args.transport == "http":
        if args.no_auth:
            print(f"ringzero mcp: WARNING: no token: any local user or program that reaches 127.0.0.1:{args.port} "
                  "can run code and your tools", file=sys.stderr)
        else:
            token = _mcp_token(args.token or os.environ.get("RINGZERO_MCP_TOKEN") or None, args.state_dir)
    executor: Executor = MontyExecutor() if args.executor == "monty" else ProcessExecutor()
    agent = CodeAgent(args.tools, llm=provider_from_environment(), executor=executor, state_dir=args.state_dir)
    serve(agent, args.transport, args.port, token=token, no_auth=args.no_auth)
    return 0


async def _serve_ui(db: Path | str, args: argparse.Namespace) -> int:
    """Serve ``ringzero ui`` until Ctrl-C; its address, with the token, on stdout."""
    import secrets

    import uvicorn

    from ringzero.core.support.tokens import check_token
    from ringzero.ui import create_app

    given = args.token or os.environ.get("RINGZERO_UI_TOKEN")
    token = check_token(given, "the token given (--token or RINGZERO_UI_TOKEN)") if given else secrets.token_urlsafe(24)
    store = _store(db)
    try:
        app = create_app(store, token=token, host=args.host, port=args.port, read_only=args.read_only, db=args.db,
                         kernel=args.kernel)
        # A page left open holds its event stream: a stop waits a second for it, not for ever.
        server = uvicorn.Server(uvicorn.Config(app, host=args.host, port=args.port, log_level="warning",
                                               lifespan="off", timeout_graceful_shutdown=1))
        shown = f"[{args.host}]" if ":" in args.host else args.host
        print(f"http://{shown}:{args.port}/?token={token}", flush=True)
        await server.serve()
    finally:
        await store.aclose()
    return 0


def _mcp_token(given: str | None, state_dir: Path) -> str:
    """The bearer token: the one given, else the one kept in the state folder, made and printed
    once where there is none. Each is refused where it is short or blank (``check_token``); a
    kept one is read only from a regular file of this user's that no one else may read or
    write: a token another user planted is never served."""
    from ringzero.core.support.tokens import check_token

    if given is not None:
        return check_token(given, "the token given (--token or RINGZERO_MCP_TOKEN)")
    kept = owner_only_folder(state_dir) / "mcp-token"
    if os.path.lexists(kept):
        found = os.lstat(kept)
        if not stat.S_ISREG(found.st_mode) or found.st_uid != os.geteuid() or found.st_mode & 0o077:
            raise InvalidArgument(f"{kept} is not a file of yours that only you may read (uid {found.st_uid}, mode "
                                  f"{stat.S_IMODE(found.st_mode):04o}): another user may have planted it; remove it, "
                                  "and a new token is made")
        print(f"ringzero mcp: HTTP clients send 'Authorization: Bearer <the token in {kept}>'", file=sys.stderr)
        return check_token(kept.read_text().strip(), f"the token in {kept}")
    token = secrets.token_urlsafe(32)
    owner_only_file(kept)
    kept.write_text(token)
    print(f"ringzero mcp: HTTP clients send 'Authorization: Bearer {token}' (kept, owner-only, in {kept})",
          file=sys.stderr)
    return token


def _is_dsn(db: str) -> bool:
    return db.startswith(("postgresql://", "postgres://"))


def _database(db: str) -> Path | str:
    """What ``--db`` names: a PostgreSQL DSN as it is, a SQLite file as a Path (also written as
    SQLAlchemy writes one: ``sqlite:///relative.db``, ``sqlite:////absolute.db``), any other URL
    as it is: ``open_checkpointer`` opens a store a package registered for its scheme, and refuses
    another naming those installed, rather than looking for a file."""
    if _is_dsn(db):
        return db
    if db.lower().startswith("sqlite:"):
        file = sqlite_file(db)
        if file is None:
            raise InvalidArgument(f"--db {db}: a store that keeps nothing after the command is of no use here; "
                                  "give a file")
        return file
    return Path(db) if scheme_of(db) is None else db  # a URL: open_checkpointer opens it, or names the schemes


def _store(db: Path | str) -> Checkpointer:
    """The store ``--db`` names: a SQLite file, or a URL (PostgreSQL, or a scheme a package registered)."""
    return open_checkpointer(db) if isinstance(db, str) else SqliteCheckpointer(db)


def _where(db: Path | str, store: Checkpointer) -> str:
    return str(getattr(store, "where", db)) if isinstance(db, str) else str(db)


async def _ps(db: Path | str, console: Console) -> int:
    from ringzero.core.contract.outcomes import number
    from ringzero.core.contract.records import spend_in_journal
    from ringzero.core.contract.states import ProcessStatus
    from ringzero.core.contract.store import KernelStore
    from ringzero.core.kernel import ProcessInfo
    from ringzero.core.schedules import ScheduleSpec
    from ringzero.demo import process_table, schedule_table
    from ringzero.top import live_activity

    store = _store(db)
    try:
        kernel_store = KernelStore(store)
        records = await kernel_store.load_processes()
        for record in records:
            # after a crash its status row may lag its journal; so may a failed one's, where it
            # failed on replay (a non-determinism error charges only what it replayed)
            if not record.status.terminal or record.status is ProcessStatus.FAILED:
                recorded = spend_in_journal(await kernel_store.journal(record.pid))
                record.count({key: max(number(record.spent.get(key)), amount) for key, amount in recorded.items()},
                             record.wall_seconds)
        _, live = await live_activity(store)  # a running process's kernel knows newer counts than its row
        for record in records:
            activity = live.get(record.pid)
            if activity is not None and not record.status.terminal:
                spent = {**record.spent, "tokens": activity["tokens"], "cost": activity["cost"],
                         "llm_calls": activity["llm_calls"]}
                record.count(spent, max(record.wall_seconds, float(activity["wall_s"])))
        rows = [ProcessInfo.of(r) for r in records]
        nodes = {pid: node for pid, (_, node) in (await kernel_store.owners()).items()}
        ended = {r.pid for r in records if r.status.terminal}
        for pid, placement in (await kernel_store.placements()).items():
            if placement.get("waiting") and pid not in ended:  # its node died, and no live node can host it
                nodes[pid] = f"none: {placement['waiting']}"
        schedules = [ScheduleSpec.from_json(row) for row in await kernel_store.schedules()]
    finally:
        await store.aclose()
    console.print(process_table(rows, title=f"processes in {_where(db, store)}", nodes=nodes or None))
    if any(not spec.removed for spec in schedules):
        console.print(schedule_table([spec for spec in schedules if not spec.removed]))
    return 0


async def _top(db: Path | str, console: Console, args: argparse.Namespace) -> int:
    from ringzero.top import run_top

    store = _store(db)
    try:
        return await run_top(store, _where(db, store), console, interval=args.interval, once=args.once,
                             sort=args.sort, filter=args.filter)
    finally:
        await store.aclose()


def _kernel_factory(spec: str | None) -> Callable[[Path | str], Kernel]:
    from ringzero import Kernel
    from ringzero.resuming import check_factory

    if spec is None:
        return lambda db: Kernel(checkpointer=_store(db))
    return check_factory(import_reference(spec, "--kernel"), spec)


def _resumer(db: Path | str, factory: Callable[[Path | str], Kernel], spec: str | None) -> Callable[[], Kernel]:
    """What makes each kernel of a resume: the factory's, checked, on a shared store taking its
    processes as a cluster node does."""
    from ringzero.resuming import build_kernel

    def make() -> Kernel:
        kernel = build_kernel(factory, db, spec)
        if isinstance(db, str) and kernel.checkpointer.capabilities.multi_process and kernel.node is None:
            # A shared store may have cluster nodes on it: take each process as a node does (an
            # ownership claim), so that a node still running one is fenced, never doubled.
            kernel.join_cluster(f"resume@{socket.gethostname()}:{os.getpid()}")
        return kernel

    return make


async def _resume(db: Path | str, factory: Callable[[Path | str], Kernel], console: Console, *,
                  spec: str | None, serving: bool, start: Start | None = None) -> int:
    from ringzero.resuming import recover_all, resume, serve

    make = _resumer(db, factory, spec)
    if serving:
        return await serve(make, console, db=str(db), kernel_spec=spec)
    code, _ = await resume(make(), console, db=str(db), kernel_spec=spec, start=start or recover_all)
    return code


async def _on_store(db: Path | str, command: Callable[[Checkpointer], Awaitable[int]]) -> int:
    """Run ``command`` on the store ``db`` names, closed after."""
    store = _store(db)
    try:
        return await command(store)
    finally:
        await store.aclose()


async def _operate(store: Checkpointer, args: argparse.Namespace, console: Console) -> int:
    from ringzero.operator_commands import settle_slot, show

    if args.command == "show":
        return await show(store, args.pid, console, as_json=args.json)
    return await settle_slot(store, args.pid, args.slot, console, result=args.result, error=args.error,
                             run_again=args.run_again)


def _postgres(action: str, folder: Path) -> int:
    """``start`` prints only the DSN on stdout, for ``--db "$(ringzero postgres start)"``."""
    from ringzero.local_postgres import LocalPostgres, NoPostgres

    server = LocalPostgres(folder)
    if action != "start" and not (server.data / "PG_VERSION").exists():
        raise NoPostgres(f"no PostgreSQL server was made in {server.folder}: ringzero postgres start --dir {folder} "
                         "makes one")
    if action == "start":
        print(server.start())
        print(f"PostgreSQL runs on 127.0.0.1:{server.port} with its data in {server.folder}; "
              f"ringzero postgres stop --dir {folder} stops it", file=sys.stderr)
    elif action == "stop":
        server.stop()
    else:
        print(f"{server.dsn} {'running' if server.running() else 'stopped'}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command. What it reports goes to stdout; an error goes to stderr, with exit status
    1 (130 for a Ctrl-C), so a script reading stdout (``--db "$(ringzero postgres start)"``)
    never reads an error as its answer."""
    args = _parser().parse_args(argv)
    console = Console()
    errors = Console(stderr=True)
    if not console.is_terminal:
        console.width = max(console.width, 110)  # a log or pipe gets the whole table, not 80 columns
    try:
        return _command(args, console)
    except RingzeroError as exc:
        errors.print(f"[bold red]error:[/] {escape(str(exc))}", soft_wrap=True)
        return 1
    except KeyboardInterrupt:
        errors.print("stopped (Ctrl-C)")
        return 130


def _command(args: argparse.Namespace, console: Console) -> int:
    db = _database(args.db) if args.command in STORE_COMMANDS else None
    if isinstance(db, Path) and not db.exists():
        raise InvalidArgument(f"no state database at {db}")
    if args.command == "doctor":
        from ringzero.doctor import diagnose

        return asyncio.run(diagnose(console, args.db))
    if args.command == "demo" and args.ray:
        from ringzero.demo_cluster import run_cluster_demo

        if not args.db or not _is_dsn(args.db):
            raise InvalidArgument("demo --ray needs --db postgresql://... (the store every node shares)")
        return asyncio.run(run_cluster_demo(args.db, console))
    if args.command == "demo":
        from ringzero.demo import run_demo
        from ringzero.demo_agents import run_agents_demo
        from ringzero.demo_crash import run_crash_demo

        failed = asyncio.run(run_demo(args.state_dir, console))
        failed += asyncio.run(run_agents_demo(args.state_dir, console))
        failed += asyncio.run(run_crash_demo(args.state_dir, console))
        return 1 if failed else 0
    if args.command == "ps":
        assert db is not None
        return asyncio.run(_ps(db, console))
    if args.command == "top":
        assert db is not None
        return asyncio.run(_top(db, console, args))
    if args.command == "mcp":
        return _serve_mcp(args)
    if args.command == "ui":
        assert db is not None
        return asyncio.run(_serve_ui(db, args))
    if args.command == "postgres":
        return _postgres(args.action, args.dir)
    assert db is not None
    if args.command == "send":
        from ringzero import Kernel
        from ringzero.resuming import parse_message, send

        message = parse_message(args.message)
        return asyncio.run(send(Kernel(checkpointer=_store(db), monitor_interval=None), args.pid, message,
                                args.priority, console))
    if args.command in ("show", "settle"):
        return asyncio.run(_on_store(db, lambda store: _operate(store, args, console)))
    # As `python -m` and uvicorn do: `--kernel app:make_kernel` and the programs it journaled
    # import from the folder the command is run in.
    sys.path.insert(0, os.getcwd())
    if args.command == "replay":
        if args.kernel:
            import_reference(args.kernel, "--kernel")
        from ringzero.operator_commands import replay_check

        return asyncio.run(_on_store(db, lambda store: replay_check(store, args.pids, console)))
    start = None
    if args.command in ("retry", "fork"):
        from ringzero.resuming import fork_one, retry_one

        start = retry_one(args.pid) if args.command == "retry" else fork_one(args.pid, args.at)
    return asyncio.run(_resume(db, _kernel_factory(args.kernel), console, spec=args.kernel,
                               serving=args.command == "serve" or getattr(args, "serve", False), start=start))


if __name__ == "__main__":
    sys.exit(main())
