"""Kill -9 trials of programs written the natural way (``tests/natural_programs.py``).

For each program, a host runs it and is killed with SIGKILL at a random moment; ``ringzero
resume`` finishes it (for the approval program: ``ringzero send`` delivers the approval after
the crash, and a second ``ringzero resume`` finishes it). Then:

- the result equals the uninterrupted run's;
- counted at the provider and the tools: no model call or tool run that the journal held
  before the kill was made again; a payment tool with an idempotency key charged each payment
  under one key; a payment tool without one never ran twice (its in-doubt call is reported to
  the program instead);
- the counts ``ringzero resume`` printed are the store's.

The kills of the two framework programs (``crew_publishes``, ``graph_pays``) land inside a tool
run, at a random point of it: a keyed tool runs again under its first key, a plain one is
reported to the model as in doubt, and the run finishes either way.

2 kills per program on SQLite and 1 on PostgreSQL in ``make test``, two at a time;
``NATURAL_TRIALS=20`` and ``NATURAL_PG_TRIALS=10`` for the longer run.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from tests import natural_programs
from tests.hosts import kill_host_when
from tests.postgres import fresh_database

ROOT = Path(__file__).resolve().parent.parent
SQLITE_TRIALS = int(os.environ.get("NATURAL_TRIALS", "2"))
PG_TRIALS = int(os.environ.get("NATURAL_PG_TRIALS", "1"))
KERNEL = "tests.natural_programs:make_kernel"
AT_ONCE = 2
"""Trials of one program that run at once (each in stores, logs and OS processes of its own)."""


INSIDE_TOOL = {"crew_publishes": ("crew-charge", "crew-publish"), "graph_pays": ("bill-charge", "notify")}
"""Programs whose kills land inside a tool run (the seed picks which tool and how far in)."""


def in_tool(log: Path, started: str, inside: float) -> Any:
    """True ``inside`` seconds after the log first shows a run of the tool ``started``."""
    seen: list[float] = []

    def ready() -> bool:
        if not seen and any(line.startswith(started) for line in log.read_text().splitlines()):
            seen.append(time.monotonic())
        return bool(seen) and time.monotonic() >= seen[0] + inside

    return ready


def cli(*args: str, log: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ringzero.cli", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT), "RINGZERO_TEST_LOG": str(log)})


async def reference(program: str, log: Path) -> Any:
    """The uninterrupted run's result, in memory (approval: approved as soon as it waits)."""
    os.environ["RINGZERO_TEST_LOG"] = str(log)
    async with natural_programs.make_kernel(":memory:") as kernel:
        handle = await kernel.spawn(natural_programs.PROGRAMS[program], name=program)
        if program in natural_programs.WAITS_FOR_APPROVAL:
            while handle.status.value != "waiting":
                await asyncio.sleep(0.01)
            await handle.send(natural_programs.WAITS_FOR_APPROVAL[program])
        return await handle.wait(timeout=30)


def host_seconds(store: str, program: str, log: Path) -> float:
    """How long a host takes from spawning the program to its end (or, for the approval, to
    waiting for it): the window the kills are drawn from."""
    host = start_host(store, program, log)
    assert host.stdout is not None
    started = time.monotonic()
    assert host.stdout.readline().strip() == "done"
    took = time.monotonic() - started
    host.kill()
    host.wait(30)
    host.stdout.close()
    return took


def start_host(store: str, program: str, log: Path) -> subprocess.Popen[str]:
    host = subprocess.Popen([sys.executable, "-m", "tests.natural_programs", store, program], cwd=ROOT, text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT), "RINGZERO_TEST_LOG": str(log)},
                            stdout=subprocess.PIPE)
    assert host.stdout is not None
    assert host.stdout.readline().strip() == "spawned"
    return host


async def store_view(store: str) -> dict[str, Any]:
    """What the store holds: journal entries and code tool calls by pid, and each record."""
    from ringzero.checkpointers import open_checkpointer
    from ringzero.core.contract.store import KernelStore

    checkpointer = open_checkpointer(store)
    try:
        kernel_store = KernelStore(checkpointer)
        records = await kernel_store.load_processes()
        return {
            "records": {r.pid: r for r in records},
            "journals": {r.pid: await kernel_store.journal(r.pid) for r in records},
            "calls": {r.pid: (await kernel_store.effects(r.pid)).calls for r in records},
        }
    finally:
        await checkpointer.aclose()


def done_before(view: dict[str, Any]) -> tuple[set[str], set[str]]:
    """The model prompts and code tool calls the journals held as done."""
    prompts = {e.fingerprint for journal in view["journals"].values() for e in journal
               if e.kind == "llm" and "value" in e.outcome.to_json()}
    calls = {f"{pid}:{key}" for pid, calls in view["calls"].items() for key in calls}
    return prompts, calls


