"""``ringzero ui`` in a real browser: Debian's Chromium (installed by the test set-up where it
is missing, as PostgreSQL is), driven by Playwright. The list follows the store, a process's
timeline shows its nested calls, an in-doubt call is settled with its button and the process
then finishes under ``ringzero resume``, fork at a slot makes a new pid, and neither a stranger
nor a page of another origin can act. Each test keeps a screenshot in ``.cache/ui-screenshots``."""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from tests import operator_programs as programs
from tests.debian import apt_install
from tests.test_ui import KERNEL, UI

ROOT = Path(__file__).resolve().parent.parent
SCREENSHOTS = ROOT / ".cache" / "ui-screenshots"

pytestmark = pytest.mark.slow


def _chromium() -> str:
    """Debian's Chromium, installed where missing; the test is skipped where it cannot be."""
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None and apt_install("chromium"):
        found = shutil.which("chromium")
    if found is None:
        pytest.skip("these tests drive Debian's Chromium, which is not installed and cannot be installed here "
                    "(installing it needs root and apt-get)")
    return found


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    executable = _chromium()
    with sync_playwright() as driver:
        # Chromium's own sandbox cannot start as root; the pages it loads are this test's own.
        launched = driver.chromium.launch(executable_path=executable,
                                          args=["--no-sandbox"] if os.geteuid() == 0 else [])
        yield launched
        launched.close()


@pytest.fixture
def page(browser: Any, request: pytest.FixtureRequest) -> Iterator[Any]:
    context = browser.new_context()
    opened = context.new_page()
    opened.on("dialog", lambda dialog: dialog.accept())  # every action's confirmation: yes
    yield opened
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    opened.screenshot(path=str(SCREENSHOTS / f"{request.node.name}.png"), full_page=True)
    context.close()


def beside_the_browser(program: Any, *args: Any) -> Any:
    """``asyncio.run(program(*args))`` on a thread of its own: Playwright's sync driver holds an
    event loop in this one."""
    with concurrent.futures.ThreadPoolExecutor(1) as thread:
        return thread.submit(asyncio.run, program(*args)).result(timeout=120)


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ringzero.cli", *args], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=120)


@pytest.fixture
def in_doubt(tmp_path: Path) -> tuple[Path, int]:
    db = tmp_path / "state.db"
    return db, beside_the_browser(programs.crash_in, db, programs.pays_from_code, "pay 2")


def test_an_in_doubt_call_settled_with_its_button_lets_resume_finish_the_process(
        page: Any, in_doubt: tuple[Path, int]) -> None:
    db, pid = in_doubt
    ui = UI(db, "--kernel", KERNEL)
    try:
        page.goto(ui.address)
        assert page.locator(f'tr[data-pid="{pid}"] td.status').inner_text() == "running"
        page.click(f'a[href="/p/{pid}"]')
        assert page.locator('tr.depth-1[data-slot="1.1"] td.call').inner_text() == "pay(1)"  # nested under slot 1
        doubtful = page.locator('tr.in-doubt[data-slot="1.2"]')
        doubtful.locator('input[name="value"]').fill('"receipt 42"')
        doubtful.locator('button[value="result"]').click()
        page.wait_for_selector("p.flash")
        assert "slot 1.2 settled" in page.locator("p.flash").inner_text()
        assert page.locator("tr.in-doubt").count() == 0
        resumed = cli("resume", "--db", str(db), "--kernel", KERNEL)
        assert resumed.returncode == 0 and "receipt 42" in resumed.stdout, resumed.stdout + resumed.stderr
        page.goto(f"{ui.base}/")
        # the list's own update, within a second of the transition the resume wrote
        page.wait_for_selector(f'tr[data-pid="{pid}"].status-exited', timeout=1000)
    finally:
        ui.close()


def test_the_list_updates_within_a_second_of_a_transition(page: Any, in_doubt: tuple[Path, int]) -> None:
    db, pid = in_doubt
    ui = UI(db)
    try:
        page.goto(ui.address)
        page.wait_for_selector(f'tr[data-pid="{pid}"].status-running')
        page.wait_for_timeout(600)  # the page has its first event: what follows is a change
        assert cli("settle", "--db", str(db), str(pid), "1.2", "--error", "declined").returncode == 0
        assert cli("resume", "--db", str(db), "--kernel", KERNEL).returncode == 0
        page.wait_for_selector(f'tr[data-pid="{pid}"].status-exited', timeout=1000)  # no reload: the page's script
        assert page.evaluate("document.getElementById('table').dataset.updated") is not None
    finally:
        ui.close()


def test_fork_at_a_slot_from_the_page_makes_a_new_pid(page: Any, tmp_path: Path) -> None:
    db = tmp_path / "state.db"
    pid = beside_the_browser(programs.run_to_end, db, programs.agent)
    ui = UI(db, "--kernel", KERNEL)
    try:
        page.goto(f"{ui.address.replace('/?', f'/p/{pid}?')}")
        page.locator('tr[data-slot="2"] form[action$="/fork"] button').click()
        page.wait_for_selector("p.flash")
        assert "pid 2 agent" in page.locator("p.flash").inner_text(), page.locator("p.flash").inner_text()
        page.goto(f"{ui.base}/")
        page.wait_for_selector('tr[data-pid="2"].status-exited', timeout=5000)
    finally:
        ui.close()


def test_no_page_or_action_without_the_token_and_no_action_from_another_origin(
        page: Any, in_doubt: tuple[Path, int]) -> None:
    db, pid = in_doubt
    ui = UI(db)
    attacker = _Page(f"""<form id="f" method="post" action="{ui.base}/p/{pid}/settle">
        <input name="slot" value="1.2"><input name="choice" value="run_again"></form>
        <script>document.getElementById("f").submit()</script>""")
    try:
        for path in ("/", f"/p/{pid}", "/events"):
            assert page.goto(ui.base + path).status == 401, path
        refused = page.request.post(f"{ui.base}/p/{pid}/kill", form={"do": "kill"})
        assert refused.status == 401
        page.goto(ui.address)  # signed in: the browser holds the cookie now
        with page.expect_navigation(url=f"{ui.base}/p/{pid}/settle"):
            page.goto(attacker.url)
        assert "must come from this server's own pages" in page.content()
        page.goto(f"{ui.base}/p/{pid}")
        assert page.locator("tr.in-doubt").count() == 1, "nothing was settled"
    finally:
        attacker.close()
        ui.close()


class _Page:
    """A page served by another origin (127.0.0.1, another port), as an attacker's would be."""

    def __init__(self, html: str) -> None:
        body = html.encode()

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "text/html")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
