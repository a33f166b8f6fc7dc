"""The operator's tools, through the command line as an operator runs them: ``show``, ``settle``,
``retry``, ``fork`` and ``replay --check``, and ``ctx.patched`` for a change deployed while
processes are in flight. Each bad input gets a one-line error, exit 1, and nothing written."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path
from typing import Any

import pytest

from ringzero.checkpointers import SqliteCheckpointer
from ringzero.cli import main
from ringzero.core.contract.store import KernelStore
from tests import operator_programs as programs
from tests.operator_programs import crash_in, run_to_end, waiting_in

KERNEL = "tests.operator_programs:make_kernel"


@pytest.fixture(autouse=True)
def deployed_version_one() -> Any:
    programs.VERSION = 1
    programs.RUNS.clear()
    yield
    programs.VERSION = 1


def cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    """Run a command; what it printed, joined into one line: stdout where it succeeded, stderr
    (where errors go, and only there) where it failed."""
    code = main(list(args))
    printed = capsys.readouterr()
    if code != 0:
        assert printed.out.strip() == "" or "error:" not in printed.out, printed.out
    return code, " ".join((printed.out if code == 0 else printed.err or printed.out).split())


def store_rows(db: Path) -> dict[str, Any]:
    """Every row the store holds (what a refused command must leave as it was)."""
    async def read() -> dict[str, Any]:
        store = SqliteCheckpointer(db)
        try:
            return {f"{cp.thread_id}|{cp.namespace}|{cp.id}": cp.payload async for cp in store.list(None, None)}
        finally:
            await store.aclose()
    return asyncio.run(read())


def journal(db: Path, pid: int) -> list[tuple[str, str]]:
    async def read() -> list[tuple[str, str]]:
        store = SqliteCheckpointer(db)
        try:
            return [(e.kind, e.summary) for e in await KernelStore(store).journal(pid)]
        finally:
            await store.aclose()
    return asyncio.run(read())


def ps_column(table: str, name: str) -> list[str]:
    """One column of ``ringzero ps``'s table, a cell per process."""
    lines = table.splitlines()
    column = [cell.strip() for cell in next(line for line in lines if "┃ pid" in line).split("┃")].index(name)
    return [line.split("│")[column].strip() for line in lines if line.startswith("│")]


def refused(capsys: pytest.CaptureFixture[str], db: Path, *args: str) -> str:
    before = store_rows(db)
    code, out = cli(capsys, *args)
    assert code == 1 and out.startswith("error: ") and "Traceback" not in out, out
    assert store_rows(db) == before, f"{args} wrote to the store"
    return out