def printed_counts(out: str) -> dict[str, int]:
    text = " ".join(out.split())
    found = re.search(r"(\d+) recorded syscall\(s\) replayed from the journal .*?, (\d+) made live, (\d+) tool call"
                      r".*? (\d+) call\(s\) in doubt: (\d+) run again .*?, (\d+) left to the program", text)
    assert found, text
    return {"replayed": int(found[1]), "live": int(found[2]), "code_calls": int(found[3]), "in_doubt": int(found[4]),
            "rerun": int(found[5]), "raised": int(found[6])}


def doubts(view: dict[str, Any], pids: list[int]) -> tuple[int, int]:
    """In-doubt calls the store holds as run again and as raised to the program, for ``pids``."""
    outcomes = [e.outcome.to_json() for pid in pids for e in view["journals"][pid]]
    outcomes += [c.outcome.to_json() for pid in pids for c in view["calls"][pid].values()]
    return sum("rerun" in o for o in outcomes), sum("in_doubt" in o for o in outcomes)


async def one_trial(store: str, program: str, folder: Path, seed: int, window: float, expected: Any) -> str:
    log = folder / f"{program}-{seed}.log"
    log.write_text("")
    draw = random.Random(f"{program}|{seed}")
    kill_after = draw.uniform(0.0, window)
    host = await asyncio.to_thread(start_host, store, program, log)
    at = time.monotonic() + kill_after
    ready = lambda: time.monotonic() >= at  # noqa: E731
    if program in INSIDE_TOOL:  # at a random point inside one of its tools' runs
        started, inside = draw.choice(INSIDE_TOOL[program]), draw.uniform(0.0, natural_programs.STEP)
        kill_after = inside
        ready = in_tool(log, started, inside)
    killed = await asyncio.to_thread(kill_host_when, host, ready) == -signal.SIGKILL
    before = await store_view(store)
    prompts_done, calls_done = done_before(before)
    unfinished = [pid for pid, r in before["records"].items() if not r.status.terminal]
    journal_sizes = {pid: len(j) for pid, j in before["journals"].items()}

    out = await asyncio.to_thread(cli, "resume", "--db", store, "--kernel", KERNEL, log=log)
    assert out.returncode == 0, out.stdout + out.stderr
    middle = await store_view(store)
    counts = printed_counts(out.stdout)
    assert counts["replayed"] == sum(journal_sizes[pid] for pid in unfinished), out.stdout
    assert counts["live"] == sum(len(middle["journals"][pid]) - journal_sizes[pid] for pid in unfinished), out.stdout
    assert counts["code_calls"] == sum(len(middle["calls"][p]) - len(before["calls"][p]) for p in unfinished)
    (rerun_before, raised_before), (rerun, raised) = doubts(before, unfinished), doubts(middle, unfinished)
    assert (counts["rerun"], counts["raised"]) == (rerun - rerun_before, raised - raised_before), out.stdout
    assert counts["in_doubt"] == counts["rerun"] + counts["raised"]
    said = " ".join(out.stdout.split())
    for pid, replayed, live in re.findall(r"pid (\d+) \w[\w-]*: .*?\(replayed (\d+), made live (\d+)\)", said):
        # each ended process's own line says what the store shows of it
        grew = len(middle["journals"][int(pid)]) - journal_sizes[int(pid)]
        assert (int(replayed), int(live)) == (journal_sizes[int(pid)], grew), f"pid {pid}: {out.stdout}"
    # A keyed tool that ran twice was reported run again (an in-doubt call whose host died
    # between its intent and the tool's first line ran once, and is reported all the same).
    keyed = Counter(line for line in log.read_text().splitlines() if line.split()[-1].startswith("rz-"))
    assert sum(n - 1 for n in keyed.values()) <= counts["rerun"], f"the tools' own log: {keyed}\n{out.stdout}"
    if program in natural_programs.WAITS_FOR_APPROVAL:
        assert "waits for a message: ringzero send" in out.stdout, out.stdout
        approval = json.dumps(natural_programs.WAITS_FOR_APPROVAL[program])
        sent = await asyncio.to_thread(cli, "send", "--db", store, "1", approval, log=log)
        assert sent.returncode == 0, sent.stdout + sent.stderr
        out = await asyncio.to_thread(cli, "resume", "--db", store, "--kernel", KERNEL, log=log)
        assert out.returncode == 0, out.stdout + out.stderr
    after = await store_view(store)
    root = after["records"][1]
    assert root.status.value == "exited", (out.stdout, root)

    effects = Counter(log.read_text().splitlines())
    again = sorted(p for p in prompts_done if effects[f"llm {p}"] != 1)  # by the request's fingerprint
    assert not again, f"seed {seed}: recorded model calls made again: {again}"
    for key in calls_done:  # each tool call that code made and the journal held ran once
        pid, _, slot = key.partition(":")
        entry = after["calls"][int(pid)][slot]
        assert "rerun" not in entry.outcome.beside
    if program == "charges_from_code":  # each payment made under one key, whatever ran twice
        for i in range(5):
            keys = {line.split()[2] for line in effects if line.startswith(f"charge {i} ")}
            assert len(keys) == 1, f"seed {seed}: payment {i} charged under {keys}"
    if program == "pays_from_code":
        assert all(effects[f"pay {i}"] <= 1 for i in range(5)), f"seed {seed}: a payment ran twice: {effects}"
        if "in doubt" in root.result:
            assert root.result["plan"] == expected["plan"]
            return f"killed after {kill_after:.2f} s, a payment in doubt (reported, not repeated)"
    if program == "approval":
        assert sum(1 for line in effects if line.startswith("publish ")) == 1
    if program in ("crew_publishes", "graph_pays"):  # keyed: once per key; plain: never twice, else reported
        charged = "crew-charge 30 " if program == "crew_publishes" else "bill-charge 30 "
        keys = {line.split()[2] for line in effects if line.startswith(charged)}
        assert len(keys) == 1 and keys.pop().startswith("rz-1-"), f"seed {seed}: charged under {keys}"
        again = sum(n for line, n in effects.items() if line.startswith(charged)) > 1
        rerun_note = ", the charge in doubt (run again under its key)" if again else ""
        plain = "crew-publish hello world" if program == "crew_publishes" else "notify paid"
        assert effects[plain] <= 1, effects
        told = [text for text in root.result if "the outcome of this" in text]
        if told:  # in doubt: the model was told, the run finished, the rest as uninterrupted
            assert len(root.result) == len(expected), root.result
            pairs = zip(root.result, expected, strict=True)
            assert all(got == want or "the outcome of this" in got for got, want in pairs), root.result
            return (f"killed after {kill_after:.2f} s, the {plain.split()[0]} in doubt (the model told, not "
                    f"repeated){rerun_note}")
        assert root.result == expected, f"seed {seed}: {root.result} != {expected}"
        return f"killed after {kill_after:.2f} s{rerun_note}"
    assert root.result == expected, f"seed {seed}: {root.result} != {expected}"
    return f"killed after {kill_after:.2f} s" if killed else "finished before the kill"


