"""The red-team table of issue 12, one line per attack, on every isolating executor this host
starts (Monty, the process sandbox, microVMs where they boot). Each attack states what
"contained" means as an observable value, so that no test passes because the sandbox merely
crashed; where a kill *is* the containment (a memory cap), a control run shows the same code
succeeds under a looser limit. Network attempts target only servers this file starts on
127.0.0.1 or in its own temporary directory."""

from __future__ import annotations

import asyncio
import ctypes
import functools
import os
import socket
import stat
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

import ringzero
from ringzero.core.contract.protocols import Executor
from ringzero.core.contract.types import ExecLimits, ExecResult
from tests import cpu_tools
from tests.executors import (
    full_cpython_only,
    sandbox_calling_tools,  # noqa: F401 - the `sandbox` fixture here: Monty answering tools in its thread too
)
from tests.heartbeat import bystander, heartbeat

LIMITS = ExecLimits(wall_seconds=5.0, memory_bytes=256 * 1024 * 1024, output_bytes=64 * 1024)
LIBC = "import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\nlibc.syscall.restype = ctypes.c_long\n"


def kind(sandbox: Executor) -> str:
    return sandbox.capabilities.isolation


def monty_refused(result: ExecResult) -> bool:
    """Monty has no ctypes, os.fork, sockets or files: the import or call itself fails."""
    return result.error is not None and result.error.type in ("ModuleNotFoundError", "AttributeError",
                                                              "PermissionError", "NameError")


@dataclass(frozen=True)
class Attack:
    row: str
    code: str
    contained: Callable[[ExecResult], bool]  # for the sandboxes that run full CPython

    def __str__(self) -> str:
        return self.row


ATTACKS = [
    Attack("1 clone(CLONE_NEWUSER|CLONE_NEWNET) fails with EPERM",
           LIBC + "r = libc.syscall(56, 0x50000000 | 17, 0, 0, 0, 0)\nif r == 0:\n    os._exit(0)\n"
                  "[r, ctypes.get_errno()]", lambda r: r.value == [-1, 1]),
    Attack("1 unshare(CLONE_NEWUSER) fails with EPERM",
           LIBC + "[libc.syscall(272, 0x10000000), ctypes.get_errno()]", lambda r: r.value == [-1, 1]),
    Attack("1 clone3 is ENOSYS (its flags are out of a filter's sight; libc falls back to clone)",
           LIBC + "[libc.syscall(435, 0, 0), ctypes.get_errno()]", lambda r: r.value == [-1, 38]),
    Attack("1 the x32 syscall table is refused (getpid | __X32_SYSCALL_BIT)",
           LIBC + "[libc.syscall(0x40000000 + 39), ctypes.get_errno()]", lambda r: r.value == [-1, 1]),
    Attack("1 the i386 syscall table is refused (int 0x80 getpid returns -EPERM, not a pid)",
           "import ctypes, mmap\nbuf = mmap.mmap(-1, 4096, prot=7)\n"
           "buf.write(bytes([0xb8, 20, 0, 0, 0, 0xcd, 0x80, 0xc3]))\n"
           "ctypes.CFUNCTYPE(ctypes.c_long)(ctypes.addressof(ctypes.c_char.from_buffer(buf)))()",
           lambda r: r.value == -1),
    Attack("7 modify_ldt, vmsplice, fanotify_mark, clock_adjtime, pidfd_open, memfd_secret, statmount and "
           "listmount fail with EPERM",
           LIBC + "out = []\nfor nr, args in ((154, (0, 0, 0)), (278, (-1, 0, 0, 0)), (301, (-1, 0, 0, -1, 0)), "
                  "(305, (0, 0)), (434, (1, 0)), (447, (0,)), (457, (0, 0, 0, 0)), (458, (0, 0, 0, 0))):\n"
                  "    out.append([libc.syscall(nr, *args), ctypes.get_errno()])\nout",
           lambda r: r.value == [[-1, 1]] * 8),
    Attack("1 a vsock (which no network namespace isolates from a VM's host) cannot be created",
           "import socket\ntry:\n    socket.socket(40, socket.SOCK_STREAM)\n    out = 'created'\nexcept OSError as e:\n"
           "    out = e.errno\nout", lambda r: r.value == 97),
    Attack("3 the host's SysV shared memory is invisible (own IPC namespace)",
           LIBC + "[libc.shmget(HOST_SHM_KEY, 0, 0), ctypes.get_errno()]", lambda r: r.value == [-1, 2]),
    Attack("4 no capability is left, effective or permitted",
           "s = open('/proc/self/status').read()\n"
           "[l.split()[1] for l in s.splitlines() if l[:6] in ('CapEff', 'CapPrm')]",
           lambda r: r.value == ["0000000000000000", "0000000000000000"]),
    Attack("4/11 no host path exists to stat, read or watch (private root)",
           "import os\n[p for p in HOST_PATHS if os.path.lexists(p)]", lambda r: r.value == []),
    Attack("11 inotify on a host directory finds nothing to watch",
           LIBC + "fd = libc.inotify_init1(0)\n"
                  "[libc.inotify_add_watch(fd, HOST_DIR.encode(), 0xfff), ctypes.get_errno()]",
           lambda r: r.value == [-1, 2]),
    Attack("12 /proc shows the run's own processes and mounts, not the host's",
           "import os\n[sorted(p for p in os.listdir('/proc') if p.isdigit()),\n"
           " '/sys/fs/cgroup' in open('/proc/self/mountinfo').read()]",
           lambda r: r.value is not None and r.value[0] == ["1"] and r.value[1] is False),
    Attack("12 ctypes loads and calls libc, but only what the filter allows",
           LIBC + "[libc.getpid(), libc.syscall(101, 16, 1, 0, 0), ctypes.get_errno()]",  # ptrace(ATTACH, init)
           lambda r: r.value == [1, -1, 1]),
]


def existing_paths(*paths: str) -> list[str]:
    return [p for p in paths if os.path.lexists(p)]


@pytest.fixture(scope="module")
def host_shm() -> Iterator[int]:
    """A SysV shared-memory segment of the host's, with a key the sandbox is told."""
    libc = ctypes.CDLL(None, use_errno=True)
    key = 0x525A3031
    shmid = libc.shmget(key, 4096, 0o1666)  # IPC_CREAT | 0666: anyone in this IPC namespace could attach
    assert shmid >= 0, os.strerror(ctypes.get_errno())
    yield key
    libc.shmctl(shmid, 0, None)  # IPC_RMID


