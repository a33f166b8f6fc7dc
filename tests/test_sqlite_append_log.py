"""SqliteCheckpointer's append log (``ringzero.checkpointers.sqlite.log``): a record appended is
durable in one ``write()``, and whoever opens or lists the file next folds a dead
checkpointer's log into it. The kill -9 tests are the judge: each first shows that the records
were in the log only (not in the SQLite file) when the host died."""

from __future__ import annotations

import asyncio
import os
import signal
import sqlite3
import struct
import subprocess
import sys
import time
import zlib
from contextlib import closing
from pathlib import Path

import pytest

from ringzero import Kernel
from ringzero.checkpointers import SqliteCheckpointer
from ringzero.checkpointers.sqlite.log import FOLD_AFTER, FOLD_EVERY, RESTART_AFTER, AppendLog, encode
from ringzero.core._engine.pids import PID_BLOCK
from ringzero.core.contract.errors import CheckpointerError
from ringzero.core.contract.types import Checkpoint, PendingWrite
from ringzero.testing import ScriptedProvider
from tests.programs import receiver

ROOT = Path(__file__).resolve().parent.parent


def host(*args: str) -> subprocess.CompletedProcess[str]:
    """Run ``tests.append_log_host`` to its own kill -9; its output."""
    done = subprocess.run([sys.executable, "-m", "tests.append_log_host", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=60, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == -signal.SIGKILL, done.stderr
    return done


def rows_in_file(db: Path, sql: str) -> int:
    """Rows the SQLite file itself holds (a plain connection: no log folded)."""
    with closing(sqlite3.connect(db)) as conn, conn:  # closed, not only committed
        return int(conn.execute(sql).fetchone()[0])


def logs(db: Path) -> list[Path]:
    return sorted(db.parent.glob(db.name + "-rzlog-*"))


async def new_file_identity(db: Path) -> tuple[int, int]:
    """Make the SQLite file ``db`` (closed again); its (device, inode), which a log names."""
    store = SqliteCheckpointer(db)
    await store.get("t")
    identity = store.writer.identity
    await store.aclose()
    assert identity is not None
    return identity


@pytest.mark.timeout(120)
async def test_records_appended_survive_kill_9_in_the_log_and_the_next_opener_folds_them(tmp_path: Path) -> None:
    db = tmp_path / "state.db"
    log_path, folds = (await asyncio.to_thread(host, "appends", str(db), "10")).stdout.split()
    assert folds == "0" and [str(p) for p in logs(db)] == [log_path]
    assert rows_in_file(db, "SELECT count(*) FROM checkpoints WHERE thread_id='t'") == 1, \
        "the first append (after the open's writes) commits, the 9 in a row after it go to the log only"

    store = SqliteCheckpointer(db)
    got = [cp async for cp in store.list("t")]
    assert sorted((cp.id, cp.payload, cp.metadata["i"]) for cp in got) == [
        (f"{i:04d}", f"record {i}".encode(), i) for i in range(10)]
    assert logs(db) == [], "a folded orphan log is deleted"
    await store.aclose()
    assert rows_in_file(db, "SELECT count(*) FROM checkpoints WHERE thread_id='t'") == 10
    assert rows_in_file(db, "SELECT count(*) FROM ringzero_folded_logs") == 0


@pytest.mark.timeout(120)
async def test_kill_9_right_after_ctx_llm_returned_then_recover_calls_the_llm_no_more(tmp_path: Path) -> None:
    db = tmp_path / "state.db"
    await asyncio.to_thread(host, "kernel", str(db), "3")
    assert rows_in_file(db, "SELECT count(*) FROM checkpoints WHERE namespace='journal'") < 3, \
        "the whole journal was committed before the kill: this test would not test the log"
    assert [p.stat().st_size > 100 for p in logs(db)] == [True]

    asked: list[str] = []

    def provider(request: object) -> str:
        asked.append(str(request))
        return "asked again"

    async with Kernel(checkpointer=SqliteCheckpointer(db), llm=ScriptedProvider(provider)) as kernel:
        [handle] = await kernel.recover()
        assert await handle.wait(timeout=30) == ["answer"] * 3
    assert asked == [], "a call recorded in the append log ran again"
    assert logs(db) == []


@pytest.mark.timeout(120)
async def test_kill_9_right_after_a_langgraph_run_returned_and_a_new_saver_sees_its_last_checkpoint(
        tmp_path: Path) -> None:
    from ringzero.adapters.langgraph import KernelSaver

    db = tmp_path / "graph.db"
    assert (await asyncio.to_thread(host, "graph", str(db), "4")).stdout.split() == ["4"]
    assert rows_in_file(db, "SELECT count(*) FROM checkpoints WHERE thread_id='g'") == 1, \
        "the first checkpoint commits (it follows the open's writes); the others must be in the log only"
    saver = KernelSaver(SqliteCheckpointer(db))
    config = {"configurable": {"thread_id": "g"}}
    got = await saver.aget_tuple(config)  # type: ignore[arg-type]
    assert got is not None and got.checkpoint["channel_values"]["steps"] == ["step0", "step1", "step2", "step3"]
    assert got.metadata["step"] == 4
    history = [c async for c in saver.alist(config)]  # type: ignore[arg-type]
    assert len(history) == 6  # the input, the start, and one after each of the 4 nodes
    await saver.checkpointer.aclose()
    assert logs(db) == []


async def test_a_torn_last_record_is_dropped_and_the_ones_before_it_folded(tmp_path: Path) -> None:
    db = tmp_path / "state.db"
    identity = await new_file_identity(db)
    log = AppendLog(db, identity)
    for i in range(3):
        log.append(i + 1, [("t", "", f"{i}", None, b"x", "{}")])
    log.close(remove=False)
    whole = encode(4, [("t", "", "3", None, b"x", "{}")])
    with log.path.open("ab") as f:
        f.write(whole[:-2])  # a write the crash cut short

    store = SqliteCheckpointer(db)
    assert [cp.id async for cp in store.list("t")] == ["2", "1", "0"]
    await store.aclose()


async def test_a_record_folded_before_the_crash_is_not_folded_again_over_a_newer_write(tmp_path: Path) -> None:
    """A crash between a fold's commit and its log's deletion leaves folded records in the log:
    ``ringzero_folded_logs`` says how far it got, so the next fold skips them and a newer
    value written since is kept."""
    db = tmp_path / "state.db"
    store = SqliteCheckpointer(db)
    await store.get("t")
    assert store.writer.identity is not None
    log = AppendLog(db, store.writer.identity)
    for i in range(3):
        log.append(i + 1, [("t", "", f"{i}", None, b"old", "{}")])
    log.close(remove=False)
    await store.write([("INSERT INTO ringzero_folded_logs VALUES (?, ?)", [(log.name, 2)])])
    await store.put(Checkpoint("t", "", "0", b"newer"))
    await store.aclose()

    store = SqliteCheckpointer(db)
    assert {cp.id: cp.payload async for cp in store.list("t")} == {"0": b"newer", "2": b"old"}
    assert not log.path.exists()
    await store.aclose()


async def test_a_log_written_for_a_file_since_replaced_is_left_alone(tmp_path: Path) -> None:
    db = tmp_path / "state.db"
    log = AppendLog(db, (0, 0))  # no file has that identity
    log.append(1, [("t", "", "0", None, b"x", "{}")])
    log.close(remove=False)
    store = SqliteCheckpointer(db)
    assert [cp async for cp in store.list("t")] == []
    assert log.path.exists()
    await store.aclose()


async def test_a_live_checkpointers_log_is_left_to_it_and_folded_for_others_soon(tmp_path: Path) -> None:
    db = tmp_path / "state.db"
    writer = SqliteCheckpointer(db)
    await writer.get("t")
    await writer.append(Checkpoint("t", "", "0", b"zero"))  # after the open's writes: committed
    await writer.append(Checkpoint("t", "", "1", b"one"))  # in a row: to the log
    assert writer.folds == 0 and rows_in_file(db, "SELECT count(*) FROM checkpoints") == 1
    reader = SqliteCheckpointer(db)
    await reader.get("t", "", "1")  # opened: it folds orphan logs, and must leave the writer's alone
    assert writer.appends.log is not None and writer.appends.log.path.exists(), "a live checkpointer's log was taken"
    await asyncio.sleep(FOLD_AFTER * 2)
    assert writer.folds == 1
    found = await reader.get("t", "", "1")
    assert found is not None and found.payload == b"one"
    await reader.aclose()
    await writer.aclose()
    assert logs(db) == []


async def test_appends_in_a_row_fold_once_they_pause_and_at_the_latest_fold_within_after_the_oldest(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from ringzero.checkpointers.sqlite import folds as sqlite

    monkeypatch.setattr(sqlite, "FOLD_AFTER", 0.3)  # long enough that this machine's stalls do not matter
    monkeypatch.setattr(sqlite, "FOLD_WITHIN", 3600.0)
    db = tmp_path / "state.db"
    store = SqliteCheckpointer(db)
    await store.get("t")
    await store.append(Checkpoint("t", "", "0000", b"first"))  # after the open's writes: committed
    for i in range(1, 9):  # 0.8 s of appends, each 0.1 s after the last: no pause of FOLD_AFTER
        await store.append(Checkpoint("t", "", f"{i:04d}", b"x"))
        await asyncio.sleep(0.1)
    assert store.folds == 0, "the log was folded while the appends went on"
    await asyncio.sleep(0.6)
    assert store.folds == 1 and rows_in_file(db, "SELECT count(*) FROM checkpoints") == 9

    monkeypatch.setattr(sqlite, "FOLD_WITHIN", 0.3)  # now the oldest record waits no longer than this
    monkeypatch.setattr(sqlite, "FOLD_AFTER", 3600.0)
    for i in range(9, 25):  # 1.6 s of appends in a row
        await store.append(Checkpoint("t", "", f"{i:04d}", b"x"))
        await asyncio.sleep(0.1)
    assert store.folds >= 2, "a steady stream of appends kept its records from other connections"
    assert rows_in_file(db, "SELECT count(*) FROM checkpoints") >= 10
    await store.aclose()


async def test_appends_to_a_file_deleted_under_them_fail_soon_and_every_one_that_returned_is_kept(
        tmp_path: Path) -> None:
    db = tmp_path / "state.db"
    kept = tmp_path / "kept"
    kept.mkdir()
    store = SqliteCheckpointer(db)
    await store.get("t")
    await store.append(Checkpoint("t", "", "0000", b"first"))
    await store.append(Checkpoint("t", "", "0001", b"in the log"))
    for suffix in ("", "-wal", "-shm"):  # an operator's backup: hard links, then the files go
        os.link(f"{db}{suffix}", kept / f"state.db{suffix}")
        os.unlink(f"{db}{suffix}")
    returned = []
    with pytest.raises(CheckpointerError, match="deleted or replaced"):
        for i in range(2, 2000):  # an append trusts the last check of the file for a few ms at most
            await store.append(Checkpoint("t", "", f"{i:04d}", b"x"))
            returned.append(f"{i:04d}")
            await asyncio.sleep(0.001)
    assert len(returned) < 1998
    await store.aclose()
    for suffix in ("", "-wal", "-shm"):  # restored: the log, still beside it, is folded by the next opener
        os.replace(kept / f"state.db{suffix}", f"{db}{suffix}")
    reopened = SqliteCheckpointer(db)
    ids = {cp.id async for cp in reopened.list("t")}
    assert {"0000", "0001", *returned} <= ids
    await reopened.aclose()


async def test_the_log_folds_every_fold_every_records_and_before_this_stores_own_reads_and_writes(
        tmp_path: Path) -> None:
    db = tmp_path / "state.db"
    store = SqliteCheckpointer(db)
    for i in range(FOLD_EVERY + 1):  # the first commits; the rest, past RESTART_AFTER bytes, are folded
        await store.append(Checkpoint("t", "", f"{i:04d}", b"x" * (RESTART_AFTER // FOLD_EVERY)))
    assert store.folds == 1 and rows_in_file(db, "SELECT count(*) FROM checkpoints") == FOLD_EVERY + 1
    assert store.appends.log is not None and store.appends.log.path.stat().st_size < 100, "the log did not start over"
    await store.append(Checkpoint("t", "", "late", b"y"))
    got = await store.get("t", "", "late")  # this store's read comes after its append
    assert got is not None and got.payload == b"y" and store.folds == 2
    await store.append(Checkpoint("u", "", "1", b"z"))
    await store.delete_thread("u")  # after the append, not before it: the record stays deleted
    await store.aclose()
    assert rows_in_file(db, "SELECT count(*) FROM checkpoints WHERE thread_id='u'") == 0


async def test_a_fold_that_cannot_take_the_lock_fails_the_read_waiting_for_it_and_loses_nothing(tmp_path: Path) -> None:
    db = tmp_path / "locked.db"
    store = SqliteCheckpointer(db, busy_timeout=0.2)
    await store.append(Checkpoint("t", "", "0", b"zero"))
    await store.append(Checkpoint("t", "", "1", b"one"))
    assert store.appends.unfolded, "the append in a row did not go to the log"
    holder = sqlite3.connect(db, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    try:
        with pytest.raises(CheckpointerError, match="locked"):
            await store.get("t", "", "1")
        await asyncio.sleep(FOLD_AFTER * 2)
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    got = await store.get("t", "", "1")
    assert got is not None and got.payload == b"one"
    await store.aclose()
    assert logs(db) == []


async def test_records_piled_up_past_fold_here_at_most_are_folded_on_the_waiting_thread(tmp_path: Path) -> None:
    """Records pile up while a fold waits on the waiting thread (here: for a write lock another
    connection holds). Folded on the loop's thread, 48,000 of them (10,000 processes woken at
    once) stalled every process for 280 ms; past ``FOLD_HERE_AT_MOST`` rows the fold goes to
    the waiting thread, and every record still reaches the file, in order."""
    from ringzero.checkpointers.sqlite.folds import FOLD_HERE_AT_MOST

    db = tmp_path / "pile.db"
    store = SqliteCheckpointer(db)
    await store.append(Checkpoint("t0", "", "first", b"y"))  # the first commits; those in a row go to the log
    holder = sqlite3.connect(db, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")  # the first fold cannot take the lock: it waits on the waiting thread
    total = FOLD_HERE_AT_MOST + 2 * FOLD_EVERY
    for i in range(total):  # no turn of the loop between them: the drain job cannot even start
        await store.append(Checkpoint(f"t{i % 7}", "", f"{i:06d}", b"x" * 10))
    first = store.appends.folding
    assert first is not None and len(first.entries) < FOLD_EVERY * 2 and len(store.appends.unfolded) > FOLD_HERE_AT_MOST
    holder.execute("COMMIT")
    holder.close()
    deadline = asyncio.get_running_loop().time() + 5
    appends = store.appends
    while appends.folding in (None, first) and appends.unfolded and asyncio.get_running_loop().time() < deadline:
        await asyncio.sleep(0.001)  # the first fold commits; the pile's fold (the fold timer's) starts
    pile = store.appends.folding
    assert pile is not None and pile is not first, "the pile was folded on the loop's thread"
    assert len(pile.entries) > FOLD_HERE_AT_MOST and store.writer.slow == 1
    folds = store.folds
    await store.append(Checkpoint("t0", "", "last", b"y"))  # waits in the log for the fold after
    await store.get("t0", "", "last")  # a read of its thread waits for the fold
    assert store.folds == folds + 2 and store.writer.slow == 0 and not store.appends.unfolded
    assert rows_in_file(db, "SELECT count(*) FROM checkpoints WHERE thread_id LIKE 't%'") == total + 2
    await store.append(Checkpoint("t1", "", "after", b"z"))  # and appends go on as before
    await store.aclose()
    assert rows_in_file(db, "SELECT count(*) FROM checkpoints WHERE thread_id LIKE 't%'") == total + 3


async def test_an_append_after_another_write_commits_and_appends_in_a_row_go_to_the_log(tmp_path: Path) -> None:
    """The log pays only where appends come in a row; one between other writes (a woken
    process's ``recv`` record, between its mail and its end) commits as ``put`` does."""
    db = tmp_path / "state.db"
    store = SqliteCheckpointer(db)

    def in_file() -> int:
        return rows_in_file(db, "SELECT count(*) FROM checkpoints WHERE thread_id='t'")

    await store.put(Checkpoint("s", "", "status", b"one"))
    await store.append(Checkpoint("t", "", "0", b"x"))
    assert in_file() == 1 and store.appends.log is None, "an append after a put went to a log"
    await store.append(Checkpoint("t", "", "1", b"x"))
    await store.append(Checkpoint("t", "", "2", b"x"))
    assert in_file() == 1 and len(store.appends.unfolded) == 2, "appends in a row were committed one by one"
    commits = store.commits
    await store.put(Checkpoint("s", "", "status", b"two"))  # the two records go in its transaction
    assert in_file() == 3 and store.folds == 1 and store.commits == commits + 1
    await store.append(Checkpoint("t", "", "3", b"x"))
    assert in_file() == 4 and not store.appends.unfolded and store.commits == commits + 2
    await store.aclose()
    assert logs(db) == []


async def test_in_a_burst_of_appends_after_another_write_only_the_first_commits_and_the_rest_go_to_the_log(
        tmp_path: Path) -> None:
    """1,000 spawns given their pids at once append their records in one turn of the loop,
    right after the commit that claimed their pid block. The first commits as ``put`` does;
    the others go to the log, instead of each waiting a turn for the group commit (and each
    spawn that waits becoming a task: 10,000 spawned at once took 2.22-2.34 s, not 1.93-2.00)."""
    db = tmp_path / "state.db"
    store = SqliteCheckpointer(db)
    await store.put(Checkpoint("s", "", "status", b"one"))
    burst = FOLD_EVERY - 2  # folded only later
    await asyncio.gather(*(store.append(Checkpoint("t", "", f"{i:03d}", b"x")) for i in range(burst)))
    assert rows_in_file(db, "SELECT count(*) FROM checkpoints WHERE thread_id='t'") == 1
    assert len(store.appends.unfolded) == burst - 1, "the appends of the burst waited for the group commit"
    assert [cp.id async for cp in store.list("t")] == [f"{i:03d}" for i in reversed(range(burst))]
    await store.aclose()


async def test_a_read_of_another_thread_leaves_the_log_unfolded_and_a_read_of_its_thread_folds_it(
        tmp_path: Path) -> None:
    """A graph's steps append in a row, each graph on a thread of its own: the read that starts
    the next graph (another thread) must not cost a fold; a read of the appended thread must see it."""
    db = tmp_path / "state.db"
    store = SqliteCheckpointer(db)
    await store.put(Checkpoint("other", "", "1", b"o"))
    await store.append(Checkpoint("t", "", "1", b"one"))  # after a put: committed
    await store.append(Checkpoint("t", "", "2", b"two"))
    await store.append_writes("t", "", "2", [PendingWrite("task", "out", b"w")])
    assert len(store.appends.unfolded) == 2 and store.folds == 0
    other = await store.get("other")
    assert other is not None and other.payload == b"o"
    assert [cp.id async for cp in store.list("other")] == ["1"]
    assert store.folds == 0 and len(store.appends.unfolded) == 2, "a read of another thread folded the log"
    got = await store.get("t")
    assert got is not None and got.id == "2" and [w.value for w in got.writes] == [b"w"] and store.folds == 1
    await store.append(Checkpoint("t", "", "3", b"three"))
    assert [cp.id async for cp in store.list()] == ["3", "2", "1", "1"] and store.folds == 2  # every thread: folds
    await store.aclose()


def write_first_format_log(db: Path, identity: tuple[int, int], row: tuple[bytes | None, ...]) -> None:
    """A log as the first format wrote it: ``RZLOG1``, records of checkpoint rows with no kind."""
    body = struct.pack("!QI", 1, 1)
    for field in row:
        body += struct.pack("!i", -1) if field is None else struct.pack("!i", len(field)) + field
    Path(f"{db}-rzlog-0123456789abcdef").write_bytes(
        b"RZLOG1\n" + struct.pack("!QQ", *identity) + struct.pack("!II", len(body), zlib.crc32(body)) + body)


async def test_a_log_with_a_record_of_an_unknown_kind_is_left_alone(tmp_path: Path) -> None:
    db = tmp_path / "state.db"
    identity = await new_file_identity(db)
    log = AppendLog(db, identity)
    log.append(1, [("t", "", "0", None, b"x", "{}")])
    log.append(2, [("t", "", "1", None, b"y", "{}")], kind=7)  # a kind a later version may add
    log.close(remove=False)
    store = SqliteCheckpointer(db)
    assert [cp async for cp in store.list("t")] == [], "a log this version cannot read was half folded"
    assert logs(db) == [log.path]
    await store.aclose()


async def test_a_log_of_the_first_format_is_still_folded(tmp_path: Path) -> None:
    """Logs written before records had a kind (``RZLOG1``: checkpoint rows only), left by a
    kernel that died, are folded by the next opener as before."""
    db = tmp_path / "state.db"
    identity = await new_file_identity(db)
    write_first_format_log(db, identity, (b"t", b"", b"1", None, b"old format", b"{}"))
    store = SqliteCheckpointer(db)
    got = await store.get("t", "", "1")
    assert got is not None and got.payload == b"old format" and got.parent_id is None
    assert logs(db) == []
    await store.aclose()


@pytest.mark.timeout(120)
async def test_processes_spawned_into_the_log_survive_kill_9_and_the_next_kernel_takes_a_fresh_pid_block(
        tmp_path: Path) -> None:
    db = tmp_path / "idle.db"
    pids = sorted(int(p) for p in (await asyncio.to_thread(host, "idle", str(db), "5")).stdout.split())
    assert pids == [1, 2, 3, 4, 5]
    assert rows_in_file(db, "SELECT count(*) FROM checkpoints WHERE thread_id='ringzero/processes' "
                            "AND namespace=''") < 5, "every process record was committed: this would not test the log"
    assert rows_in_file(db, "SELECT count(*) FROM checkpoints WHERE thread_id='ringzero/pid-blocks'") == 1

    async with Kernel(checkpointer=SqliteCheckpointer(db)) as kernel:
        handles = await kernel.recover()
        assert sorted(h.pid for h in handles) == pids
        fresh = await kernel.spawn(receiver, 1)
        # The dead kernel never handed its block back: the next one starts a block of its own.
        assert fresh.pid == PID_BLOCK
        for handle in [*handles, fresh]:
            await handle.send(f"to {handle.pid}")
        assert sorted([await h.wait(timeout=30) for h in [*handles, fresh]]) == sorted(
            [[f"to {pid}"] for pid in [*pids, PID_BLOCK]])
    async with Kernel(checkpointer=SqliteCheckpointer(db)) as kernel:
        # The kernel before closed and handed its block back: numbering goes on after its last pid.
        assert (await kernel.spawn(receiver, 0)).pid == PID_BLOCK + 1
        assert [r.pid for r in await kernel.ps(all=True)] == [*pids, PID_BLOCK, PID_BLOCK + 1]
    assert logs(db) == []


async def test_a_kernel_taking_a_pid_block_just_handed_back_numbers_on_after_the_pids_used_in_it(
        tmp_path: Path) -> None:
    db = tmp_path / "blocks.db"
    first = Kernel(checkpointer=SqliteCheckpointer(db))
    used = [(await first.spawn(receiver, 0)).pid for _ in range(3)]
    assert used == [1, 2, 3]
    second = Kernel(checkpointer=SqliteCheckpointer(db))
    await second.start()
    assert (await second.spawn(receiver, 0)).pid == PID_BLOCK, "block 0 is the first kernel's while it runs"
    third = Kernel(checkpointer=SqliteCheckpointer(db))
    await third.start()
    reads: list[int] = []
    real_max_pid = third.store.max_pid

    async def max_pid(below: int | None = None) -> int:  # the first read: before the first kernel closed
        reads.append(0 if not reads else await real_max_pid(below))
        return reads[-1]

    third.store.max_pid = max_pid  # type: ignore[method-assign]
    await first.aclose()  # its pids are in the file, then block 0 is free
    assert (await third.spawn(receiver, 0)).pid == 4, "the block's highest pid is read again once it is taken"
    assert reads == [0, 3]
    await second.aclose()
    await third.aclose()


async def test_spawns_at_once_past_pid_blocks_get_dense_pids_in_the_order_they_asked(tmp_path: Path) -> None:
    db = tmp_path / "state.db"
    async with Kernel(checkpointer=SqliteCheckpointer(db)) as kernel:
        claims = 0
        real_claim = kernel.store.claim_pid_block

        async def claim_pid_block(block: int, node: str) -> bool:
            nonlocal claims
            claims += 1
            await asyncio.sleep(0.01)  # a claim that takes a while: spawns pile up behind it
            return await real_claim(block, node)

        kernel.store.claim_pid_block = claim_pid_block  # type: ignore[method-assign]
        kernel.runtime.pids.drop_block()  # no block at hand: every spawn below waits for a claim
        spawns = [asyncio.ensure_future(kernel.spawn(receiver, 0)) for _ in range(2 * PID_BLOCK + 10)]
        pids = [handle.pid for handle in await asyncio.gather(*spawns)]
        assert pids == list(range(1, 2 * PID_BLOCK + 11)), "pids skipped, repeated or out of the order asked"
        assert claims < 10, "one claim a block, however many spawns wait on it"

        async def refused(block: int, node: str) -> bool:
            raise CheckpointerError("the store refused the claim")

        kernel.store.claim_pid_block = refused  # type: ignore[method-assign]
        kernel.runtime.pids.drop_block()  # the next spawn claims a block
        failed = await asyncio.gather(*(kernel.spawn(receiver, 0) for _ in range(3)), return_exceptions=True)
        assert [type(f) for f in failed] == [CheckpointerError] * 3, "a failed claim reaches every spawn waiting on it"
        kernel.store.claim_pid_block = real_claim  # type: ignore[method-assign]
        assert (await kernel.spawn(receiver, 0)).pid > pids[-1]


async def test_a_spawn_cancelled_while_it_waits_for_a_pid_block_takes_no_pid_and_leaves_no_record(
        tmp_path: Path) -> None:
    """A spawn takes its pid from the kernel's block before anything is written, in its caller's
    task: cancelled while it waits for the block's claim, it leaves nothing behind."""
    async with Kernel(checkpointer=SqliteCheckpointer(tmp_path / "state.db")) as kernel:
        release = asyncio.Event()
        real_claim = kernel.store.claim_pid_block

        async def claim_pid_block(block: int, node: str) -> bool:
            await release.wait()
            return await real_claim(block, node)

        kernel.store.claim_pid_block = claim_pid_block  # type: ignore[method-assign]
        spawns = [asyncio.ensure_future(kernel.spawn(receiver, 0)) for _ in range(6)]
        await asyncio.sleep(0.01)
        assert kernel.runtime.pids.waiting == 6, "the spawns do not all wait for the block"
        for cancelled in spawns[::2]:
            cancelled.cancel()
        release.set()
        outcomes = await asyncio.gather(*spawns, return_exceptions=True)
        assert [isinstance(o, asyncio.CancelledError) for o in outcomes] == [True, False] * 3
        assert [o.pid for o in outcomes[1::2]] == [1, 2, 3]  # type: ignore[union-attr]
        assert [r.pid for r in await kernel.ps(all=True)] == [1, 2, 3]


async def test_after_a_failed_log_write_appends_commit_and_nothing_follows_the_torn_record(tmp_path: Path) -> None:
    import errno

    store = SqliteCheckpointer(tmp_path / "full.db")
    await store.append(Checkpoint("t", "", "first", b"x"))
    await store.append(Checkpoint("t", "", "second", b"x"))  # in the log
    assert store.appends.log is not None
    log_size = store.appends.log.size

    def disk_full(data: bytes) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    store.appends.log._write = disk_full  # type: ignore[method-assign]
    with pytest.raises(CheckpointerError, match="writing its append log"):
        await store.append(Checkpoint("t", "", "third", b"x"))
    commits = store.commits
    await store.append(Checkpoint("t", "", "fourth", b"x"))  # committed: the log may end in a torn record
    assert store.commits > commits and store.appends.log.size == log_size
    assert [cp.id async for cp in store.list("t")] == ["second", "fourth", "first"]
    await store.aclose()


async def test_threads_appending_while_the_loop_appends_folds_and_starts_the_log_over_lose_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Four threads append through ``append_here`` (as sandboxes journaling their tool calls do)
    while the loop appends too, folds every ``FOLD_EVERY`` records and starts the log over each
    time it is all folded past a few kilobytes: every record of every thread is in the file
    afterwards, each thread's in the order it wrote them, and none lost to a log started over
    under a record just written."""
    import threading

    from ringzero.checkpointers.sqlite import folds

    monkeypatch.setattr(folds, "RESTART_AFTER", 4096)
    restarts = [0]
    restart = AppendLog.restart

    def counted(log: AppendLog) -> None:
        restarts[0] += 1
        restart(log)

    monkeypatch.setattr(AppendLog, "restart", counted)
    store = SqliteCheckpointer(tmp_path / "many.db")
    await store.append(Checkpoint("loop", "", "00000", b"first"))
    await store.append(Checkpoint("loop", "", "00001", b"second"))  # the log made, appends in a row
    loop_thread, took_here = threading.get_ident(), [0]
    per_thread = 400

    def writer(name: str) -> None:
        for i in range(per_thread):
            row = Checkpoint(name, "", f"{i:05d}", f"{name} {i}".encode(), None if i == 0 else f"{i - 1:05d}")
            if store.append_here(row):
                took_here[0] += 1
            else:  # the store wants the loop for it (a write between): there, waited for
                asyncio.run_coroutine_threadsafe(store.append(row), loop).result(10)
            time.sleep(0.0001)  # a sandbox's calls come a little apart: the threads and the loop interleave

    loop = asyncio.get_running_loop()
    threads = [threading.Thread(target=writer, args=(f"thread-{n}",)) for n in range(4)]
    for thread in threads:
        thread.start()
    i = 2
    while any(thread.is_alive() for thread in threads):
        await store.append(Checkpoint("loop", "", f"{i:05d}", f"loop {i}".encode()))
        if i % 50 == 0:
            await store.put(Checkpoint("other", "", f"{i:05d}", b"a commit between the appends"))
        await asyncio.sleep(0.0002)
        in_the_log_or_lost_at_a_crash(store)
        i += 1
    assert loop_thread != threads[0].ident and took_here[0] > 1000, took_here
    assert restarts[0] >= 1, restarts  # the log started over while the threads appended
    await store.aclose()
    again = SqliteCheckpointer(tmp_path / "many.db")
    for n in range(4):
        rows = [cp async for cp in again.list(f"thread-{n}")]
        assert [cp.payload for cp in reversed(rows)] == [f"thread-{n} {i}".encode() for i in range(per_thread)]
    assert len([cp async for cp in again.list("loop")]) == i
    await again.aclose()


def in_the_log_or_lost_at_a_crash(store: SqliteCheckpointer) -> None:
    """Every record waiting to be folded is in the log file: what a kill -9 now would leave.
    (Called on the loop with nothing awaited between: no fold, no restart of the log, can come
    between what waits and what the file holds.)"""
    from ringzero.checkpointers.sqlite.log import records

    waiting = [(row[0], row[2]) for _, row in list(store.appends.unfolded)]
    log = store.appends.log
    if not waiting or log is None:
        return
    data = log.path.read_bytes()
    in_file = {(row[0], row[2]) for _, _, rows in records(data) for row in rows}
    missing = [key for key in waiting if key not in in_file]
    assert not missing, f"{len(missing)} records waiting to be folded are not in the log: {missing[:3]}"
