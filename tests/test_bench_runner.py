"""``make bench``'s runner: which benchmark runs, for how long, what it measures now, and a stop
at the first one that fails."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_the_runner_shows_each_benchmark_and_its_steps_as_they_happen_and_stops_at_a_failure(
        tmp_path: Path) -> None:
    first = tmp_path / "first.py"
    first.write_text("import sys, time\n"
                     f"sys.path.insert(0, {str(ROOT / 'benchmarks')!r})\n"
                     "from _progress import step\n"
                     "step('measuring the first row')\ntime.sleep(0.3)\n"
                     "print('| row one | 42 |')\ntime.sleep(0.3)\n"  # shown as printed: the runner unbuffers it
                     "step('measuring the second row')\ntime.sleep(0.3)\nprint('| row two | 43 |')\n")
    failing = tmp_path / "failing.py"
    failing.write_text("import sys\nprint('half a table')\nsys.exit(3)\n")
    never = tmp_path / "never.py"
    never.write_text("print('this one must not run')\n")
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "run.py"), str(first), str(failing), str(never)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 3, out.stdout + out.stderr
    lines = out.stdout.splitlines()
    expected_in_order = ["[1/3] first.py", "measuring the first row", "| row one | 42 |",
                         "measuring the second row", "| row two | 43 |",
                         "[1/3] first.py done in", "[2/3] failing.py", "half a table", "[2/3] failing.py failed (3)"]
    positions = [next(i for i, line in enumerate(lines) if want in line) for want in expected_in_order]
    assert positions == sorted(positions), out.stdout
    assert all(lines[positions[i]].strip().startswith("[1/3] first.py · ") for i in (1, 3))  # with its time
    assert "never.py" not in out.stdout and "must not run" not in out.stdout