@pytest.mark.parametrize("attack", ATTACKS, ids=str)
async def test_attack_is_contained(sandbox: Executor, attack: Attack, host_shm: int, tmp_path: Path) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("host secret")
    host_paths = existing_paths(str(secret), "/run", "/etc/shadow", "/etc/passwd", "/var/log", "/home", "/sys",
                                str(Path.home() / ".bashrc"), "/root/.cache")
    assert len(host_paths) >= 4
    inputs = {"HOST_SHM_KEY": host_shm, "HOST_FILE": str(secret), "HOST_DIR": str(tmp_path), "HOST_PATHS": host_paths}
    result = await sandbox.run(attack.code, inputs=inputs, limits=LIMITS)  # type: ignore[arg-type]
    if kind(sandbox) == "interpreter":
        assert monty_refused(result), result
    else:
        assert attack.contained(result), result
    assert (await sandbox.run("21 * 2")).value == 42, "the executor did not serve the next run"


@pytest.fixture
def unix_servers(tmp_path: Path) -> Iterator[tuple[list[str], list[bytes]]]:
    """Two unix-socket servers of the host: a 0777 socket in a world-readable directory and one
    inside a root-only 0700 directory. Whatever reaches them is recorded."""
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    received: list[bytes] = []
    servers = []
    for path in (tmp_path / "open.sock", private / "hidden.sock"):
        server = socket.socket(socket.AF_UNIX)
        server.bind(str(path))
        os.chmod(path, 0o777)
        server.listen()
        server.settimeout(0.2)
        servers.append((server, str(path)))
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            for server, _ in servers:
                try:
                    conn, _ = server.accept()
                except OSError:
                    continue
                with conn:
                    received.append(conn.recv(1024))

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield [p for _, p in servers], received
    stop.set()
    thread.join(2)
    for server, _ in servers:
        server.close()


async def test_2_host_unix_sockets_are_out_of_reach(sandbox: Executor,
                                                   unix_servers: tuple[list[str], list[bytes]]) -> None:
    paths, received = unix_servers
    code = ("import socket\nout = []\nfor p in paths:\n    s = socket.socket(socket.AF_UNIX)\n    try:\n"
            "        s.connect(p)\n        s.sendall(b'exfiltrated')\n        out.append('connected')\n"
            "    except OSError as e:\n        out.append(type(e).__name__)\nout")
    result = await sandbox.run(code, inputs={"paths": paths}, limits=LIMITS)
    if kind(sandbox) == "interpreter":
        assert monty_refused(result), result
    else:
        assert result.value == ["FileNotFoundError", "FileNotFoundError"], result
    assert received == []


def host_shmem_bytes() -> int:
    with open("/proc/meminfo") as meminfo:
        return next(int(line.split()[1]) * 1024 for line in meminfo if line.startswith("Shmem:"))


@full_cpython_only  # Monty has no SysV IPC to leave behind
async def test_3_ipc_left_by_one_run_is_gone_for_the_next_and_its_memory_freed(sandbox: Executor) -> None:
    key, size = 0x525A3032, 64 << 20
    before = host_shmem_bytes()
    make = LIBC + (f"shmid = libc.shmget({key}, {size}, 0o1666)\nlibc.shmat.restype = ctypes.c_void_p\n"
                   f"ctypes.memset(libc.shmat(shmid, None, 0), 1, {size})\nshmid >= 0")
    assert (await sandbox.run(make, limits=LIMITS)).value is True
    look = LIBC + f"[libc.shmget({key}, 0, 0), ctypes.get_errno()]"
    assert (await sandbox.run(look, limits=LIMITS)).value == [-1, 2], "a later run saw the earlier run's segment"
    for _ in range(100):  # the namespace is torn down asynchronously after the run's init is killed
        if host_shmem_bytes() - before < size // 2:
            break
        await asyncio.sleep(0.05)
    assert host_shmem_bytes() - before < size // 2, "the segment's memory outlived its run"


# ------------------------------------------------------------------ limits for the whole run (rows 5, 6, 11)
# Monty cannot fork, write files or reach its channel: these rows are about full CPython.
HOLD_FORKS = ("import os, time\nkids = []\nfor i in range(5):\n    pid = os.fork()\n    if pid == 0:\n"
              "        try:\n            data = b'x' * (MB << 20)\n            time.sleep(1.0)\n"
              "            os._exit(0)\n"
              "        except MemoryError:\n            os._exit(3)\n    kids.append(pid)\n"
              "sum(1 for k in kids if os.waitpid(k, 0)[1] == 0)")


@full_cpython_only
async def test_5_memory_is_capped_for_the_whole_run_not_per_process(sandbox: Executor) -> None:
    control = await sandbox.run(HOLD_FORKS, inputs={"MB": 20}, limits=LIMITS)
    assert control.value == 5, f"five 20 MiB children should fit in 256 MiB: {control}"
    result = await sandbox.run(HOLD_FORKS, inputs={"MB": 100}, limits=LIMITS)
    # Five 100 MiB children each fit a per-process cap; together they exceed the run's 256 MiB.
    held = result.value if result.error is None else 0
    assert isinstance(held, int) and held <= 2, result
    assert (await sandbox.run("21 * 2")).value == 42


async def test_5_6_the_scratch_is_capped_in_bytes_and_files_for_the_whole_run() -> None:
    from ringzero.providers.executors import ProcessExecutor

    executor = ProcessExecutor(file_bytes=32 << 20, max_files=4000, warm=1)
    try:
        fill = ("written = 0\ntry:\n    for i in range(8):\n        with open(f'f{i}', 'wb') as f:\n"
                "            f.write(b'x' * (8 << 20))\n        written += 8 << 20\nexcept OSError as e:\n"
                "    written = [written, e.errno]\nwritten")
        result = await executor.run(fill, limits=LIMITS)
        assert result.value == [32 << 20, 28], result  # ENOSPC once 32 MiB is used, though each file is small
        inodes = ("import os\nn = 0\ntry:\n    while True:\n        os.mkdir(f'd{n}')\n        n += 1\n"
                  "except OSError as e:\n    n = [n < 4000, e.errno]\nn")
        assert (await executor.run(inodes, limits=LIMITS)).value == [True, 28]
        deep = "import os\nn = 0\nfor _ in range(3000):\n    os.mkdir('d')\n    os.chdir('d')\n    n += 1\nn"
        assert (await executor.run(deep, limits=LIMITS)).value == 3000
        assert (await executor.run("21 * 2")).value == 42, "the executor did not serve the next run"
    finally:
        await executor.aclose()


