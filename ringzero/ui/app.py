"""The pages and actions of ``ringzero ui`` (see ``ringzero.ui``), over one store.

Pages are rendered on the server (Jinja2 templates beside this module); the only script is
``static/ui.js``, which follows ``/events`` (server-sent events: a line when the process table
changed) and fetches the table again. Every action is the operation its CLI command runs:
``settle`` and the commands ``top`` leaves for a kernel (pause, resume, kill) act on the store
here; ``send``, ``retry``, ``fork`` and ``replay --check`` run those commands (``retry`` and
``fork`` need the programs: ``--kernel``), each as a process of its own.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import jinja2
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, RedirectResponse, Response, StreamingResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates

from ringzero.core.contract.errors import InvalidArgument, RingzeroError
from ringzero.core.contract.outcomes import number
from ringzero.core.contract.protocols import Checkpointer
from ringzero.core.contract.store import KernelStore, ProcessRecord
from ringzero.core.operations import journal_lines, settle
from ringzero.core.schedules import ScheduleSpec
from ringzero.core.support.monitor import hosts_of, read_activity, send_command
from ringzero.core.support.timeouts import fail_after
from ringzero.demo import next_firing_text
from ringzero.ui.guard import BEARER, Guard, csrf_token

__all__ = ["PAGE_SIZE", "create_app"]

FORGED = "this form is not one of this server's pages (no CSRF token)"

HERE = Path(__file__).resolve().parent
PAGE_SIZE = 50
"""Processes on one page of the table."""
EVENT_INTERVAL = 0.5
"""Seconds between two looks at the process table for ``/events``: a change shows within a second."""


def create_app(checkpointer: Checkpointer, *, token: str, host: str = "127.0.0.1", port: int = 8787,
               read_only: bool = False, db: str = "", kernel: str | None = None) -> Guard:
    """The ASGI app: ``checkpointer``'s processes behind ``Guard`` (``token``; ``host`` and
    ``port``, where it listens). ``read_only``: no action. ``db`` and ``kernel``: what ``retry``
    and ``fork`` pass to their commands (without ``kernel`` they are not offered)."""
    store = KernelStore(checkpointer)
    environment = jinja2.Environment(loader=jinja2.FileSystemLoader(str(HERE / "templates")), autoescape=True)
    templates = Jinja2Templates(env=environment)
    csrf = csrf_token(token)

    def render(request: Request, name: str, **context: Any) -> Response:
        page: Response = templates.TemplateResponse(request, name, {"csrf": csrf, "read_only": read_only,
                                                                    "can_rerun": bool(kernel and db), **context})
        return page

    def forged(request: Request, form: Any) -> bool:
        """An action whose token came in the browser's cookie, with no CSRF token of this
        server's pages (a script's bearer token needs none)."""
        return not getattr(request.state, BEARER, False) and form.get("csrf") != csrf

    async def processes(request: Request) -> Response:
        status = request.query_params.get("status", "")
        text = request.query_params.get("q", "").strip().lower()
        page = max(1, _int(request.query_params.get("page"), 1))
        records = await store.load_processes()
        shown = [r for r in records if (not status or r.status.value == status or (status == "paused" and r.paused))
                 and (not text or text in r.name.lower() or text in r.program.lower() or text == str(r.pid))]
        shown.sort(key=lambda r: -r.pid)
        pages = max(1, math.ceil(len(shown) / PAGE_SIZE))
        page = min(page, pages)
        hosts = {pid: node for pid, (_, node) in (await store.owners()).items()}
        rows = [{**_row(r), "host": hosts.get(r.pid, ""), "in_doubt": await _in_doubt(store, r)}
                for r in shown[(page - 1) * PAGE_SIZE: page * PAGE_SIZE]]
        context = {"rows": rows, "status": status, "q": text, "page": page, "pages": pages, "total": len(shown),
                   "statuses": sorted({r.status.value for r in records})}
        return render(request, "table.html" if request.query_params.get("part") == "table" else "processes.html",
                      **context)

    async def process(request: Request) -> Response:
        pid = _int(request.path_params["pid"], 0)
        try:
            view = await journal_lines(store, pid)
        except InvalidArgument as exc:
            return PlainTextResponse(str(exc), status_code=404)
        children = [_row(r) for r in await store.load_processes() if r.parent == pid]
        lines = [{"slot": line.slot, "depth": line.slot.count("."), "kind": line.kind, "summary": line.summary,
                  "outcome": line.said, "at": _clock(line.at), "in_doubt": line.in_doubt} for line in view.lines]
        record = view.record
        return render(request, "process.html", p=_row(record), record=record, lines=lines, children=children,
                      state=json.dumps(record.state, indent=1, sort_keys=True),
                      result=json.dumps(record.result), error=record.error, flash=request.query_params.get("said"))

    async def act(request: Request) -> Response:
        if read_only:
            return PlainTextResponse("this server is read-only (ringzero ui --read-only)", status_code=403)
        form = await request.form()
        if forged(request, form):
            return PlainTextResponse(FORGED, status_code=403)
        pid = _int(request.path_params["pid"], 0)
        action = request.path_params["action"]
        try:
            said = await _carry_out(store, checkpointer, pid, action, {k: str(v) for k, v in form.items()},
                                    db=db, kernel=kernel)
        except RingzeroError as exc:
            said = f"error: {exc}"
        return RedirectResponse(request.url_for("process", pid=str(pid)).include_query_params(said=said),
                                status_code=303)

    async def overview(request: Request) -> Response:
        records = await store.load_processes()
        by_program: dict[str, dict[str, float]] = {}
        for record in records:
            spent = by_program.setdefault(record.program, {"processes": 0, "tokens": 0.0, "cost": 0.0, "llm": 0.0})
            spent["processes"] += 1
            spent["tokens"] += number(record.spent.get("tokens"))
            spent["cost"] += number(record.spent.get("cost"))
            spent["llm"] += number(record.spent.get("llm_calls"))
        costly = sorted(records, key=lambda r: (-number(r.spent.get("cost")), -number(r.spent.get("tokens"))))[:10]
        gates = [{"kernel": kernel.kernel, "name": name, **gate} for kernel in await read_activity(checkpointer)
                 if kernel.fresh() for name, gate in sorted(kernel.gates.items())]
        now = time.time()
        schedules = [{"name": spec.name, "program": spec.program,
                      "every": f"{spec.every:g} s" if spec.every is not None else f"cron {spec.cron}",
                      "next": "paused" if spec.paused else next_firing_text(spec, now)}
                     for spec in (ScheduleSpec.from_json(row) for row in await store.schedules()) if not spec.removed]
        return render(request, "overview.html", programs=sorted(by_program.items(), key=lambda item: -item[1]["cost"]),
                      costly=[_row(r) for r in costly], gates=gates, schedules=schedules,
                      flash=request.query_params.get("said"))

    async def replay_check(request: Request) -> Response:
        form = await request.form()
        if forged(request, form):
            return PlainTextResponse(FORGED, status_code=403)
        command = [sys.executable, "-m", "ringzero.cli", "replay", "--check", "--db", db or ""]
        if kernel:
            command += ["--kernel", kernel]
        said = await _run_command(command, wait=60) if db else "replay --check needs the store's address (--db)"
        return RedirectResponse(request.url_for("overview").include_query_params(said=said), status_code=303)

    latest: list[tuple[float, str]] = [(0.0, "")]
    reading = asyncio.Lock()

    async def table_digest() -> str:
        """The table's digest, read at most once an interval however many pages follow it."""
        async with reading:
            if time.monotonic() - latest[0][0] >= EVENT_INTERVAL * 0.8:
                latest[0] = (time.monotonic(), await _table_digest(store))
            return latest[0][1]

    async def events(request: Request) -> Response:
        async def changes() -> AsyncIterator[str]:
            seen = ""
            while not await request.is_disconnected():
                now = await table_digest()
                if now != seen:
                    seen = now
                    yield f"event: change\ndata: {now}\n\n"
                await asyncio.sleep(EVENT_INTERVAL)

        return StreamingResponse(changes(), media_type="text/event-stream", headers={"Cache-Control": "no-store"})

    routes = [Route("/", processes), Route("/p/{pid:int}", process, name="process"),
              Route("/overview", overview, name="overview"), Route("/replay-check", replay_check, methods=["POST"]),
              Route("/p/{pid:int}/{action:str}", act, methods=["POST"]), Route("/events", events),
              Mount("/static", StaticFiles(directory=str(HERE / "static")), name="static")]
    app = Starlette(routes=routes)
    return Guard(app, token=token, host=host, port=port)


