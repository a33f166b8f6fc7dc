"""``ringzero ui`` as an operator (and an attacker) meets it: the command started on 127.0.0.1,
spoken to over HTTP. Its pages over a store with an in-doubt call, the settle that lets
``ringzero resume`` finish the process, the live list, and what it refuses: no token, a
cross-origin or forged action, a foreign Host, any action when read-only."""

from __future__ import annotations

import asyncio
import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests import operator_programs as programs

ROOT = Path(__file__).resolve().parent.parent
KERNEL = "tests.operator_programs:make_kernel"
TOKEN = "an-operators-token-of-32-characters"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class UI:
    """A ``ringzero ui`` process, its address, and a client that holds its cookie."""

    def __init__(self, db: Path, *options: str) -> None:
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.process = subprocess.Popen(
            [sys.executable, "-m", "ringzero.cli", "ui", "--db", str(db), "--port", str(self.port), "--token", TOKEN,
             *options], cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True)
        assert self.process.stdout is not None
        self.address = self.process.stdout.readline().strip()
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                httpx.get(self.base + "/", timeout=1)
                break
            except httpx.TransportError:
                time.sleep(0.05)
        self.client = httpx.Client(base_url=self.base, timeout=10)

    def sign_in(self) -> httpx.Response:
        return self.client.get(self.address, follow_redirects=True)

    def csrf(self, page: str) -> str:
        found = re.search(r'name="csrf" value="([0-9a-f]+)"', self.client.get(page).text)
        assert found is not None, "the page's forms carry a CSRF token"
        return found.group(1)

    def post(self, path: str, data: dict[str, str], **headers: str) -> httpx.Response:
        return self.client.post(path, data=data, headers={"Origin": self.base, **headers})

    def close(self) -> None:
        self.client.close()
        self.process.terminate()
        self.process.wait(10)
        for stream in (self.process.stdout, self.process.stderr):
            if stream is not None:
                stream.close()


@pytest.fixture
def in_doubt(tmp_path: Path) -> tuple[Path, int]:
    """A store whose one process was cut off by a crash inside a payment made from code."""
    db = tmp_path / "state.db"
    return db, asyncio.run(programs.crash_in(db, programs.pays_from_code, "pay 2"))


@pytest.fixture
def ui(in_doubt: tuple[Path, int]) -> Iterator[UI]:
    served = UI(in_doubt[0], "--kernel", KERNEL)
    try:
        yield served
    finally:
        served.close()


def test_the_address_it_prints_signs_in_and_the_pages_show_the_store(ui: UI, in_doubt: tuple[Path, int]) -> None:
    _, pid = in_doubt
    assert ui.address == f"{ui.base}/?token={TOKEN}"
    page = ui.sign_in()
    assert page.status_code == 200 and str(page.url) == f"{ui.base}/", "the token left the address"
    assert re.search(rf'<a href="/p/{pid}">{pid}</a></td><td>pays_from_code</td>', page.text), page.text
    assert '<td class="in-doubt-count">1</td>' in page.text, "one call in doubt, counted in its row"
    process = ui.client.get(f"/p/{pid}").text
    assert 'data-slot="1.1"' in process and 'data-slot="1.2"' in process, "tool calls from code, under their slot"
    assert re.search(r'class="depth-1 in-doubt" data-slot="1.2"', process), process
    assert "settle with result" in process


def test_a_call_settled_from_the_page_lets_resume_finish_the_process(ui: UI, in_doubt: tuple[Path, int]) -> None:
    db, pid = in_doubt
    ui.sign_in()
    done = ui.post(f"/p/{pid}/settle", {"csrf": ui.csrf(f"/p/{pid}"), "slot": "1.2", "choice": "result",
                                        "value": '"receipt 42"'})
    assert done.status_code == 303
    said = ui.client.get(done.headers["location"]).text
    assert "slot 1.2 settled" in said, said
    resumed = subprocess.run([sys.executable, "-m", "ringzero.cli", "resume", "--db", str(db), "--kernel", KERNEL],
                             cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True,
                             timeout=120)
    assert resumed.returncode == 0 and "receipt 42" in resumed.stdout, resumed.stdout + resumed.stderr
    assert "exited" in ui.client.get(f"/p/{pid}").text


def test_without_the_token_every_page_and_action_is_401(ui: UI, in_doubt: tuple[Path, int]) -> None:
    _, pid = in_doubt
    stranger = httpx.Client(base_url=ui.base, timeout=10)
    try:
        for path in ("/", f"/p/{pid}", "/events", "/static/ui.js", f"/{'?token=wrong-token-of-enough-length'}"):
            assert stranger.get(path).status_code == 401, path
        assert stranger.post(f"/p/{pid}/kill", data={}, headers={"Origin": ui.base}).status_code == 401
    finally:
        stranger.close()