def test_6_a_deep_hostile_tree_is_removed_without_recursion_or_following_links(tmp_path: Path) -> None:
    from ringzero.providers.executors.process import remove_tree

    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.txt").write_text("the host's")
    tree = tmp_path / "scratch"
    tree.mkdir()
    (tree / "file").write_text("x")
    fd = os.open(tree, os.O_RDONLY | os.O_DIRECTORY)
    for _ in range(3000):  # deeper than PATH_MAX: only directory descriptors reach the bottom
        os.mkdir("d", dir_fd=fd)
        deeper = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
        os.close(fd)
        fd = deeper
    os.symlink(outside, "link", dir_fd=fd)
    os.close(fd)
    remove_tree(str(tree))
    assert not tree.exists()
    assert (outside / "keep.txt").read_text() == "the host's"


async def test_6_a_fork_server_that_dies_is_restarted() -> None:
    import signal

    from ringzero.providers.executors import ProcessExecutor

    executor = ProcessExecutor(warm=1)
    try:
        assert (await executor.run("1")).value == 1
        [server] = executor.servers
        os.kill(server.process.pid, signal.SIGKILL)
        await server.process.wait()
        assert (await executor.run("21 * 2")).value == 42
        assert [s.alive for s in executor.servers] == [True] and executor.servers[0] is not server
    finally:
        await executor.aclose()


@full_cpython_only
async def test_11_another_runs_processes_do_not_use_up_this_runs_process_limit(sandbox: Executor) -> None:
    hold = ("import os, time\nkids = []\nfor _ in range(29):\n    pid = os.fork()\n    if pid == 0:\n"
            "        time.sleep(2)\n        os._exit(0)\n    kids.append(pid)\n"
            "[os.waitpid(k, 0) and 1 for k in kids].count(1)")
    forks = ("import os, time\ntime.sleep(0.5)\nok = 0\nfor _ in range(5):\n    pid = os.fork()\n    if pid == 0:\n"
             "        os._exit(0)\n    ok += os.waitpid(pid, 0)[1] == 0\nok")
    held, other = await asyncio.gather(sandbox.run(hold, limits=LIMITS), sandbox.run(forks, limits=LIMITS))
    assert held.value == 29, held
    assert other.value == 5, other


# ------------------------------------------------------------------ what the host accepts from a sandbox (7, 9)
FIND_CHANNEL = ("import os, stat\nchannel = [fd for fd in range(3, 64) if _is_socket(fd)]\n")
IS_SOCKET = ("def _is_socket(fd):\n    try:\n        return stat.S_ISSOCK(os.fstat(fd).st_mode)\n"
             "    except OSError:\n        return False\n")


@full_cpython_only
async def test_7_an_oversized_message_is_refused_from_its_header(sandbox: Executor) -> None:
    code = ("import os, stat, struct\n" + IS_SOCKET + FIND_CHANNEL +
            "for fd in channel:\n    os.write(fd, struct.pack('!I', 32 << 20) + b'[' * (1 << 20))\n")
    result = await sandbox.run(code, limits=LIMITS)
    assert result.error is not None and result.error.type == "SandboxProtocolError", result
    assert result.error.origin == "executor" and "limit" in result.error.message


@full_cpython_only
async def test_7_a_done_forged_by_a_forked_process_is_refused(sandbox: Executor) -> None:
    code = ("import os, stat, json, struct, time\n" + IS_SOCKET + FIND_CHANNEL +
            "spare = [os.dup(fd) for fd in channel]\nif os.fork() == 0:\n"
            "    body = json.dumps({'op': 'done', 'value': 'forged', 'stdout': 'fake', 'error': None}).encode()\n"
            "    for fd in spare:\n        os.write(fd, struct.pack('!I', len(body)) + body)\n    os._exit(0)\n"
            "time.sleep(1)\n'the real value'")
    result = await sandbox.run(code, limits=LIMITS)
    assert result.value != "forged" and result.stdout != "fake"
    assert result.error is not None and result.error.type == "SandboxProtocolError", result
    assert "only process" in result.error.message


async def test_7_the_final_value_obeys_output_bytes(sandbox: Executor) -> None:
    result = await sandbox.run("'x' * 20_000", limits=ExecLimits(wall_seconds=5, output_bytes=1000))
    assert result.value is None and result.error is not None and result.error.type == "OutputLimitExceeded", result


async def test_7_a_final_value_of_exactly_output_bytes_passes_and_one_byte_more_is_refused(sandbox: Executor) -> None:
    limits = ExecLimits(wall_seconds=5, output_bytes=1000)
    at_limit = await sandbox.run("'x' * 998", limits=limits)  # 1,000 bytes of JSON, quotes included
    assert at_limit.error is None and at_limit.value == "x" * 998, at_limit
    over = await sandbox.run("'x' * 999", limits=limits)
    assert over.value is None and over.error is not None and over.error.type == "OutputLimitExceeded", over


@full_cpython_only
async def test_7_a_forged_done_one_byte_over_output_bytes_is_refused_by_the_host(sandbox: Executor) -> None:
    """The sandbox's own runner applies ``output_bytes`` too; code that writes its ``done``
    itself skips it, and meets the host's check."""
    code = ("import os, stat, json, struct, time\n" + IS_SOCKET + FIND_CHANNEL +
            "value = json.dumps('x' * 999).encode()\n"
            "body = json.dumps({'op': 'done', 'error': None, 'data': [len(value), 0]}).encode()\n"
            "for fd in channel:\n"
            "    os.write(fd, struct.pack('!I', len(body)) + body + struct.pack('!I', len(value)) + value"
            " + struct.pack('!I', 0))\n"
            "time.sleep(5)\n")
    result = await sandbox.run(code, limits=ExecLimits(wall_seconds=5, output_bytes=1000))
    assert result.value is None and result.error is not None, result
    assert result.error.type == "OutputLimitExceeded" and result.error.origin == "executor", result
    assert "1001 bytes" in result.error.message, result


async def test_7_only_the_executor_can_report_its_own_timeout(sandbox: Executor) -> None:
    faked = await sandbox.run("raise TimeoutError('the run took longer than 5 s and was killed')", limits=LIMITS)
    assert faked.error is not None and faked.error.type == "TimeoutError" and faked.error.origin == "code"
    real = await sandbox.run("while True:\n    pass", limits=ExecLimits(wall_seconds=0.5))
    assert real.error is not None and real.error.type == "TimeoutError" and real.error.origin == "executor"


DEEP = "x = []\nfor _ in range(5000):\n    x = [x]\n"


async def test_9_deep_values_become_errors_never_host_exceptions(sandbox: Executor) -> None:
    def echo(value: object) -> object:
        return value

    final = await sandbox.run(DEEP + "x", limits=LIMITS)
    assert final.value is None and final.error is not None, final
    passed = await sandbox.run(DEEP + "try:\n    echo(x)\n    out = 'sent'\nexcept Exception as e:\n"
                               "    out = type(e).__name__\nout", tools={"echo": echo}, limits=LIMITS)
    assert passed.value in ("ValueError", "RecursionError"), passed
    with pytest.raises(Exception, match="nests"):
        await sandbox.run("1", inputs={"x": _nested(500)})


