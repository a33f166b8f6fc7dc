"""The documentation site: it builds with warnings as errors (a broken link, a page left out of
the navigation, a reference to a name that does not exist fail it), and the README stays a
front page whose links lead somewhere. The code blocks of both run as tests of their own
(``conftest.py`` at the repository's root)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_the_site_builds_with_warnings_as_errors(tmp_path: Path) -> None:
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}  # the theme's notice of its successor, not a warning of ours
    built = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                           cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert built.returncode == 0, built.stdout + built.stderr
    assert "WARNING" not in built.stderr, built.stderr
    reference = (tmp_path / "site/reference/protocols/index.html").read_text()
    assert "Checkpointer" in reference and "backend_problems" in reference  # read from the docstrings


def test_the_readme_is_a_front_page_whose_links_lead_somewhere() -> None:
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 250
    targets = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", readme)
    assert targets, "the README links to the pages"
    missing = [target for target in targets if "://" not in target and not (ROOT / target).exists()]
    assert not missing, f"the README links to files that do not exist: {missing}"


def test_every_page_is_in_the_navigation_and_every_page_named_there_exists() -> None:
    """mkdocs warns of both; this says which, without a build."""
    config = (ROOT / "mkdocs.yml").read_text()
    named = set(re.findall(r":\s+(\S+\.md)\s*$", config, re.M))
    pages = {p.relative_to(ROOT / "docs").as_posix() for p in (ROOT / "docs").rglob("*.md")}
    assert named == pages, f"in the navigation only: {named - pages}; in docs/ only: {pages - named}"