# ------------------------------------------------------------------------ show
def test_show_lists_each_slot_of_a_finished_process_and_json_for_machines(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = tmp_path / "state.db"
    pid = asyncio.run(run_to_end(db, programs.agent))
    code, out = cli(capsys, "show", "--db", str(db), str(pid))
    assert code == 0 and "pid 1 agent (exited): tests.operator_programs:agent" in out, out
    for said in ("1 │ llm", "last user 'a'", "2 │ llm", "3 │ tool", 'charge(5)', '-> "charged 5"'):
        assert said in out, said
    code = main(["show", "--db", str(db), "--json", str(pid)])
    shown = json.loads(capsys.readouterr().out)
    assert code == 0 and [s["slot"] for s in shown["slots"]] == ["1", "2", "3"]
    assert shown["slots"][2] == {"slot": "3", "kind": "tool", "summary": "charge(5)", "outcome": {"value": "charged 5"},
                                 "at": shown["slots"][2]["at"], "in_doubt": False}
    assert isinstance(shown["slots"][2]["at"], float)
    assert "no process 9 in the store" in refused(capsys, db, "show", "--db", str(db), "9")


def test_show_marks_a_call_in_doubt_and_tool_calls_made_from_code(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = tmp_path / "state.db"
    pid = asyncio.run(crash_in(db, programs.pays_from_code, "pay 2"))
    code, out = cli(capsys, "show", "--db", str(db), str(pid))
    assert code == 0, out
    assert "1.1 │ tool │ pay(1) │ -> \"paid 1\"" in out, out
    assert "1.2 │ tool │ pay(2) │ in doubt: started, no outcome recorded" in out, out
    assert f"in doubt: slot 1.2; decide with ringzero settle {pid} SLOT" in out


# ---------------------------------------------------------------------- settle
def test_settle_with_the_result_the_call_had_and_resume_goes_on_from_it(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = tmp_path / "state.db"
    pid = asyncio.run(crash_in(db, programs.pays, "pay 7"))
    code, out = cli(capsys, "settle", "--db", str(db), str(pid), "2", "--result", '"receipt 991"')
    assert code == 0 and 'slot 2 (pay(7)) is settled: -> "receipt 991" [settled by an operator]' in out, out
    code, out = cli(capsys, "resume", "--db", str(db), "--kernel", KERNEL)
    assert code == 0 and "pid 1 pays: 'receipt 991'" in out, out
    assert programs.RUNS["pay 7"] == 1, "the settled payment was not made again"
    assert "0 call(s) in doubt" in out


def test_settle_refuses_what_is_not_in_doubt_bad_json_and_an_unknown_pid_writing_nothing(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = tmp_path / "state.db"
    pid = str(asyncio.run(crash_in(db, programs.pays, "pay 7")))
    out = refused(capsys, db, "settle", "--db", str(db), pid, "1", "--result", '"x"')
    assert "slot 1 of pid 1 is not in doubt (it is -> " in out, out
    assert "not JSON" not in out
    assert "the result must be JSON" in refused(capsys, db, "settle", "--db", str(db), pid, "2", "--result", "{bad")
    assert "no process 9 in the store" in refused(capsys, db, "settle", "--db", str(db), "9", "2", "--error", "no")
    assert "a slot is a syscall's number" in refused(capsys, db, "settle", "--db", str(db), pid, "two",
                                                     "--run-again")
    assert "holds no such slot" in refused(capsys, db, "settle", "--db", str(db), pid, "5", "--run-again")


def test_settle_run_again_and_error_on_a_tool_call_made_from_code(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = tmp_path / "state.db"
    pid = str(asyncio.run(crash_in(db, programs.pays_from_code, "pay 2")))
    code, out = cli(capsys, "settle", "--db", str(db), pid, "1.2", "--run-again")
    assert code == 0 and "will run again" in out, out
    code, out = cli(capsys, "resume", "--db", str(db), "--kernel", KERNEL)
    assert code == 0 and "['paid 1', 'paid 2', 'paid 3']" in out, out
    assert (programs.RUNS["pay 1"], programs.RUNS["pay 2"], programs.RUNS["pay 3"]) == (1, 2, 1)

    programs.RUNS.clear()
    db = tmp_path / "again.db"
    pid = str(asyncio.run(crash_in(db, programs.pays_from_code, "pay 2")))
    code, out = cli(capsys, "settle", "--db", str(db), pid, "1.2", "--error", "card declined")
    assert code == 0, out
    code, out = cli(capsys, "resume", "--db", str(db), "--kernel", KERNEL)
    assert code == 0 and "ToolError: card declined (settled by an operator)" in out, out  # the code sees it
    assert programs.RUNS["pay 2"] == 1 and programs.RUNS["pay 3"] == 0


def test_a_process_failed_by_an_in_doubt_call_is_settled_then_retried(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = tmp_path / "state.db"
    pid = str(asyncio.run(crash_in(db, programs.pays, "pay 7")))
    code, out = cli(capsys, "resume", "--db", str(db), "--kernel", KERNEL)
    assert code == 1 and "ToolInDoubt" in out, out
    code, out = cli(capsys, "settle", "--db", str(db), pid, "2", "--result", '"paid by hand"')
    assert code == 0 and f"ringzero retry {pid} goes on from it" in out, out
    code, out = cli(capsys, "retry", "--db", str(db), "--kernel", KERNEL, pid)
    assert code == 0 and "pid 1 pays: 'paid by hand'" in out, out
    assert programs.RUNS["pay 7"] == 1 and programs.RUNS["llm plan"] == 1


# ------------------------------------------------------------ versions and retry
def test_a_patched_change_resumes_old_journals_and_runs_new_ones(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    db = tmp_path / "state.db"
    asyncio.run(crash_in(db, programs.agent, "charge 5"))  # version 1, in flight at the deploy
    programs.VERSION = 3
    code, out = cli(capsys, "resume", "--db", str(db), "--kernel", KERNEL)
    assert code == 0 and "pid 1 agent: ['re: a', 're: b', 'charged 5']" in out, out
    assert programs.RUNS["llm x"] == 0, "the old journal replayed the old code's path"
    assert asyncio.run(run_to_end(db, programs.agent)) == 2
    assert programs.RUNS["llm x"] == 1, "a new process takes the new path"
    assert journal(db, 2)[1] == ("patched", "ask-x")
    assert "patched" not in [kind for kind, _ in journal(db, 1)]


def test_an_unpatched_change_fails_and_retry_after_a_rollback_finishes_it(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = tmp_path / "state.db"
    asyncio.run(crash_in(db, programs.agent, "charge 5"))
    programs.VERSION = 2
    code, out = cli(capsys, "resume", "--db", str(db), "--kernel", KERNEL)
    assert code == 1 and "syscall #2 was recorded as llm(1 messages to default, last user 'b')" in out, out
    assert "now asks for llm(1 messages to default, last user 'x')" in out
    assert 'if await ctx.patched("change-id"):' in out and "ringzero retry 1" in out
    assert "(replayed 1, made live 0)" in out and "0 made live" in out, "the diverging call was never made"
    before = journal(db, 1)
    programs.VERSION = 1  # rolled back
    code, out = cli(capsys, "retry", "--db", str(db), "--kernel", KERNEL, "1")
    assert code == 0 and "pid 1 agent: ['re: a', 're: b', 'charged 5']" in out, out
    assert programs.RUNS["llm a"] == 1 and programs.RUNS["llm b"] == 1, "retry replayed the recorded calls"
    assert journal(db, 1)[:2] == before[:2]
    assert "pid 1 is exited: only a failed process can be retried" in refused(
        capsys, db, "retry", "--db", str(db), "--kernel", KERNEL, "1")
    assert "no process 9 in the store" in refused(capsys, db, "retry", "--db", str(db), "--kernel", KERNEL, "9")


# ------------------------------------------------------------------------ fork
def test_fork_replays_up_to_the_slot_and_runs_live_from_there(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    db = tmp_path / "state.db"
    asyncio.run(run_to_end(db, programs.agent))
    old = store_rows(db)
    code, out = cli(capsys, "fork", "--db", str(db), "--kernel", KERNEL, "1", "--at", "2")
    assert code == 0 and "pid 2 agent: ['re: a', 're: b', 'charged 5'] (replayed 1, made live 2)" in out, out
    assert "1 recorded syscall(s) replayed from the journal" in out and "2 made live" in out
    assert programs.RUNS["llm a"] == 1 and programs.RUNS["llm b"] == 2 and programs.RUNS["charge 5"] == 2
    assert {k: v for k, v in store_rows(db).items() if "process/1|" in k} == \
           {k: v for k, v in old.items() if "process/1|" in k}, "the old process is untouched"
    for at, says in (("0", "fork at a slot: a syscall's number (1 or more)"),
                     ("9", "has no record of slot 4, so it cannot be forked at 9")):
        assert says in refused(capsys, db, "fork", "--db", str(db), "--kernel", KERNEL, "1", "--at", at)
    assert "no process 9" in refused(capsys, db, "fork", "--db", str(db), "--kernel", KERNEL, "9", "--at", "1")


# -------------------------------------------------------------- replay --check
@pytest.mark.parametrize(("version", "clean", "slot"), [
    (1, True, None), (3, True, None), (6, True, None), (7, True, None),  # harmless
    (2, False, "2"), (4, False, "1"), (5, False, "2"),  # breaking, at the slot they break
])
def test_replay_check_flags_breaking_edits_at_their_slot_and_passes_harmless_ones(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], version: int, clean: bool, slot: str | None) -> None:
    db = tmp_path / "state.db"
    asyncio.run(run_to_end(db, programs.agent))
    asyncio.run(crash_in(db, programs.agent, "charge 5"))
    runs, rows = dict(programs.RUNS), store_rows(db)
    programs.VERSION = version
    code, out = cli(capsys, "replay", "--check", "--db", str(db), "--kernel", KERNEL)
    assert store_rows(db) == rows and dict(programs.RUNS) == runs, "a check writes nothing and calls nothing"
    if clean:
        assert code == 0 and "2 of 2 process(es) replay clean" in out, out
    else:
        assert code == 1 and out.count("DIVERGES") == 2 and f"syscall #{slot} was recorded as" in out, out


def test_assert_replays_clean_checks_a_store_kept_in_the_fixtures(tmp_path: Path) -> None:
    from ringzero.testing import assert_replays_clean

    db = tmp_path / "fixture.db"
    asyncio.run(run_to_end(db, programs.agent))
    rows = store_rows(db)
    assert_replays_clean(db)
    programs.VERSION = 2
    with pytest.raises(AssertionError, match=r"pid 1 agent: diverges: pid 1: syscall #2 was recorded as llm"):
        assert_replays_clean(db)
    assert store_rows(db) == rows


# ------------------------------------------------- what a resume says and leaves
def test_a_resume_without_what_a_process_needs_counts_no_call_it_did_not_make(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = tmp_path / "state.db"
    asyncio.run(crash_in(db, programs.agent, "charge 5"))
    code, out = cli(capsys, "resume", "--db", str(db))  # no --kernel: no provider, no tools
    assert code == 1 and "not resumed: no tool named 'charge'" in out, out
    assert "(replayed 2, made live 0)" in out and "0 made live" in out, out
    code, out = cli(capsys, "resume", "--db", str(db), "--kernel", KERNEL)
    assert code == 0 and "pid 1 agent: ['re: a', 're: b', 'charged 5']" in out, out


def test_a_resume_that_cannot_finish_leaves_the_process_as_it_stood_and_send_says_so(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = tmp_path / "state.db"
    asyncio.run(waiting_in(db, programs.approves))
    code, out = cli(capsys, "send", "--db", str(db), "1", '"yes"')
    assert code == 0 and "sent to pid 1, which waits for it" in out, out
    code, out = cli(capsys, "resume", "--db", str(db))  # no --kernel: the approval is read, pay is missing
    assert code == 1 and "(replayed 1, made live 1)" in out and "1 made live" in out, out
    assert main(["ps", "--db", str(db)]) == 0
    assert ps_column(capsys.readouterr().out, "status") == ["ready"], "a process nobody runs is not shown running"
    code, out = cli(capsys, "send", "--db", str(db), "1", '"again"')
    assert code == 0 and "which does not wait for a message now (ready)" in out, out
    main(["show", "--db", str(db), "--json", "1"])
    slots = json.loads(capsys.readouterr().out)["slots"]
    assert [(s["kind"], s["in_doubt"]) for s in slots] == [("llm", False), ("recv", False)], \
        "the call the kernel lacked never started: no intent says it did"
    code, out = cli(capsys, "resume", "--db", str(db), "--kernel", KERNEL)
    assert code == 0 and "pid 1 approves: 're: draft: paid 1'" in out and "0 call(s) in doubt" in out, out
    assert programs.RUNS["pay 1"] == 1


def test_db_takes_a_sqlite_url_and_refuses_a_scheme_it_has_not(tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    db = tmp_path / "state.db"
    asyncio.run(run_to_end(db, programs.agent))
    code, out = cli(capsys, "ps", "--db", f"sqlite:///{db}")  # sqlite:////abs/state.db
    assert code == 0 and "agent" in out and "exited" in out, out
    code, out = cli(capsys, "ps", "--db", "mysql://u@db/agents")
    assert code == 1 and "no checkpointer is installed for mysql://; the schemes installed are sqlite://, " \
        "postgresql://" in " ".join(out.split()), out


async def test_ps_shows_a_running_process_s_wall_time_as_top_does(tmp_path: Path) -> None:
    import subprocess
    import sys

    from ringzero import Kernel

    async def thinker(ctx: Any) -> None:
        await ctx.sleep(5)

    db = tmp_path / "state.db"
    async with Kernel(checkpointer=SqliteCheckpointer(db), monitor_interval=0.1) as kernel:
        await kernel.spawn(thinker, name="thinker")
        await asyncio.sleep(1.5)
        out = await asyncio.to_thread(subprocess.run, [sys.executable, "-m", "ringzero.cli", "ps", "--db", str(db)],
                                      capture_output=True, text=True, timeout=60)
    (wall,) = map(float, ps_column(out.stdout, "wall s"))
    assert 1.0 <= wall < 5, out.stdout


async def test_ps_shows_what_a_process_failed_by_non_determinism_spent(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch,
                                                                         capsys: pytest.CaptureFixture[str]) -> None:
    """A process whose code changed fails on replay before it charges what its journal
    recorded: ``ps`` showed it had made no LLM call and spent no token. It shows the journal's."""
    from ringzero import Kernel, ProcessFailed
    from ringzero.core.contract.types import LLMResponse, Message, Usage
    from ringzero.testing import ScriptedProvider
    from tests.programs import prompted_then_the_host_died

    db = tmp_path / "state.db"
    priced = ScriptedProvider(lambda request: LLMResponse(Message("assistant", "ok"), Usage(11, 7)))
    monkeypatch.setenv("RINGZERO_TEST_PROMPT", "first")
    await prompted_then_the_host_died(db, priced)
    monkeypatch.setenv("RINGZERO_TEST_PROMPT", "something else")
    async with Kernel(checkpointer=SqliteCheckpointer(db), llm=priced) as kernel:
        [handle] = await kernel.recover()
        with pytest.raises(ProcessFailed, match="NonDeterminismError"):
            await handle.wait()
    code, out = await asyncio.to_thread(cli, capsys, "ps", "--db", str(db))
    assert code == 0 and re.search(r"failed │ non_\S* │ 1 │ 18 │", out), out  # one call, 11 + 7 tokens