async def _carry_out(store: KernelStore, checkpointer: Checkpointer, pid: int, action: str, form: dict[str, str], *,
                     db: str, kernel: str | None) -> str:
    """One action, as its CLI command does it; what to tell the operator."""
    if action == "settle":
        slot, choice = form.get("slot", ""), form.get("choice", "")
        if choice == "result":
            value = _json(form.get("value", ""), "the result")
            _, line = await settle(store, pid, slot, result=value, has_result=True)
        elif choice == "error":
            _, line = await settle(store, pid, slot, error=form.get("value") or "settled as failed by an operator")
        elif choice == "run_again":
            _, line = await settle(store, pid, slot, run_again=True)
        else:
            raise InvalidArgument("settle needs a choice: result, error or run_again")
        return f"slot {slot} settled ({line.said or 'run again'}): resume or retry goes on from it"
    if action in ("pause", "resume", "kill"):
        await send_command(checkpointer, pid, action)
        if await hosts_of(checkpointer, pid, None):
            return f"{action} sent: the kernel that runs pid {pid} acts on it within a second"
        return (f"{action} sent, but no live kernel runs pid {pid} now: the command waits for the next one that "
                "does (ringzero resume or serve)")
    if action == "send":  # ringzero send: to the kernel that runs it, or into the store for one waiting there
        message = form.get("message", "")
        _json(message, "the message")
        command = [sys.executable, "-m", "ringzero.cli", "send", "--db", db, "--priority",
                   str(_int(form.get("priority"), 10)), str(pid), message]
        return await _run_command(command, wait=30)
    if action in ("retry", "fork"):
        if not kernel or not db:
            raise InvalidArgument(f"{action} runs the program: start the UI with --kernel MODULE:FUNCTION")
        command = [sys.executable, "-m", "ringzero.cli", action, str(pid), "--db", db, "--kernel", kernel]
        if action == "fork":
            command += ["--at", str(_int(form.get("at"), 0))]
        return await _run_command(command)
    raise InvalidArgument(f"no action {action!r}")