def _nested(depth: int) -> list[object]:
    value: list[object] = []
    for _ in range(depth):
        value = [value]
    return value


# ------------------------------------------------------------------ host tools (10, 12)
async def test_10_a_blocking_sync_tool_neither_freezes_the_host_nor_outlives_the_wall_limit(
        sandbox: Executor) -> None:
    import threading

    release = threading.Event()

    def slow(x: int) -> int:
        release.wait(30)  # blocks until the test ends: the result cannot wait for it
        return x

    async with heartbeat(0.05) as beats:
        try:
            result = await sandbox.run("slow(1)", tools={"slow": slow}, limits=ExecLimits(wall_seconds=1.0))
        finally:
            release.set()
    assert result.error is not None and result.error.type == "TimeoutError", result
    assert beats.count > 0, "the host's event loop was frozen while the tool blocked"


async def test_10_oversized_tool_arguments_and_results_are_refused_before_the_host_keeps_them(
        sandbox: Executor) -> None:
    def take(data: str) -> int:
        return len(data)

    def give() -> str:
        return "y" * (2 << 20)

    code = ("out = []\nfor _ in range(15):\n    try:\n        take('x' * 20_000_000)\n        out.append('kept')\n"
            "    except ValueError:\n        out.append('refused')\ntry:\n    give()\nexcept ValueError:\n"
            "    out.append('refused')\nout")
    result = await sandbox.run(code, tools={"take": take, "give": give}, limits=ExecLimits(wall_seconds=20))
    assert result.value == ["refused"] * 16, result
    kept = sum(len(str(c.args)) + len(str(c.result)) for c in result.tool_calls)
    assert kept < 100_000, f"the host kept {kept} characters of refused values"


async def test_12_an_async_tool_call_cannot_finish_after_the_run_returned(sandbox: Executor) -> None:
    finished: list[int] = []

    async def later(x: int) -> int:
        await asyncio.sleep(0.3)
        finished.append(x)
        return x

    code = "async def main():\n    pending = later(1)\n    return 5\nawait main()" \
        if kind(sandbox) == "interpreter" else "5"
    result = await sandbox.run(code, tools={"later": later}, limits=LIMITS)
    assert result.value == 5, result
    await asyncio.sleep(0.6)
    assert finished == []
    if kind(sandbox) == "interpreter":  # the call was made, and cut short: the record says so
        assert [(c.name, c.error) for c in result.tool_calls] == [
            ("later", "Cancelled: the run ended before the tool returned")], result.tool_calls
    else:
        assert result.tool_calls == ()


async def test_12_a_keyword_the_host_bound_cannot_be_overridden_by_the_code(sandbox: Executor) -> None:
    seen: list[str] = []

    def search(query: str, api_key: str = "") -> str:
        seen.append(api_key)
        return query.upper()

    tools = {"search": functools.partial(search, api_key="sk-host-secret")}
    code = ("out = [search('a')]\ntry:\n    search('b', api_key='attacker')\nexcept TypeError as e:\n"
            "    out.append(type(e).__name__)\nout")
    result = await sandbox.run(code, tools=tools, limits=LIMITS)
    assert result.value == ["A", "TypeError"], result
    assert seen == ["sk-host-secret"], seen
    assert "sk-host-secret" not in repr(result.tool_calls)


async def test_8_monty_answers_an_undefined_call_with_a_name_error_when_tools_are_offered(sandbox: Executor) -> None:
    result = await sandbox.run("dir()\n", tools={"lookup": lambda x: x}, limits=LIMITS)
    if kind(sandbox) == "interpreter":
        assert result.error is not None and result.error.type == "NameError", result
    else:
        assert result.error is None and isinstance(result.value, list)
    typo = await sandbox.run("lookpu(1)", tools={"lookup": lambda x: x}, limits=LIMITS)
    assert typo.error is not None and typo.error.type == "NameError" and typo.error.origin == "code", typo


