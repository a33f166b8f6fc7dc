"""Issue 52, row 5: a workspace cannot fill the host, and uids never collide. The process
sandbox's workspace is a file system of its own with a quota, and each workspace and each live
run has a uid no other has, however its path hashes and whatever its fork server's pid."""

from __future__ import annotations

import asyncio
import itertools
import os
import zlib
from pathlib import Path

import pytest

from ringzero.core.contract.types import ExecLimits
from ringzero.providers.executors import ProcessExecutor
from ringzero.providers.executors import workspaces as ws

LIMITS = ExecLimits(wall_seconds=60.0)

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="workspaces get a uid and a file system of their own "
                                                          "only where the host runs as root")

FLOOD = ("import os\nws = os.environ['RINGZERO_WORKSPACE']\nwritten = files = 0\nout = {}\n"
         "try:\n    for i in range(268):\n        with open(f'{ws}/big{i}', 'wb') as f:\n"
         "            f.write(b'x' * (1 << 20))\n        written += 1 << 20\nexcept OSError as e:\n"
         "    out['bytes'] = [written, e.errno]\n"
         "try:\n    for i in range(20_005):\n        os.mkdir(f'{ws}/d{i}')\n        files += 1\nexcept OSError as e:\n"
         "    out['files'] = [files, e.errno]\nout")


async def test_5_a_workspace_has_a_quota_its_code_runs_into(tmp_path: Path) -> None:
    """One run wrote 268 MB and 20,005 inodes to the host's disk, kept between runs. Now the
    workspace holds ``workspace_bytes`` in ``workspace_files`` at most: past them the code gets
    ENOSPC (28) and the host's disk holds no more than the workspace's image."""
    workspace = tmp_path / "agent"
    executor = ProcessExecutor(workspace=workspace, workspace_bytes=32 << 20, workspace_files=1000, warm=1)
    try:
        flooded = await executor.run(FLOOD, limits=LIMITS)
        emptied = await executor.run("import os, shutil\nws = os.environ['RINGZERO_WORKSPACE']\n"
                                     "for name in os.listdir(ws):\n    p = f'{ws}/{name}'\n"
                                     "    os.rmdir(p) if os.path.isdir(p) else os.unlink(p)\n"
                                     "many = 0\ntry:\n    for i in range(20_005):\n        os.mkdir(f'{ws}/e{i}')\n"
                                     "        many += 1\nexcept OSError as e:\n    many = [many, e.errno]\nmany",
                                     limits=LIMITS)
        kept = await executor.run("import os\nlen(os.listdir(os.environ['RINGZERO_WORKSPACE']))", limits=LIMITS)
    finally:
        await executor.aclose()
    assert flooded.error is None, flooded
    written, errno = flooded.value["bytes"]
    assert errno == 28 and written <= 32 << 20, flooded.value
    assert flooded.value["files"][1] == 28, flooded.value
    count, errno = emptied.value
    assert errno == 28 and count < 2 * 1000, emptied.value  # the inode quota (mke2fs rounds it up to whole groups)
    assert kept.value == count, "the workspace was not kept between runs"
    assert _on_disk(ws.image_of(str(workspace))) <= 32 << 20, "the image took more of the host's disk than its quota"
    assert executor.missing_controls == {}, executor.missing_controls


def _on_disk(path: str) -> int:
    return os.stat(path).st_blocks * 512


def _colliding(folder: Path) -> tuple[Path, Path]:
    """Two workspace paths in ``folder`` whose crc32 is the same modulo 2**23: the old way of
    picking a workspace's uid gave them one uid (a few thousand names find a pair)."""
    folder = Path(os.path.realpath(folder))
    seen: dict[int, Path] = {}
    for n in itertools.count():
        path = folder / f"agent-{n}"
        key = zlib.crc32(str(path).encode()) % (1 << 23)
        if key in seen:
            return seen[key], path
        seen[key] = path
    raise AssertionError("unreachable")


async def test_5_two_workspaces_whose_paths_collide_under_the_old_hash_get_uids_of_their_own(tmp_path: Path) -> None:
    first, second = _colliding(tmp_path)
    executors = [ProcessExecutor(workspace=path, workspace_bytes=8 << 20, warm=1) for path in (first, second)]
    try:
        uids = [(await executor.run("import os\nos.getuid()", limits=LIMITS)).value for executor in executors]
    finally:
        await asyncio.gather(*(executor.aclose() for executor in executors))
    assert uids[0] != uids[1], f"two workspaces share uid {uids[0]}"
    assert [first.stat().st_uid, second.stat().st_uid] == uids


async def test_5_a_workspace_keeps_its_uid_and_its_files_across_executors(tmp_path: Path) -> None:
    workspace = tmp_path / "agent"
    workspace.mkdir()
    (workspace / "brief.txt").write_text("the host's input")  # a folder that held files before its first use
    first = ProcessExecutor(workspace=workspace, workspace_bytes=8 << 20, warm=1)
    try:
        made = await first.run("import os\nws = os.environ['RINGZERO_WORKSPACE']\n"
                               "open(f'{ws}/notes.txt', 'w').write(open(f'{ws}/brief.txt').read().upper())\n"
                               "os.getuid()", limits=LIMITS)
    finally:
        await first.aclose()
    assert (workspace / "notes.txt").read_text() == "THE HOST'S INPUT"  # the host reads it after the run
    ws.release(str(workspace))
    assert list(workspace.iterdir()) == []  # unmounted: the files are in the image
    again = ProcessExecutor(workspace=workspace, workspace_bytes=8 << 20, warm=1)
    try:
        seen = await again.run("import os\n[sorted(os.listdir(os.environ['RINGZERO_WORKSPACE'])), os.getuid()]",
                               limits=LIMITS)
    finally:
        await again.aclose()
    assert seen.value == [["brief.txt", "notes.txt"], made.value], (seen, made)


def _pid_max() -> int:
    return int(Path("/proc/sys/kernel/pid_max").read_text())


def _next_pid_after(pid: int) -> None:
    """The next process this host starts gets ``pid + 1`` (``kernel.ns_last_pid``, root only)."""
    Path("/proc/sys/kernel/ns_last_pid").write_text(str(pid))


async def test_5_two_fork_servers_2048_pids_apart_hand_out_different_uids() -> None:
    """A run's uid depended on its fork server's pid modulo 2048 and its serial: two servers
    2048 pids apart handed out the same uids, so their runs shared per-uid kernel limits."""
    base = _pid_max() // 2
    executors = []
    try:
        for start in (base, base + 2048):
            for _ in range(5):  # another process on the host may take the pid first: try again
                _next_pid_after(start - 1)
                executor = ProcessExecutor(warm=1)
                await executor.start()
                if executor.servers[0].process.pid == start:
                    break
                await executor.aclose()
            else:
                pytest.skip("the host kept starting other processes: no fork server got the pid asked for")
            executors.append(executor)
        uids = [(await executor.run("import os\nos.getuid()", limits=LIMITS)).value for executor in executors]
    finally:
        await asyncio.gather(*(executor.aclose() for executor in executors))
    assert uids[0] != uids[1], f"two runs of fork servers 2048 pids apart share uid {uids[0]}"
