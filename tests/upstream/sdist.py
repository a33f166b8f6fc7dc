"""Fetch another project's own tests from the package index at test time, and run them.

The tests of LangGraph and langgraph-prebuilt ship in their sdists. ``unpacked_sdist(distribution)``
downloads the sdist of the version installed here from the index that installed it (the
simple API, PEP 691 JSON or the HTML page), checks its sha256 against the index, and unpacks it
under ``.cache/upstream/`` (kept between runs; nothing is copied into the repository).
``run_suite`` runs chosen test files of it with pytest in a subprocess, with one of the plugins
beside this module loaded, and returns the result with pytest's own summary line.
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import importlib.metadata
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urljoin

import httpx

REPO = Path(__file__).resolve().parents[2]
CACHE = REPO / ".cache" / "upstream"
PLUGINS = Path(__file__).resolve().parent
SIMPLE_JSON = "application/vnd.pypi.simple.v1+json"


def index_url() -> str:
    """The simple index this environment installs from (uv's and pip's settings, else PyPI)."""
    for name in ("UV_DEFAULT_INDEX", "UV_INDEX_URL", "PIP_INDEX_URL"):
        if os.environ.get(name):
            return os.environ[name].rstrip("/") + "/"
    return "https://pypi.org/simple/"


def _normalized(distribution: str) -> str:
    return re.sub(r"[-_.]+", "-", distribution).lower()


def _sdist_link(distribution: str, version: str) -> tuple[str, str]:
    """The sdist's URL and sha256, as the index lists them."""
    page = urljoin(index_url(), _normalized(distribution) + "/")
    wanted = {f"{stem}-{version}.tar.gz" for stem in (distribution, distribution.replace("-", "_"),
                                                      _normalized(distribution).replace("-", "_"))}
    with httpx.Client(follow_redirects=True, timeout=60) as client:
        response = client.get(page, headers={"Accept": f"{SIMPLE_JSON}, text/html;q=0.1"})
        response.raise_for_status()
        if response.headers.get("content-type", "").startswith(SIMPLE_JSON):
            for entry in response.json()["files"]:
                if entry["filename"] in wanted:
                    return urljoin(page, entry["url"]), entry["hashes"]["sha256"]
        else:
            for href, name in re.findall(r'<a[^>]*href="([^"]+)"[^>]*>([^<]+)</a>', response.text):
                digest = re.search(r"#sha256=([0-9a-f]{64})", href)
                if name.strip() in wanted and digest:
                    return urljoin(page, href.split("#")[0]), digest.group(1)
    raise LookupError(f"{page} lists no sdist of {distribution} {version} (looked for {sorted(wanted)})")


def unpacked_sdist(distribution: str) -> Path:
    """The unpacked sdist of the installed version of ``distribution`` (its root, with tests/)."""
    version = importlib.metadata.version(distribution)
    target = CACHE / f"{_normalized(distribution)}-{version}"
    if (target / "tests").is_dir():
        return target
    url, sha256 = _sdist_link(distribution, version)
    CACHE.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=CACHE) as work:
        archive = Path(work) / "sdist.tar.gz"
        with httpx.Client(follow_redirects=True, timeout=120) as client, client.stream("GET", url) as response:
            response.raise_for_status()
            digest = hashlib.sha256()
            with archive.open("wb") as out:
                for chunk in response.iter_bytes():
                    digest.update(chunk)
                    out.write(chunk)
        if digest.hexdigest() != sha256:
            raise RuntimeError(f"{url}: sha256 {digest.hexdigest()} is not the index's {sha256}")
        with tarfile.open(archive) as tar:
            if hasattr(tarfile, "data_filter"):
                tar.extractall(work, filter="data")
            else:  # pragma: no cover - Pythons before the extraction filters
                tar.extractall(work)  # an archive whose sha256 the index vouched for
        [root] = [p for p in Path(work).iterdir() if p.is_dir()]
        if not (root / "tests").is_dir():
            raise RuntimeError(f"the sdist of {distribution} {version} ships no tests/ directory")
        shutil.rmtree(target, ignore_errors=True)
        root.rename(target)
    return target


