"""``make bench``: every benchmark in turn, with which one runs, for how long, and what it measures now.

    python benchmarks/run.py executors checkpointers ...   (names in benchmarks/, or paths to scripts)

Each script's tables pass through as it prints them. In a terminal a status line under them
shows ``[3/11] checkpointers.py · 14 s · <what it is measuring>`` (from the script's
``_progress.step`` lines); a log gets a line at each start, step and end instead. Stops at the
first benchmark that fails, with its exit status.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

from _progress import PREFIX
from rich.console import Console
from rich.markup import escape

HERE = Path(__file__).resolve().parent


def run_one(script: Path, label: str, console: Console) -> int:
    started = time.monotonic()
    current = ["starting"]
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            bufsize=1, env={**os.environ, "PYTHONUNBUFFERED": "1"})  # its tables as it prints them

    def pump(stream: object, is_stderr: bool) -> None:
        for line in stream:  # type: ignore[attr-defined]
            line = line.rstrip("\n")
            if is_stderr and line.startswith(PREFIX):
                current[0] = line[len(PREFIX):]
                if not console.is_terminal:
                    console.print(f"  {label} · {time.monotonic() - started:.0f} s · {escape(current[0])}")
            else:
                console.out(line, highlight=False)

    readers = [threading.Thread(target=pump, args=(proc.stdout, False)),
               threading.Thread(target=pump, args=(proc.stderr, True))]
    for reader in readers:
        reader.start()
    if console.is_terminal:
        with console.status("") as status:
            while proc.poll() is None:
                status.update(f"{label} · {time.monotonic() - started:.0f} s · {escape(current[0])}")
                time.sleep(0.2)
    for reader in readers:
        reader.join()
    code = proc.wait()
    console.print(f"[bold]{label}[/] {'done' if code == 0 else f'[red]failed ({code})[/]'} in "
                  f"{time.monotonic() - started:.1f} s")
    return code


def main(names: list[str]) -> int:
    console = Console(width=140) if not sys.stdout.isatty() else Console()
    started = time.monotonic()
    for index, name in enumerate(names, 1):
        script = Path(name) if name.endswith(".py") else HERE / f"{name}.py"
        label = f"[{index}/{len(names)}] {script.name}"
        console.rule(label)
        code = run_one(script, label, console)
        if code:
            return code
    console.print(f"all {len(names)} benchmarks done in {time.monotonic() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