async def trials(make_store: Any, folder: Path, count: int) -> dict[str, list[str]]:
    outcomes: dict[str, list[str]] = {}
    at_once = asyncio.Semaphore(AT_ONCE)

    async def trial(program: str, seed: int, window: float, expected: Any) -> str:
        async with at_once:
            own = folder / f"{program}-{seed}"
            own.mkdir()
            return await one_trial(make_store(own), program, folder, seed, window * 1.1, expected)

    for program in natural_programs.PROGRAMS:
        expected = await reference(program, folder / "reference.log")
        window = await asyncio.to_thread(host_seconds, make_store(folder / f"{program}-window"), program,
                                         folder / "window.log")
        outcomes[program] = list(await asyncio.gather(*(trial(program, seed, window, expected)
                                                        for seed in range(count))))
    return outcomes


def report(outcomes: dict[str, list[str]]) -> None:
    """How each trial went (``pytest -s`` shows it)."""
    for program, results in outcomes.items():
        print(f"{program}: " + "; ".join(results))


@pytest.mark.slow
@pytest.mark.timeout(300 + 120 * SQLITE_TRIALS)
async def test_natural_programs_survive_kills_on_sqlite(tmp_path: Path) -> None:
    outcomes = await trials(lambda trial: str(trial) + ".db", tmp_path, SQLITE_TRIALS)
    report(outcomes)
    killed = sum(o.startswith("killed") for results in outcomes.values() for o in results)
    assert killed >= len(outcomes) * SQLITE_TRIALS // 2, outcomes


@pytest.mark.slow
@pytest.mark.timeout(300 + 120 * PG_TRIALS)
async def test_natural_programs_survive_kills_on_postgres(tmp_path: Path, postgres_dsn: str) -> None:
    outcomes = await trials(lambda trial: fresh_database(postgres_dsn), tmp_path, PG_TRIALS)
    report(outcomes)
    killed = sum(o.startswith("killed") for results in outcomes.values() for o in results)
    assert killed >= len(outcomes) * PG_TRIALS // 2, outcomes
