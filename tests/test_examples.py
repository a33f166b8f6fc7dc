"""The examples run as a user runs them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_the_langgraph_react_example_runs_offline() -> None:
    out = subprocess.run([sys.executable, "examples/langgraph_react.py"], cwd=ROOT, capture_output=True, text=True,
                         timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, out.stderr
    assert '"words": 8' in out.stdout and "syscalls journaled: llm, tool, llm" in out.stdout
