"""Install ``tests/outside`` (a package written outside ringzero) as an installer would: its
files and a ``.dist-info`` holding its metadata and the entry points its ``pyproject.toml``
declares, in a folder of its own that goes on ``sys.path`` (or ``PYTHONPATH``)."""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib

OUTSIDE = Path(__file__).parent / "outside"
REPO = Path(__file__).parent.parent


def install(site: Path) -> Path:
    """Install the package into ``site``; returns ``site``."""
    project = tomllib.loads((OUTSIDE / "pyproject.toml").read_text())["project"]
    shutil.copytree(OUTSIDE / "ringzero_outside", site / "ringzero_outside",
                    ignore=shutil.ignore_patterns("__pycache__"))
    info = site / f"{project['name'].replace('-', '_')}-{project['version']}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {project['name']}\nVersion: {project['version']}\n")
    groups = [f"[{group}]\n" + "".join(f"{name} = {target}\n" for name, target in points.items())
              for group, points in project.get("entry-points", {}).items()]
    (info / "entry_points.txt").write_text("\n".join(groups))
    (info / "INSTALLER").write_text("tests\n")
    return site


def environment(site: Path, **extra: str) -> dict[str, str]:
    """An environment for a subprocess that sees the installed package and this checkout's tests."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(REPO)]), **extra}


@pytest.fixture(scope="module", name="site")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The outside package, installed in a folder of its own and on ``sys.path`` for the
    module's tests (a test module imports this fixture)."""
    folder = install(tmp_path_factory.mktemp("site"))
    sys.path.insert(0, str(folder))
    try:
        yield folder
    finally:
        sys.path.remove(str(folder))
        for name in [name for name in sys.modules if name.startswith("ringzero_outside")]:
            del sys.modules[name]
