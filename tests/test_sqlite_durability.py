"""SQLite under real crashes and real concurrency: nothing acknowledged is ever lost."""

from __future__ import annotations

import asyncio
import os
import random
import signal
import sqlite3
import subprocess
import sys
import time
from contextlib import closing
from pathlib import Path

import pytest

from ringzero.checkpointers import SqliteCheckpointer
from ringzero.checkpointers.sqlite.schema import PAGE_SIZE
from tests.heartbeat import heartbeat

ROOT = Path(__file__).resolve().parent.parent


def writer(db: Path, thread: str, count: int) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "tests.checkpoint_writer", str(db), thread, str(count)],
                            cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def crash_once(db: Path, thread: str, rng: random.Random) -> list[str]:
    """Start a writer, kill -9 it at a random moment, return the ids it acknowledged."""
    proc = writer(db, thread, 0)
    assert proc.stdout is not None
    acked = [proc.stdout.readline().strip()]  # at least one put returned
    deadline = time.monotonic() + rng.uniform(0.02, 0.25)
    os.set_blocking(proc.stdout.fileno(), False)
    while time.monotonic() < deadline:
        time.sleep(0.005)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(10)
    os.set_blocking(proc.stdout.fileno(), True)
    acked += [line.strip() for line in proc.stdout.read().splitlines() if line.strip()]
    proc.stdout.close()
    assert proc.stderr is not None
    proc.stderr.close()
    return [a for a in acked if a]


@pytest.mark.timeout(180)
async def test_twenty_kill_9s_lose_no_acknowledged_checkpoint(tmp_path: Path) -> None:
    db = tmp_path / "crash.db"
    rng = random.Random(20261122)
    for round_ in range(20):
        thread = f"round-{round_}"
        acked = await asyncio.to_thread(crash_once, db, thread, rng)
        store = SqliteCheckpointer(db)
        stored = {c.id: c async for c in store.list(thread)}
        missing = [cid for cid in acked if cid not in stored]
        assert not missing, f"round {round_}: {len(missing)} acknowledged checkpoints lost, e.g. {missing[:3]}"
        for cid in acked:
            got = await store.get(thread, "", cid)
            assert got is not None and got.payload.endswith(cid.encode()) and [w.value for w in got.writes] == [
                cid.encode()]
        await store.aclose()
        with closing(sqlite3.connect(db)) as conn, conn:  # closed, not only committed
            assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"


@pytest.mark.timeout(120)
async def test_two_processes_writing_one_file_at_once_lose_nothing(tmp_path: Path) -> None:
    db = tmp_path / "shared.db"
    procs = [writer(db, name, 300) for name in ("alpha", "beta")]
    outputs = await asyncio.gather(*(asyncio.to_thread(p.communicate) for p in procs))
    assert [p.returncode for p in procs] == [0, 0], outputs
    store = SqliteCheckpointer(db)
    for name in ("alpha", "beta"):
        ids = [c.id async for c in store.list(name)]
        assert len(ids) == 300 and ids[0] == f"{299:08d}"
    await store.aclose()


async def test_concurrent_writes_share_commits_and_a_bad_one_fails_alone(tmp_path: Path) -> None:
    from ringzero.core.contract.errors import CheckpointerError
    from ringzero.core.contract.types import Checkpoint

    store = SqliteCheckpointer(tmp_path / "group.db")
    await store.put(Checkpoint("warm", "", "0", b"x"))
    before = store.commits
    good = [store.put(Checkpoint("g", "", f"{i:04d}", b"v")) for i in range(200)]
    bad = store.put(Checkpoint("g", "", "bad", b"v", metadata={"x": 1}))
    bad_writes = store.put_writes("g", "", "bad", [])  # an empty batch is fine, and is not an error
    results = await asyncio.gather(*good, bad, bad_writes, return_exceptions=True)
    assert not [r for r in results if isinstance(r, BaseException)]
    assert store.commits - before < 200, "200 concurrent puts were not grouped"
    assert len([c async for c in store.list("g")]) == 201
    # A write the store rejects (NOT NULL payload) fails alone; writes grouped with it land,
    # those that ran before it in the batch (and were rolled back with it) as well as after.
    # The first write of the turn commits at once (``Turns``); the four after it are one batch.
    opener = store.put(Checkpoint("g", "", "opener", b"v"))
    first = store.put(Checkpoint("g", "", "before", b"v"))
    claimed = store.claim(Checkpoint("g", "", "claimed", b"v"))
    rejected = store.put(Checkpoint("g", "", "rejected", None))  # type: ignore[arg-type]
    fine = store.put(Checkpoint("g", "", "after", b"v"))
    before_batch = store.commits
    opened, *outcome = await asyncio.gather(opener, first, claimed, rejected, fine, return_exceptions=True)
    assert opened is None
    assert store.commits == before_batch + 2, "the four writes were not one batch: the test would prove nothing"
    assert outcome[0] is None and outcome[1] is True and outcome[3] is None, outcome
    assert isinstance(outcome[2], CheckpointerError) and "NOT NULL" in str(outcome[2])
    assert await store.get("g", "", "rejected") is None
    assert all([await store.get("g", "", key) for key in ("before", "claimed", "after")])
    assert await store.claim(Checkpoint("g", "", "claimed", b"w")) is False  # it counted once, and is taken
    await store.aclose()


