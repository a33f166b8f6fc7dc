"""The crash matrix: kill -9 at a random point of a program's effects made from code, then
resume with one host or two on the store at once, and hold every effect to the kernel's promise.

Cells: executor {Monty, process sandbox, an outside executor that calls its tools itself} x
effect {keyed tool calls, POSTs through egress with no tools given, both} x surface {``ctx.exec``,
``KernelToolNode`` with ``code_tool``, a CrewAI ``CodeExecutionTool``, a session with a step per
effect} x hosts {one ``ringzero resume``, two at once}. A code tool takes no egress policy, the
outside executor does no egress and keeps no session, and a process sandbox's session has no
network: those cells do not exist. Each trial picks its kill point at random (seeded, printed):
inside a payment, or a moment after a POST reached the server.

The promise, checked at the payment's log and the server: an effect that finished before the
kill happened once; the one in flight happened at most once more, under the same key (a keyed
payment run again), or not again (a POST, which is in doubt: the program ends with ToolInDoubt,
or the payment inside a code tool, whose call is in doubt); an effect after it happened once
where the program went on, never twice; and the process ended, exited or failed with
ToolInDoubt, never left running.

``make test`` runs a slice (``SLICE``); ``CRASH_MATRIX=full`` runs every cell
(``CRASH_MATRIX=full .venv/bin/pytest tests/test_crash_matrix.py``), ``CRASH_SEED`` fixes the seed.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from tests.crash_matrix_programs import EFFECTS, EXECUTORS, SURFACES, step_kinds
from tests.egress_servers import LocalCA, Server, local_ca, serving
from tests.hosts import kill_host_when
from tests.outside_install import REPO, environment, installed  # noqa: F401  (the site fixture)

KERNEL = "tests.crash_matrix_programs:make_kernel"
SEED = int(os.environ.get("CRASH_SEED", str(int(time.time()))))


def exists(executor: str, effect: str, surface: str) -> bool:
    """Whether a cell can be: egress only where the surface takes a policy and the executor has
    a network to give, a session only where the executor keeps one."""
    if surface == "session":
        return executor == "monty" or (executor == "process" and effect == "tools")
    return (surface == "exec" or effect == "tools") and (executor != "outside" or effect == "tools")


CELLS = [(executor, effect, surface, hosts)
         for executor in EXECUTORS for effect in EFFECTS for surface in SURFACES for hosts in (1, 2)
         if exists(executor, effect, surface)]
SLICE = [("monty", "mixed", "exec", 2), ("process", "egress", "exec", 1), ("outside", "tools", "exec", 2),
         ("monty", "tools", "code_tool", 1), ("process", "tools", "session", 2)]
"""What ``make test`` runs: each executor, each effect, three surfaces, both host counts."""

pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def ca(tmp_path_factory: pytest.TempPathFactory) -> LocalCA:
    return local_ca(tmp_path_factory.mktemp("matrix-ca"))


def cells() -> list[tuple[str, str, str, int]]:
    return CELLS if os.environ.get("CRASH_MATRIX") == "full" else SLICE


def payments(log: Path) -> list[tuple[str, int, str]]:
    """(``start`` or ``end``, n, key) of each line of the payments' log."""
    lines = log.read_text().splitlines() if log.exists() else []
    return [(word, int(n), key[0] if key else "") for word, n, *key in (line.split() for line in lines)]


def posts(api: Server) -> list[int]:
    return [int(r.body) for r in api.received if r.method == "POST"]


async def resume(site: Path, db: str, env: dict[str, str]) -> str:
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "ringzero.cli", "resume", "--db", db, "--kernel", KERNEL, cwd=REPO,
        env=environment(site, **env), stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    out, _ = await asyncio.wait_for(process.communicate(), 300)
    text = out.decode()
    assert process.returncode in (0, 1), text  # 1: a process failed (ToolInDoubt), as it may
    return text


async def ended(db: str) -> tuple[str, Any]:
    from ringzero.checkpointers import open_checkpointer
    from ringzero.core.contract.store import KernelStore

    checkpointer = open_checkpointer(db)
    try:
        [record] = await KernelStore(checkpointer).load_processes()
        return record.status.value, record.result if record.error is None else record.error["type"]
    finally:
        await checkpointer.aclose()


@pytest.mark.parametrize(("executor", "effect", "surface", "hosts"), cells())
async def test_every_finished_effect_once_and_the_one_in_flight_in_doubt_or_once_more_under_its_key(
        site: Path, tmp_path: Path, ca: LocalCA, executor: str, effect: str, surface: str, hosts: int) -> None:
    rng = random.Random(f"{SEED}-{executor}-{effect}-{surface}-{hosts}")
    kinds = step_kinds(effect)
    at = rng.randrange(len(kinds))
    db, log = str(tmp_path / "state.db"), tmp_path / "payments.log"
    with serving(ca) as api:
        env = {"MATRIX_EXECUTOR": executor, "MATRIX_LOG": str(log), "MATRIX_HOLD": str(at),
               "MATRIX_API": str(api.port), "MATRIX_CA": str(ca.pem)}
        host = await asyncio.to_thread(
            subprocess.Popen, [sys.executable, "-m", "tests.crash_matrix_programs", db, surface, effect], cwd=REPO,
            env=environment(site, **env), stdout=subprocess.PIPE, text=True)
        delay = rng.uniform(0, 0.03)
        if kinds[at] == "charge":
            def reached() -> bool:
                return any(word == "start" and n == at for word, n, _ in payments(log))
        else:
            def reached() -> bool:
                return at in posts(api)
        hit: list[float] = []

        def ready() -> bool:
            if not hit and reached():
                hit.append(time.monotonic())
            return bool(hit) and time.monotonic() - hit[0] >= delay

        assert await asyncio.to_thread(kill_host_when, host, ready, 120) == -signal.SIGKILL
        assert hit, f"the host never reached step {at} ({kinds[at]})"
        finished_before = {n for word, n, _ in payments(log) if word == "end"} | set(posts(api))
        said = await asyncio.gather(*(resume(site, db, env) for _ in range(hosts)))
        status, outcome = await ended(db)
        made = payments(log)
        sent = posts(api)
    trial = (f"seed {SEED}: {executor}/{effect}/{surface}/{hosts} host(s), killed {delay * 1000:.0f} ms into step "
             f"{at} ({kinds[at]}); payments {made}; posts {sent}; ended {status} {outcome!r}\n" + "\n".join(said))
    print(trial.partition("\n")[0])  # what the trial did, in the log of a run with -s
    starts = Counter(n for word, n, _ in made if word == "start")
    keys = {n: {key for word, m, key in made if word == "start" and m == n} for n in starts}
    for n in finished_before:
        assert starts[n] + sent.count(n) == 1, trial  # finished before the kill: once, never again
    for n, count in starts.items():
        assert count == 1 or (count == 2 and n == at and len(keys[n]) == 1 and "" not in keys[n]), trial
    assert all(count == 1 for count in Counter(sent).values()), trial  # a POST is never sent twice
    assert status in ("exited", "failed"), trial
    if status == "failed":
        assert outcome == "ToolInDoubt", trial
    else:
        done = set(starts) | set(sent)
        assert done == set(range(len(kinds))), trial  # exited: every step made