async def _run_command(command: list[str], wait: float = 5) -> str:
    """Start ``command`` (``ringzero retry``/``fork``/``replay --check``) on its own and return
    what it said in its first ``wait`` seconds (a fork's new pid); it goes on in the background."""
    started = await asyncio.create_subprocess_exec(*command, stdout=asyncio.subprocess.PIPE,
                                                   stderr=asyncio.subprocess.STDOUT)
    assert started.stdout is not None
    said: list[str] = []
    try:
        async with fail_after(wait):
            while line := await started.stdout.readline():
                said.append(line.decode(errors="replace").strip())
    except TimeoutError:
        pass
    return " / ".join(part for part in said if part)[:2000] or f"{command[3]} started"


async def _in_doubt(store: KernelStore, record: ProcessRecord) -> int:
    """How many of ``record``'s calls are in doubt: begun (an intent), with no outcome recorded
    and not settled to run again. None in a process that ended."""
    if record.status.terminal:
        return 0
    intents = await store.intents(record.pid)
    if not intents:
        return 0
    calls, _ = await store.calls(record.pid)
    recorded = {str(entry.seq) for entry in await store.journal(record.pid)}
    return sum(key not in calls and key not in recorded and not intent.get("run_again")
               for key, intent in intents.items())


async def _table_digest(store: KernelStore) -> str:
    """What changes when a process's status, pause flag or spend does (or one is added)."""
    digest = hashlib.sha256()
    async for pid, status in store.statuses():
        digest.update(json.dumps([pid, status], sort_keys=True, default=str).encode())
    return digest.hexdigest()[:16]


def _row(record: ProcessRecord) -> dict[str, Any]:
    spent = record.spent
    waiting = record.waiting
    return {"pid": record.pid, "name": record.name, "program": record.program, "status": record.status.value,
            "paused": record.paused, "priority": record.priority, "parent": record.parent,
            "tokens": int(number(spent.get("tokens"))), "cost": number(spent.get("cost")),
            "waiting": "" if waiting is None else waiting[0], "wakes": "" if waiting is None else _clock(waiting[1]),
            "stop_reason": "" if record.stop_reason is None else record.stop_reason.value}


def _int(text: Any, default: int) -> int:
    try:
        return int(str(text))
    except (TypeError, ValueError):
        return default


def _json(text: str, what: str) -> Any:
    try:
        return json.loads(text)
    except ValueError as exc:
        raise InvalidArgument(f"{what} must be JSON ({exc}): write a string in quotes") from exc


def _clock(at: float | None) -> str:
    return "" if at is None else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(at))
