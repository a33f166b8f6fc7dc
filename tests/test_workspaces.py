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


LIST = "import os\nsorted(os.listdir(os.environ['RINGZERO_WORKSPACE']))"


def _image_with(folder: Path, name: str, files: dict[str, str]) -> Path:
    """An ext4 image holding ``files``, as another user (or an agent) would make one."""
    import shutil
    import subprocess

    image, source = folder / name, folder / f"{name}.files"
    source.mkdir()
    for file, text in files.items():
        (source / file).write_text(text)
    mkfs = shutil.which("mke2fs") or "/sbin/mke2fs"
    made = subprocess.run([mkfs, "-q", "-F", "-t", "ext4", "-d", str(source), str(image), "4M"],
                          capture_output=True, text=True)
    assert made.returncode == 0, made.stderr
    shutil.rmtree(source)
    return image


async def test_69_an_image_another_user_planted_beside_a_workspace_is_never_mounted(tmp_path: Path) -> None:
    """The image was looked for beside the workspace (``.agent.workspace.ext4``): in a folder
    others may write, another user's image was mounted as the agent's workspace, and that
    user read the agent's files. Now images live in root's folder alone."""
    planted = _image_with(tmp_path, ".agent.workspace.ext4", {"planted.txt": "theirs"})
    os.chown(planted, 65534, 65534)
    executor = ProcessExecutor(workspace=tmp_path / "agent", workspace_bytes=8 << 20, warm=1)
    try:
        seen = await executor.run(LIST, limits=LIMITS)
    finally:
        await executor.aclose()
    assert seen.value == [], seen
    image = ws.image_of(str(tmp_path / "agent"))
    assert os.path.dirname(image) == ws.WORKSPACE_IMAGES and os.stat(image).st_uid == 0
    assert oct(os.stat(image).st_mode & 0o777) == oct(0o600)


async def test_69_a_workspace_inside_another_workspace_is_refused(tmp_path: Path) -> None:
    """An agent wrote an image into its workspace, and a workspace made inside it later mounted
    that image for another agent. Now a workspace inside another's mount is refused."""
    from ringzero.core.contract.errors import InvalidArgument

    outer = ProcessExecutor(workspace=tmp_path / "a", workspace_bytes=8 << 20, warm=1)
    try:
        await outer.run("import os\nos.mkdir(os.environ['RINGZERO_WORKSPACE'] + '/inner')", limits=LIMITS)
        inner = ProcessExecutor(workspace=tmp_path / "a" / "inner", workspace_bytes=8 << 20, warm=1)
        try:
            with pytest.raises(InvalidArgument, match="lies inside the workspace mounted at"):
                await inner.run("1", limits=LIMITS)
        finally:
            await inner.aclose()
    finally:
        await outer.aclose()


def test_69_one_workspace_prepared_by_several_at_once_is_mounted_once(tmp_path: Path) -> None:
    """Two executors preparing one workspace at once raced: double mounts, a damaged image,
    failed starts. Now preparation takes the image's lock, and an attached image is not
    attached again."""
    import threading

    workspace = str(tmp_path / "shared")
    uid = ws.workspace_uid(workspace)
    barrier, outcomes = threading.Barrier(6), []

    def prepare() -> None:
        barrier.wait()
        try:
            outcomes.append(ws.prepare(workspace, uid, max_bytes=8 << 20, max_files=1000))
        except Exception as exc:
            outcomes.append(repr(exc))

    threads = [threading.Thread(target=prepare) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    real = os.path.realpath(workspace)
    mounts = [line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()
              if line.split()[4] == real]
    assert outcomes == [None] * 6, outcomes
    assert len(mounts) == 1, mounts
    assert len(ws._attached(ws.image_of(workspace))) == 1


def test_69_an_image_that_is_not_root_s_alone_is_refused_not_mounted(tmp_path: Path) -> None:
    """Where an image is looked for, a link, or a file of another user's, is refused by name."""
    from ringzero.core.contract.errors import InvalidArgument

    workspace = str(tmp_path / "agent")
    image = ws.image_of(workspace)
    target = tmp_path / "elsewhere"
    target.write_text("root's")
    os.makedirs(ws.WORKSPACE_IMAGES, mode=0o700, exist_ok=True)
    lock = ws.image_of(workspace)[:-len(".ext4")] + ".lock"
    os.mkdir(workspace)
    try:
        Path(lock).write_text(f"{os.path.realpath(workspace)}\n{os.stat(workspace).st_dev}:"
                              f"{os.stat(workspace).st_ino}\n")
        Path(image).symlink_to(target)
        with pytest.raises(InvalidArgument, match="is a link, which is never followed") as refused:
            ws.prepare(workspace, ws.workspace_uid(workspace), max_bytes=8 << 20, max_files=1000)
        assert image in str(refused.value)
    finally:
        ws.forget(workspace)
    assert target.read_text() == "root's" and ws._mounted_from(os.path.realpath(workspace)) is None