def test_kernels_in_two_processes_on_one_file_never_share_a_pid(tmp_path: Path) -> None:
    import json

    from ringzero.core.contract.store import KernelStore

    db = str(tmp_path / "shared.db")
    runs = [subprocess.Popen([sys.executable, "-m", "tests.pid_spawner", db, "40", tag], cwd=ROOT,
                             env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True) for tag in ("a", "b")]
    outputs = [run.communicate(timeout=120) for run in runs]
    assert all(run.returncode == 0 for run in runs), [err for _, err in outputs]
    first, second = (set(json.loads(out.strip().splitlines()[-1])) for out, _ in outputs)
    assert len(first) == len(second) == 40 and not first & second, "two kernels handed out the same pid"

    async def names() -> list[str]:
        store = SqliteCheckpointer(db)
        records = await KernelStore(store).load_processes()
        await store.aclose()
        return sorted(r.name for r in records)

    assert asyncio.run(names()) == sorted(f"{tag}-{i}" for tag in ("a", "b") for i in range(40))


async def test_a_write_lock_held_by_another_connection_hands_writes_off_without_stalling_the_loop(
        tmp_path: Path) -> None:
    """The loop-thread write path never waits for a lock: while another connection (another
    process, to SQLite) holds the write lock, writes wait on the waiting thread, the loop keeps
    running, and once the lock is free every write lands, in the order written."""
    from ringzero.core.contract.types import Checkpoint

    db = tmp_path / "locked.db"
    store = SqliteCheckpointer(db, busy_timeout=10)
    await store.put(Checkpoint("t", "", "0000", b"first"))
    other = sqlite3.connect(db, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")  # the write lock, held
    async with heartbeat(0.01) as beats:
        writes = asyncio.gather(*(store.put(Checkpoint("t", "", f"{i:04d}", f"v{i}".encode()))
                                  for i in range(1, 30)),
                                store.put(Checkpoint("t", "", "0001", b"last word")))
        await asyncio.sleep(0.3)
        assert not writes.done(), "a write returned while another connection held the write lock"
        assert beats.count >= 10, f"the loop stalled while the lock was held ({beats.count} beats in 0.3 s)"
        other.execute("COMMIT")
        await asyncio.wait_for(writes, 10)
    assert (await store.get("t", "", "0001")).payload == b"last word"  # type: ignore[union-attr]
    assert len([c async for c in store.list("t")]) == 30
    await store.put(Checkpoint("t", "", "0100", b"after"))  # and the fast path is back
    assert store.writer.slow == 0
    await store.aclose()
    other.close()


async def test_wal_checkpoints_run_off_the_loop_and_keep_the_wal_bounded(tmp_path: Path) -> None:
    from ringzero.checkpointers.sqlite.wal import CHECKPOINT_EVERY
    from ringzero.core.contract.types import Checkpoint

    db = tmp_path / "wal.db"
    store = SqliteCheckpointer(db)
    wal = db.with_name(db.name + "-wal")
    for i in range(CHECKPOINT_EVERY * 8):  # about two pages a commit: 16,000 pages without a restart
        await store.put(Checkpoint("t", "", f"{i:06d}", b"x" * 200))
    deadline = time.monotonic() + 10
    while store.writer.wal.runs < 2 and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    assert store.writer.wal.runs >= 2  # a slow machine may merge requests that come while one runs
    wal_pages = (wal.stat().st_size - 32) // (PAGE_SIZE + 24)  # frames; the file keeps its largest size
    assert wal_pages < CHECKPOINT_EVERY * 8, f"the WAL grew to {wal_pages} pages: checkpoints did not let it restart"
    assert len([c async for c in store.list("t")]) == CHECKPOINT_EVERY * 8
    await store.aclose()


async def test_the_append_logs_folds_count_their_rows_toward_a_wal_checkpoint(tmp_path: Path) -> None:
    """A fold commits 64 rows or more at once: counted as one commit, 8,000 appended rows made
    126 commits and no checkpoint, and the WAL grew by every page of them (108 MB here, past
    60 MB in a LangGraph benchmark).

    The rows go in rounds of ``CHECKPOINT_EVERY``, each waiting for the checkpoint it is owed,
    so that the WAL's size depends on the counting and not on how fast this machine's disk
    syncs: written without pause, the WAL holds whatever was written while a checkpoint ran
    (12,181 pages once on a slow CI machine)."""
    from ringzero.checkpointers.sqlite.wal import CHECKPOINT_EVERY
    from ringzero.core.contract.types import Checkpoint

    db = tmp_path / "wal.db"
    store = SqliteCheckpointer(db)
    wal = db.with_name(db.name + "-wal")
    rounds = 8
    for owed in range(1, rounds + 1):
        for i in range((owed - 1) * CHECKPOINT_EVERY, owed * CHECKPOINT_EVERY):
            await store.append(Checkpoint(f"t{i % 97}", "", f"{i:06d}", b"x" * 1000))
        deadline = time.monotonic() + 10
        while store.writer.wal.runs < owed and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        runs = store.writer.wal.runs
        assert runs >= owed, (f"{owed * CHECKPOINT_EVERY} rows folded and {runs} checkpoints: "
                                         "folds of 64 rows each were counted as one commit toward a checkpoint")
    # a round: 15 folds of 64 rows or more, and a timer's of the rest
    assert store.commits < rounds * CHECKPOINT_EVERY // 64 * 2
    wal_pages = (wal.stat().st_size - 32) // (PAGE_SIZE + 24)
    # these rows land all over the B-tree, several pages each: 3,885 pages (a round's, 4 KiB pages) with a
    # checkpoint each round, 27,700 with no restart (measured)
    assert wal_pages < CHECKPOINT_EVERY * 8, f"the WAL grew to {wal_pages} pages between checkpoints"
    await store.aclose()


async def test_writes_keep_off_the_write_lock_while_a_restart_checkpoint_wants_it(tmp_path: Path) -> None:
    """The RESTART checkpoint takes the write lock ahead of this process's writers: left to
    SQLite's busy handler, it lost the lock to the loop's commits for 150 ms and more while the
    WAL grew. Meanwhile a write waits in line on the waiting thread, and commits once it is over."""
    from ringzero.core.contract.types import Checkpoint

    store = SqliteCheckpointer(tmp_path / "restart.db")
    await store.put(Checkpoint("t", "", "000000", b"first"))
    wal = store.writer.wal
    wal._restarted.clear()
    wal.restarting = True  # as the checkpoint thread does before its RESTART
    write = asyncio.ensure_future(store.put(Checkpoint("t", "", "000001", b"second")))
    await asyncio.sleep(0.2)
    assert not write.done(), "a write committed on the loop's thread while the RESTART checkpoint wanted the lock"
    assert store.writer.slow == 1
    wal.restarting = False
    wal._restarted.set()
    await asyncio.wait_for(write, 5)
    assert store.writer.slow == 0
    assert [c.id async for c in store.list("t")] == ["000001", "000000"]
    await store.aclose()


@pytest.mark.perf
async def test_writers_go_back_to_the_fast_path_once_a_held_lock_is_let_go(tmp_path: Path) -> None:
    """While another connection holds the write lock, writes wait in line on the waiting thread;
    once it lets go, they commit on the loop's thread again, even under steady load from many
    writers (a round trip to the thread per write kept some in flight at every moment, so the
    writes never went back: about 100 µs more each; 1,951 round trips here before, 1 now)."""
    from ringzero.core.contract.types import Checkpoint

    db = tmp_path / "lock.db"
    store = SqliteCheckpointer(db)
    await store.put(Checkpoint("t", "", "000000", b"first"))
    drains = 0
    drain = store.writer.drain

    def counted(*args: object, **kwargs: object) -> bool:
        nonlocal drains
        drains += 1
        return drain(*args, **kwargs)  # type: ignore[arg-type]

    store.writer.drain = counted  # type: ignore[method-assign]
    holder = sqlite3.connect(db, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")  # another process's writer, holding the lock

    async def writer(n: int) -> None:
        for i in range(40):
            await store.put(Checkpoint("t", "", f"{n:03d}{i:03d}", b"x" * 100))

    writers = asyncio.gather(*(writer(n) for n in range(1, 51)))
    await asyncio.sleep(0.05)
    holder.execute("COMMIT")  # let go
    await writers
    holder.close()
    assert len([c async for c in store.list("t")]) == 1 + 50 * 40
    assert store.writer.slow == 0
    assert drains < 20, f"{drains} round trips to the waiting thread for 2,000 writes"
    await store.aclose()


async def test_eight_instances_opening_one_new_file_at_once_all_open(tmp_path: Path) -> None:
    """Eight kernels started together on one new file (the claim race of the checkpointer kit):
    while one switches the file to WAL, another's first read of the schema must wait, not fail
    with "database is locked". Each round is a new file; one round in twenty failed before."""
    for round_ in range(100):
        db = tmp_path / f"new-{round_}.db"
        stores = [SqliteCheckpointer(db) for _ in range(8)]
        try:
            assert await asyncio.gather(*(store.get("t", "", "1") for store in stores)) == [None] * 8
        finally:
            await asyncio.gather(*(store.aclose() for store in stores))