# ------------------------------------------------------------------ the host's environment (issue 12's snippet)
async def test_the_hosts_environment_never_enters_the_sandbox(sandbox: Executor,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-host-secret")  # set after the fork server started: the Monty
    result = await sandbox.run("import os\ndict(os.environ)", limits=LIMITS)  # pool and the next test cover before
    if kind(sandbox) == "interpreter":
        assert result.error is not None and "os.environ" in result.error.message, result
    else:
        assert "OPENAI_API_KEY" not in (result.value or {}), result


async def test_the_process_sandbox_environment_is_the_documented_one_plus_env(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from ringzero.providers.executors import ProcessExecutor
    from ringzero.providers.executors.process import SANDBOX_ENVIRONMENT

    monkeypatch.setenv("OPENAI_API_KEY", "sk-host-secret")  # as every provider example asks
    executor = ProcessExecutor(warm=1, env={"REPORT_STYLE": "short"})
    try:
        seen = (await executor.run("import os\ndict(os.environ)")).value
        [server] = executor.servers  # every run is a fork of it: its memory is theirs
        raw = Path(f"/proc/{server.process.pid}/environ").read_bytes().decode()  # noqa: ASYNC240
    finally:
        await executor.aclose()
    expected = {*SANDBOX_ENVIRONMENT, "HOME", "TMPDIR", "PYTHONPATH", "REPORT_STYLE"}
    if "LD_LIBRARY_PATH" in os.environ:
        expected.add("LD_LIBRARY_PATH")
    assert isinstance(seen, dict) and set(seen) == expected, seen
    assert seen["REPORT_STYLE"] == "short" and seen["HOME"] == "/tmp"
    assert "OPENAI_API_KEY" in os.environ and "sk-host-secret" not in raw, "the secret is in the sandbox's memory"


def exits_like_argparse(flag: str) -> None:
    raise SystemExit(2)  # what argparse does when the code passes it a flag it does not know


def interrupted(flag: str) -> None:
    raise KeyboardInterrupt


@pytest.mark.parametrize("tool", [exits_like_argparse, interrupted], ids=["SystemExit", "KeyboardInterrupt"])
async def test_a_host_tool_that_exits_fails_only_its_own_call(sandbox: Executor, tool: Callable[[str], None]) -> None:
    """Issue 44, row 1: a tool's SystemExit or KeyboardInterrupt used to end the whole host."""
    result = await sandbox.run("cli('--nope')", tools={"cli": tool}, limits=LIMITS)
    expected = "SystemExit" if tool is exits_like_argparse else "KeyboardInterrupt"
    # The code sees the tool's error (Monty shows an exception class it does not know as its base,
    # Exception); the run's record of the call names it.
    shown = "Exception" if kind(sandbox) == "interpreter" else expected
    assert result.error is not None and result.error.type == shown, result
    assert [call.error.split(":")[0] for call in result.tool_calls if call.error] == [expected]
    after = await sandbox.run("1 + 1", limits=LIMITS)
    assert after.value == 2, "the host and its executor go on"


async def test_a_tool_that_exits_is_a_tool_failure_of_ctx_tool(tmp_path: Path) -> None:
    from ringzero import Kernel, ToolFailed
    from ringzero.checkpointers import MemoryCheckpointer

    async def program(ctx: object) -> str:
        try:
            await ctx.tool(exits_like_argparse, "--nope")  # type: ignore[attr-defined]
        except ToolFailed as exc:
            return exc.error_type
        return "returned"

    async with Kernel(checkpointer=MemoryCheckpointer()) as kernel:
        assert await (await kernel.spawn(program)).wait() == "SystemExit"


def takes_a_number(x: float) -> float:
    return x


def returns_infinity() -> float:
    return float("inf")


@pytest.mark.parametrize("code", ["takes_a_number(float('nan'))", "returns_infinity()", "float('inf')",
                                  "[1.0, float('-inf')]"])
async def test_nan_and_infinity_never_reach_the_journal(sandbox: Executor, code: str) -> None:
    """Issue 44, row 3: NaN and the infinities crossed the boundary, and the journal then refused
    the run's record, failing the process. A tool never gets them, the code gets a ValueError
    for a tool's, and a final value is refused (or, in Monty, comes back as its text)."""
    from ringzero.core.contract.types import strict_json

    calls: list[float] = []

    def recording(x: float) -> float:
        calls.append(x)
        return x

    result = await sandbox.run(code, tools={"takes_a_number": recording, "returns_infinity": returns_infinity},
                               limits=LIMITS)
    strict_json(result.to_dict())  # what the journal writes: no NaN, no infinity anywhere in it
    assert calls == [], "the tool never got the NaN"
    if code.startswith(("takes", "returns")):
        assert result.error is not None and result.error.type == "ValueError", result
        assert "is not JSON-compatible" in result.error.message
    elif kind(sandbox) == "interpreter":
        assert result.error is None and isinstance(result.value, str), result  # Monty: its repr
    else:
        assert result.error is not None and result.error.type == "ValueError" and result.error.origin == "code"


async def test_code_with_nan_leaves_a_kernel_process_running(tmp_path: Path) -> None:
    from ringzero import Kernel
    from ringzero.checkpointers import SqliteCheckpointer

    async def program(ctx: object) -> object:
        out = await ctx.exec("takes_a_number(float('nan'))", tools={"takes_a_number": takes_a_number})  # type: ignore[attr-defined]
        return out.error.type if out.error is not None else out.value

    async with Kernel(checkpointer=SqliteCheckpointer(tmp_path / "k.db")) as kernel:
        assert await (await kernel.spawn(program)).wait() == "ValueError"


@pytest.mark.parametrize("code", ["# await\n" + "-" * 3000 + "1", "# await\nx = " + "+".join(["1"] * 100_000)],
                         ids=["3 KB of unary minus", "100,000 terms"])
async def test_code_too_deep_for_the_host_s_parser_is_the_code_s_error(sandbox: Executor, code: str) -> None:
    """Issue 44, row 4: Monty's host-side probe for `await` parsed the code with CPython's
    parser outside any guard, and its RecursionError came out of run()."""
    result = await sandbox.run(code, limits=LIMITS)  # returns: run() raises only for the executor's faults
    expected = "SyntaxError" if kind(sandbox) == "interpreter" else "RecursionError"  # Monty's parser, CPython's
    assert result.error is not None and (result.error.type, result.error.origin) == (expected, "code"), result
    after = await sandbox.run("1 + 1", limits=LIMITS)
    assert after.value == 2


SHOWS_BADLY = "class Shy:\n    def __repr__(self):\n        raise RuntimeError('no')\n    def __str__(self):\n" \
              "        raise RuntimeError('no')\n"


@full_cpython_only
@pytest.mark.parametrize(("code", "check"), [
    ("10 ** 5000", lambda r: r.error is None and r.value == "<a int that cannot be shown: ValueError>"),
    (SHOWS_BADLY + "Shy()", lambda r: r.error is None and r.value == "<a Shy that cannot be shown: RuntimeError>"),
    (SHOWS_BADLY + "class Odd(Exception):\n    def __str__(self):\n        raise RuntimeError('no')\nraise Odd()",
     lambda r: r.error is not None and (r.error.type, r.error.message) == ("Odd", "<a message that cannot be shown>")),
], ids=["an int past 4,300 digits", "a raising __repr__", "an exception whose __str__ raises"])
async def test_a_final_value_or_error_that_cannot_be_shown_is_still_the_code_s_outcome(
        sandbox: Executor, code: str, check: Callable[[ExecResult], bool]) -> None:
    """Issue 44, row 2: these escaped run() as ExecutorError('the sandbox could not be set up')."""
    result = await sandbox.run(code, limits=LIMITS)
    assert check(result), result


# ------------------------------------------------------------------ issue 44: the host side of the boundary
# Each row is something code (or a tool it calls) did to the host before: now a typed outcome of
# its own run, while a bystander on the same executor keeps its pace and the event loop never
# stalls for more than 100 ms.
MAX_STALL = 0.1
FORGE_FAILED = (
    "import os, stat, json, struct\n"
    "body = json.dumps({'op': 'failed', 'message': 'forged by the code'}).encode()\n"
    "for fd in range(3, 64):\n"
    "    try:\n"
    "        if stat.S_ISSOCK(os.fstat(fd).st_mode):\n"
    "            os.write(fd, struct.pack('!I', len(body)) + body)\n"
    "    except OSError:\n"
    "        pass\n"
    "import time\ntime.sleep(3)\n")
SECRET_TEXT = "Request(headers={'Authorization': 'Bearer sk-host-secret'})"


def leaks_its_request(city: str) -> str:
    raise ValueError(SECRET_TEXT)  # what an HTTP client's error often carries


def no_such_city(city: str) -> str:
    raise ringzero.ToolError(f"no city named {city}")


def fetch(path: str, base_url: str = "https://api.example.com", api_key: str = "sk-host-secret") -> str:
    return base_url + path


def take(data: str) -> int:
    return len(data)


SHOWN = "try:\n    {call}\n    out = 'no error'\nexcept Exception as e:\n    out = [type(e).__name__, str(e)]\nout"


@dataclass(frozen=True)
class HostSideAttack:
    row: str
    code: str
    contained: Callable[[ExecResult], bool]
    tools: dict[str, Callable[..., object]]
    limits: ExecLimits = LIMITS
    executors: tuple[str, ...] = ("monty", "process", "microsandbox")

    def __str__(self) -> str:
        return self.row


def _kept_bytes(result: ExecResult) -> int:
    import json

    return sum(len(json.dumps([c.args, c.kwargs, c.result])) for c in result.tool_calls)


HOST_SIDE_ATTACKS = [
    HostSideAttack("1 a tool's SystemExit is that call's error", "cli('--nope')",
                   lambda r: r.error is not None and r.error.origin == "code"
                   and [c.error.split(":")[0] for c in r.tool_calls if c.error] == ["SystemExit"],
                   {"cli": exits_like_argparse}),
    HostSideAttack("2 a failed frame the code forges is its own outcome", FORGE_FAILED,
                   lambda r: r.error is not None and (r.error.type, r.error.origin) == ("SandboxFailed", "code"),
                   {}, executors=("process",)),
    HostSideAttack("3 NaN never reaches a tool", "takes_a_number(float('nan'))",
                   lambda r: r.error is not None and r.error.type == "ValueError" and r.tool_calls[0].args == [],
                   {"takes_a_number": takes_a_number}),
    HostSideAttack("4 code too deep for the host's parser", "# await\n" + "-" * 3000 + "1",
                   lambda r: r.error is not None and r.error.origin == "code", {}, executors=("monty",)),
    HostSideAttack("5 tool calls have a byte budget for the whole run",
                   "out = []\nfor _ in range(40):\n    try:\n        take('x' * 1_000_000)\n"
                   "        out.append('kept')\n"
                   "    except ValueError:\n        out.append('refused')\nout",
                   lambda r: r.value == ["kept"] * 8 + ["refused"] * 32 and _kept_bytes(r) <= 8_100_000,
                   {"take": take}, ExecLimits(wall_seconds=20, tool_bytes=2_000_000, run_tool_bytes=8_100_000)),
    HostSideAttack("6 a million-key final value is refused", "{i: i for i in range(10**6)}",
                   lambda r: r.error is not None and r.error.type in ("OutputLimitExceeded", "MemoryError"), {},
                   ExecLimits(wall_seconds=5)),
    HostSideAttack("6 the largest dict Monty's default heap holds is refused", "{i: i for i in range(250_000)}",
                   lambda r: r.error is not None and r.error.type == "OutputLimitExceeded", {},
                   ExecLimits(wall_seconds=5), executors=("monty",)),
    HostSideAttack("6 a 100 MB exception message is clipped to 8 KB", "raise ValueError('x' * 10**8)",
                   lambda r: r.error is not None and r.error.type in ("ValueError", "MemoryError")
                   and len(r.error.message) < 8300 and len(r.error.traceback) < 9000,
                   {}, ExecLimits(wall_seconds=10)),
    HostSideAttack("6 a 40 MB exception message is clipped to 8 KB", "raise ValueError('x' * 40_000_000)",
                   lambda r: r.error is not None and r.error.type == "ValueError"
                   and 8192 <= len(r.error.message) < 8300 and len(r.error.traceback) < 9000,
                   {}, ExecLimits(wall_seconds=10)),
    HostSideAttack("7 a GIL-holding tool declared cpu_bound runs in a process", "total(600_000_000)",
                   lambda r: r.error is not None and (r.error.type, r.error.origin) == ("TimeoutError", "executor"),
                   {"total": cpu_tools.total}, ExecLimits(wall_seconds=1)),
    HostSideAttack("11 a tool's exception text stays with the host", SHOWN.format(call="lookup('Paris')"),
                   lambda r: r.value[0] in ("ValueError", "Exception") and "sk-host" not in str(r.value)
                   and "sk-host-secret" in (r.tool_calls[0].error or ""), {"lookup": leaks_its_request}),
    HostSideAttack("11 a ToolError's message reaches the code", SHOWN.format(call="lookup('Atlantis')"),
                   lambda r: "no city named Atlantis" in r.value[1], {"lookup": no_such_city}),
    HostSideAttack("11 a default keeps the host's value",
                   SHOWN.format(call="fetch('/x', base_url='http://127.0.0.1:9')") + "\n[out, fetch('/y')]",
                   lambda r: r.value[0][0] == "TypeError" and r.value[1] == "https://api.example.com/y"
                   and [c.error is None for c in r.tool_calls] == [False, True], {"fetch": fetch}),
]
def _host_side_cases() -> list[object]:
    """Each row on each of its executors; a row Monty runs with tools also on Monty answering
    them in its own thread (``monty-quick-tools``)."""
    return [pytest.param(name, attack, id=f"{name}: {attack.row}") for attack in HOST_SIDE_ATTACKS
            for name in (*attack.executors, *(("monty-quick-tools",) if "monty" in attack.executors and attack.tools
                                               else ()))]


@pytest.mark.parametrize(("sandbox", "attack"), _host_side_cases(), indirect=["sandbox"])
async def test_host_side_attack_is_the_run_s_own_outcome(sandbox: Executor, attack: HostSideAttack) -> None:
    async with bystander(sandbox) as pace:
        result = await sandbox.run(attack.code, tools=attack.tools, limits=attack.limits)  # run() returns
    assert attack.contained(result), result
    assert pace.runs > 0 and pace.wrong == [], "the bystander's runs did not complete"
    assert (await sandbox.run("21 * 2")).value == 42, "the executor did not serve the next run"
    assert pace.longest_stall < MAX_STALL, f"the event loop stalled {pace.longest_stall * 1000:.0f} ms"



@pytest.mark.parametrize("sandbox", ["monty", "process"], indirect=True)
async def test_7_tools_that_outlive_their_runs_leave_the_pool_to_the_next_run(sandbox: Executor) -> None:
    """Row 7: eight timed-out runs of a slow sync tool filled the loop's shared default executor,
    so an unrelated run's instant tool timed out and getaddrinfo stopped answering. Host tools
    now run in the executor's own pool, and a tool past its run's wall limit is counted and its
    thread replaced."""
    release = threading.Event()

    def stuck(x: int) -> int:
        release.wait(30)
        return x

    pool = sandbox.tool_pool  # type: ignore[attr-defined]
    try:
        async with bystander(sandbox) as pace:
            stalled = await asyncio.gather(*(sandbox.run("stuck(1)", tools={"stuck": stuck},
                                                         limits=ExecLimits(wall_seconds=0.5)) for _ in range(8)))
            assert [r.error.type for r in stalled if r.error] == ["TimeoutError"] * 8, stalled
            assert pool.stats()["overrunning"] == 8
            instant = await sandbox.run("double(21)", tools={"double": lambda x: 2 * x},
                                        limits=ExecLimits(wall_seconds=2))
            assert instant.value == 42, instant
            loop = asyncio.get_running_loop()
            assert await loop.getaddrinfo("127.0.0.1", 80), "the loop's own executor no longer answers"
        assert pace.longest_stall < MAX_STALL and pace.wrong == []
    finally:
        release.set()
    for _ in range(200):
        if pool.stats()["overrunning"] == 0:
            break
        await asyncio.sleep(0.01)
    assert pool.stats() == {"threads": pool.threads, "running": 0, "overrunning": 0, "stalls": 0}


async def test_7_a_cpu_bound_tool_runs_in_a_worker_process() -> None:
    from ringzero.providers.executors import MontyExecutor

    executor = MontyExecutor(max_workers=1)
    try:
        result = await executor.run("[total(1000), where_am_i()]",
                                    tools={"total": cpu_tools.total, "where_am_i": cpu_tools.where_am_i},
                                    limits=ExecLimits(wall_seconds=30))
    finally:
        await executor.aclose()
    assert result.value is not None and result.value[0] == 499500, result
    assert result.value[1] != os.getpid()


@pytest.mark.parametrize("sandbox", ["monty"], indirect=True)
async def test_8_a_tool_call_cut_short_by_the_wall_limit_is_settled_and_recorded(sandbox: Executor) -> None:
    """Row 8: an async tool called by sync-style code, still running when the wall limit ended
    the run, finished after run() returned and was missing from tool_calls."""
    finished: list[int] = []

    async def later(x: int) -> int:
        await asyncio.sleep(1.5)
        finished.append(x)
        return x

    async with bystander(sandbox) as pace:
        result = await sandbox.run("later(1)", tools={"later": later}, limits=ExecLimits(wall_seconds=0.3))
    assert pace.longest_stall < MAX_STALL and pace.runs > 0 and pace.wrong == []
    assert result.error is not None and result.error.type == "TimeoutError", result
    assert [(c.name, c.error) for c in result.tool_calls] == [
        ("later", "Cancelled: the run ended before the tool returned")], result.tool_calls
    await asyncio.sleep(1.8)
    assert finished == [], "the tool call went on after run() returned"


async def test_a_bystander_process_on_the_kernel_keeps_its_pace_while_an_agent_attacks(tmp_path: Path) -> None:
    """The acceptance's bystander, as agents: one process's code floods the host with oversized
    tool calls and a huge final value; another process's syscalls (its own code runs and a
    journaled clock) go on, and the loop never stalls 100 ms."""
    from ringzero import Kernel
    from ringzero.checkpointers import SqliteCheckpointer
    from ringzero.providers.executors import ProcessExecutor

    async def attacker(ctx: object) -> list[str]:
        outcomes = []
        for code in ["out = []\nfor _ in range(40):\n    try:\n        take('x' * 1_000_000)\n"
                     "    except ValueError:\n        out.append('refused')\nlen(out)",
                     "{i: i for i in range(10**6)}", "cli('--nope')"]:
            result = await ctx.exec(code, tools={"take": take, "cli": exits_like_argparse})  # type: ignore[attr-defined]
            outcomes.append(result.error.type if result.error else result.value)
        return outcomes

    async def bystander_agent(ctx: object) -> int:
        steps = 0
        while steps < 30:
            assert (await ctx.exec("sum(range(10))")).value == 45  # type: ignore[attr-defined]
            await ctx.now()  # type: ignore[attr-defined]
            steps += 1
        return steps

    stalls: list[float] = []

    async def probe() -> None:
        loop = asyncio.get_running_loop()
        while True:
            before = loop.time()
            await asyncio.sleep(0.005)
            stalls.append(loop.time() - before - 0.005)

    executor = ProcessExecutor(limits=ExecLimits(run_tool_bytes=8_000_000))
    async with Kernel(checkpointer=SqliteCheckpointer(tmp_path / "k.db"), executor=executor) as kernel:
        watching = asyncio.ensure_future(probe())
        try:
            attack = await kernel.spawn(attacker)
            calm = await kernel.spawn(bystander_agent)
            assert await calm.wait() == 30
            outcomes = await attack.wait()
        finally:
            watching.cancel()
    assert outcomes[0] == 33 and outcomes[1:] == ["OutputLimitExceeded", "SystemExit"], outcomes
    assert max(stalls) < MAX_STALL, f"the event loop stalled {max(stalls) * 1000:.0f} ms"


def _monty_workers_of(parent: int) -> list[int]:
    """The ``monty subprocess`` workers this process started (the pool's children)."""
    workers = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            command = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            continue
        ppid = int(next(line.split()[1] for line in status.splitlines() if line.startswith("PPid:")))
        if ppid == parent and command[1:2] == [b"subprocess"] and command[0].endswith(b"monty"):
            workers.append(int(pid))
    return workers


def _proc_status(pid: int) -> dict[str, str]:
    return dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines())


def _proc_bytes(path: str) -> bytes:
    return Path(path).read_bytes()


async def test_12_monty_workers_stand_behind_a_second_wall() -> None:
    """Row 12: Monty's workers ran as the host's user (root here) with every capability, the
    host's network and no seccomp: an escape from the interpreter had no second wall. What
    each control does is the process sandbox's, tried there with real attacks; this checks that
    every worker is under each one this host can apply."""
    from ringzero.providers.executors import MontyExecutor

    executor = MontyExecutor(max_workers=2)
    try:
        assert (await executor.run("21 * 2")).value == 42
        workers = _monty_workers_of(os.getpid())
        assert workers, "no Monty worker found"
        for pid in workers:
            status = _proc_status(pid)
            assert _proc_bytes(f"/proc/{pid}/environ") == b"", "the worker has an environment"
            if "namespaces" not in executor.missing_controls:
                assert os.readlink(f"/proc/{pid}/ns/net") != os.readlink("/proc/self/ns/net")
            if "seccomp" not in executor.missing_controls:
                assert status["Seccomp"].strip() == "2" and status["NoNewPrivs"].strip() == "1"
            if os.geteuid() == 0 and "unprivileged" not in executor.missing_controls:
                assert status["Uid"].split() == ["65534"] * 4
                assert status["CapEff"].strip() == status["CapPrm"].strip() == "0000000000000000"
        if os.geteuid() == 0:  # where every control can hold, each must
            assert executor.missing_controls == {}, executor.missing_controls
        after = await executor.run("x = [i * i for i in range(1000)]\nsum(x)")
        assert after.value == 332833500, after
    finally:
        await executor.aclose()


PLANT = (
    "import os, shutil, socket, stat\n"
    "ws = os.environ['RINGZERO_WORKSPACE']\n"
    "out = {}\n"
    "def attempt(name, action):\n"
    "    try:\n"
    "        action()\n"
    "        out[name] = 'made'\n"
    "    except OSError as e:\n"
    "        out[name] = type(e).__name__\n"
    "attempt('symlink', lambda: os.symlink(HOST_FILE, ws + '/link'))\n"
    "attempt('fifo', lambda: os.mkfifo(ws + '/fifo'))\n"
    "attempt('socket', lambda: socket.socket(socket.AF_UNIX).bind(ws + '/sock'))\n"
    "shutil.copy('/usr/bin/tee', ws + '/tee')\n"
    "attempt('setuid', lambda: os.chmod(ws + '/tee', 0o4755))\n"
    "attempt('setuid at creation', lambda: os.close(os.open(ws + '/made', os.O_CREAT | os.O_WRONLY, 0o4755)))\n"
    "open(ws + '/report.txt', 'w').write('a plain file is fine')\n"
    "out['uid'] = os.getuid()\n"
    "out")


@full_cpython_only
async def test_9_a_workspace_holds_only_files_and_folders_of_its_own_agent(sandbox: Executor, tmp_path: Path) -> None:
    """Row 9: with a workspace, code planted a setuid copy of tee, a FIFO and a symlink to a host
    file in the host's directory, and every workspace had the same owner (nobody)."""
    from ringzero.providers.executors import ProcessExecutor
    from ringzero.providers.executors.workspaces import workspace_uid

    if not isinstance(sandbox, ProcessExecutor):
        pytest.skip("a microVM's workspace is a virtiofs share: its rules are the guest kernel's")
    secret = tmp_path / "secret.txt"
    secret.write_text("host secret")
    workspaces = [tmp_path / "agent-a", tmp_path / "agent-b"]
    executors = [ProcessExecutor(workspace=w, warm=1) for w in workspaces]
    try:
        async with bystander(executors[1]) as pace:
            result = await executors[0].run(PLANT, inputs={"HOST_FILE": str(secret)}, limits=LIMITS)
        other = await executors[1].run("import os\nos.getuid()", limits=LIMITS)
    finally:
        await asyncio.gather(*(e.aclose() for e in executors))
    assert result.error is None, result
    assert pace.longest_stall < MAX_STALL and pace.runs > 0 and pace.wrong == []
    refused = {k: v for k, v in result.value.items() if k != "uid"}
    assert refused == {"symlink": "PermissionError", "fifo": "PermissionError", "socket": "PermissionError",
                       "setuid": "PermissionError", "setuid at creation": "PermissionError"}, refused
    left = {p.name: p.lstat().st_mode for p in workspaces[0].iterdir()}
    assert sorted(left) == ["report.txt", "tee"], left  # "made" was refused whole: nothing of it is left
    assert all(stat.S_ISREG(mode) and not mode & 0o6000 for mode in left.values()), left
    if os.geteuid() == 0:
        owners = [result.value["uid"], other.value]
        assert owners == [workspace_uid(str(w)) for w in workspaces] and owners[0] != owners[1], owners
        assert [w.stat().st_uid for w in workspaces] == owners
        assert [stat.S_IMODE(w.stat().st_mode) for w in workspaces] == [0o700, 0o700]


HOLD_INOTIFY = (
    "import ctypes, os, time\n"
    "libc = ctypes.CDLL(None, use_errno=True)\n"
    "held = 0\n"
    "for _ in range(4):\n"  # 64 open files a process: four processes hold the uid's whole allowance
    "    if os.fork() == 0:\n"
    "        while libc.inotify_init1(0) >= 0:\n"
    "            pass\n"
    "        time.sleep(3)\n"
    "        os._exit(0)\n"
    "while libc.inotify_init1(0) >= 0:\n"
    "    held += 1\n"
    "time.sleep(3)\n"
    "held")


@full_cpython_only
async def test_10_one_run_holding_every_inotify_instance_leaves_other_runs_theirs(sandbox: Executor) -> None:
    """Row 10: every run shared uid 65534, so one run took all of the uid's inotify instances
    (``fs.inotify.max_user_instances``, 128 by default) and other runs got EMFILE."""
    if os.geteuid() != 0:
        pytest.skip("runs get uids of their own only where the host runs as root")
    limit = int(_proc_bytes("/proc/sys/fs/inotify/max_user_instances"))
    if limit > 250:
        pytest.skip(f"this host allows {limit} inotify instances a uid: more than four processes of 64 files hold")
    async with bystander(sandbox) as pace:
        greedy = asyncio.ensure_future(sandbox.run(HOLD_INOTIFY, limits=LIMITS))
        await asyncio.sleep(1.0)
        other = await sandbox.run(LIBC + "[libc.inotify_init1(0) >= 0, ctypes.get_errno()]", limits=LIMITS)
        held = await greedy
    assert pace.longest_stall < MAX_STALL and pace.runs > 0 and pace.wrong == []
    assert held.error is None and isinstance(held.value, int), held
    assert other.value == [True, 0], other


WALL_FAILS_LATER = """
import asyncio
from ringzero import ExecutorError
from ringzero.providers.executors import MontyExecutor, _monty_wall
from ringzero.providers.executors._confine import landlock
from ringzero.providers.executors.monty import _monty_binary

async def main():
    # the executor's probe, once per host process: here every control holds
    assert _monty_wall.probe(_monty_binary())["landlock"] is None
    # then the host's conditions change: this thread (and the threads it starts, which start
    # the workers) holds every Landlock layer the kernel allows, each allowing everything
    for _ in range(16):
        landlock([], ["/"])
    later = MontyExecutor(max_workers=1)
    try:
        await later.run("21 * 2")
        print("started without its wall")
    except ExecutorError as exc:
        print("refused:", exc, sorted(later.missing_controls))
    finally:
        await later.aclose()

asyncio.run(main())
"""


async def test_7_a_monty_worker_whose_wall_fails_as_it_starts_does_not_start(tmp_path: Path) -> None:
    """Row 7: the launcher applied what it could and exec'd the worker anyway, so a worker
    started without a control the executor reported as held. Now a control that held when
    probed is required: the worker does not start, and the executor says why. (Landlock fails
    for real here: the host process already holds the most layers the kernel allows.)"""
    import subprocess
    import sys

    if os.geteuid() != 0:
        pytest.skip("the probe must find every control holding: only where the host runs as root")
    script = tmp_path / "wall.py"
    script.write_text(WALL_FAILS_LATER)
    out = await asyncio.to_thread(subprocess.run, [sys.executable, str(script)], capture_output=True, text=True,
                                  timeout=60, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("refused: a Monty worker did not start: its second wall could not apply landlock"), \
        (out.stdout, out.stderr[-2000:])
    assert out.stdout.rstrip().endswith("['landlock']"), out.stdout