def test_a_cross_origin_or_forged_action_and_a_foreign_host_are_refused(ui: UI, in_doubt: tuple[Path, int]) -> None:
    _, pid = in_doubt
    ui.sign_in()
    csrf = ui.csrf(f"/p/{pid}")
    settle = {"csrf": csrf, "slot": "1.2", "choice": "run_again"}
    assert ui.post(f"/p/{pid}/settle", settle, Origin="http://evil.example").status_code == 403
    assert ui.client.post(f"/p/{pid}/settle", data=settle).status_code == 403, "no Origin, no Referer"
    assert ui.post(f"/p/{pid}/settle", {**settle, "csrf": "0" * 64}).status_code == 403
    no_token = {k: v for k, v in settle.items() if k != "csrf"}
    assert ui.post(f"/p/{pid}/settle", no_token, Authorization="Bearer not-the-token").status_code == 403, \
        "a wrong Authorization header beside the cookie asks for the CSRF token all the same"
    assert ui.client.get("/", headers={"Host": "rebound.example:80"}).status_code == 421
    sent_on = ui.client.get(f"{ui.base}//evil.example/?token={TOKEN}").headers["location"]
    assert sent_on.startswith("/evil.example/"), f"the printed address's redirect stays here: {sent_on}"
    assert "in-doubt" in ui.client.get(f"/p/{pid}").text, "nothing was settled"


def test_read_only_offers_no_action_and_takes_none(in_doubt: tuple[Path, int]) -> None:
    db, pid = in_doubt
    served = UI(db, "--read-only")
    try:
        served.sign_in()
        page = served.client.get(f"/p/{pid}").text
        assert "settle with result" not in page and "read-only" in page
        forced = served.post(f"/p/{pid}/settle", {"slot": "1.2", "choice": "run_again"},
                             Authorization=f"Bearer {TOKEN}")
        assert forced.status_code == 403
    finally:
        served.close()


def test_the_list_follows_the_store(ui: UI, in_doubt: tuple[Path, int]) -> None:
    """``/events`` says the table changed once a process's row does (read at least twice a second)."""
    db, pid = in_doubt
    ui.sign_in()
    with ui.client.stream("GET", "/events") as events:
        lines = events.iter_lines()
        first = next(line for line in lines if line.startswith("data:"))
        started = time.monotonic()
        subprocess.run([sys.executable, "-m", "ringzero.cli", "settle", "--db", str(db), str(pid), "1.2",
                        "--error", "declined"], cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, check=True,
                       capture_output=True, timeout=60)
        subprocess.run([sys.executable, "-m", "ringzero.cli", "resume", "--db", str(db), "--kernel", KERNEL],
                       cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, timeout=120)
        settled = time.monotonic()
        second = next(line for line in lines if line.startswith("data:"))
        seen = time.monotonic()
    assert second != first
    assert seen - settled < 1.5, (started, settled, seen)
    assert 'class="status-exited"' in ui.client.get("/?part=table").text


def test_the_overview_shows_spend_schedules_and_a_replay_check(tmp_path: Path) -> None:
    db = tmp_path / "state.db"
    asyncio.run(programs.run_to_end(db, programs.agent))

    async def schedule() -> None:
        async with programs.make_kernel(db) as kernel:
            await kernel.schedule(programs.agent, name="nightly", cron="0 7 * * *")

    asyncio.run(schedule())
    served = UI(db, "--kernel", KERNEL)
    try:
        served.sign_in()
        page = served.client.get("/overview").text
        assert re.search(r'tests.operator_programs:agent</td><td>1</td>\s*<td>2</td>', page), page
        assert re.search(r"nightly</td>.*cron 0 7 \* \* \*</td>\s*<td>\d{4}-\d\d-\d\dT\d\d:00:00", page, re.S), page
        checked = served.post("/replay-check", {"csrf": served.csrf("/overview")})
        said = served.client.get(checked.headers["location"]).text
        assert "1 of 1 process(es) replay clean against the current code" in said, said
    finally:
        served.close()


def test_a_message_sent_from_the_page_reaches_a_process_waiting_in_the_store(tmp_path: Path) -> None:
    db = tmp_path / "state.db"
    pid = asyncio.run(programs.waiting_in(db, programs.approves))
    served = UI(db, "--kernel", KERNEL)
    try:
        served.sign_in()
        sent = served.post(f"/p/{pid}/send", {"csrf": served.csrf(f"/p/{pid}"), "message": '"yes"'})
        said = served.client.get(sent.headers["location"]).text
        assert re.search(r'class="flash"[^>]*>[^<]*sent', said), said
        resumed = subprocess.run([sys.executable, "-m", "ringzero.cli", "resume", "--db", str(db), "--kernel",
                                  KERNEL], cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True,
                                 text=True, timeout=120)
        assert resumed.returncode == 0 and "re: draft: paid 1" in resumed.stdout, resumed.stdout + resumed.stderr
    finally:
        served.close()