@dataclass
class SuiteResult:
    returncode: int
    output: str

    @property
    def summary(self) -> str:
        """pytest's last line (``N passed, M failed in ...``)."""
        lines = [line for line in self.output.splitlines() if " in " in line and ("passed" in line or "failed" in line
                                                                                   or "error" in line)]
        return lines[-1].strip("= ") if lines else "(no summary line)"

    def failed_tests(self) -> set[str]:
        """The node ids pytest's short summary lists as failed or in error."""
        return set(re.findall(r"^(?:FAILED|ERROR) (\S+)", self.output, re.MULTILINE))

    def count(self, outcome: str) -> int:
        found = re.search(rf"(\d+) {outcome}", self.summary)
        return int(found.group(1)) if found else 0


def run_suite(root: Path, files: list[str], plugin: str, env: dict[str, str] | None = None,
              timeout: float = 900, ini: str | None = None) -> SuiteResult:
    """Run ``files`` (paths under ``root``) with pytest and ``plugin`` (a module beside this one).

    ``ini`` is the pytest configuration for a project whose sdist carries none (its monorepo
    keeps it at the top, outside the sdist): without it pytest would take this repository's."""
    missing = [f for f in files if not (root / f).exists()]
    if missing:
        raise FileNotFoundError(f"{root.name} has no {', '.join(missing)}")
    with tempfile.TemporaryDirectory(prefix="ringzero-upstream-") as scratch:
        # a temporary folder of the run's own: LangGraph's suite leaves about 90 empty temporary
        # files behind a run, which would pile up in the system's /tmp at every `make test`
        environment = {**os.environ, "PYTHONPATH": str(PLUGINS), "NO_DOCKER": "true", "TMPDIR": scratch, **(env or {})}
        configured: list[str] = []
        if ini is not None:
            (Path(scratch) / "pytest.ini").write_text(ini)
            configured = ["-c", str(Path(scratch) / "pytest.ini"), "--rootdir", str(root)]
        completed = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", plugin, "-o", "timeout=120",
             *configured, *files],
            cwd=root, env=environment, capture_output=True, text=True, timeout=timeout, check=False)
    return SuiteResult(completed.returncode, completed.stdout + completed.stderr)


OUTCOMES = ("failed", "passed", "skipped", "deselected", "xfailed", "xpassed", "error")


def run_split(root: Path, files: list[str], plugin: str, parts: int | None = None,
              **options: Any) -> SuiteResult:
    """``run_suite`` over ``files`` shared out among ``parts`` pytest processes run at once (one
    per CPU this process may use, by default), the biggest files first to the least loaded:
    each file's tests run as they would alone, the machine's cores all at work. The result's
    output is each part's, then one summary line adding their counts."""
    parts = max(1, min(parts or len(os.sched_getaffinity(0)), len(files)))
    shares: list[list[str]] = [[] for _ in range(parts)]
    loads = [0] * parts
    for file in sorted(files, key=lambda f: -(root / f).stat().st_size):
        least = loads.index(min(loads))
        shares[least].append(file)
        loads[least] += (root / file).stat().st_size
    with concurrent.futures.ThreadPoolExecutor(parts) as pool:
        results = list(pool.map(lambda share: run_suite(root, share, plugin, **options), shares))
    return merged(results)


def merged(results: list[SuiteResult]) -> SuiteResult:
    """Results of suites run side by side, as one: the worst exit status, every output, and a
    summary line that adds up their counts."""
    counts = {outcome: sum(result.count(outcome) for result in results) for outcome in OUTCOMES}
    summary = ", ".join(f"{n} {outcome}" for outcome, n in counts.items() if n) + " in (parts run at once)"
    output = "\n".join(result.output for result in results) + f"\n==== {summary} ====\n"
    return SuiteResult(max(result.returncode for result in results), output)
