"""Hostile code in an isolating executor never reaches the host, and the executor serves
the next run. Network attempts target only a server this test starts on 127.0.0.1."""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from ringzero.core.contract.protocols import Executor
from ringzero.core.contract.types import ExecLimits

LIMITS = ExecLimits(wall_seconds=2.0, memory_bytes=256 * 1024 * 1024, output_bytes=64 * 1024)
KILLED = "SandboxKilled"  # a process executor's confined child died of a limit or signal


@pytest.fixture
def local_server() -> Iterator[tuple[int, list[bytes]]]:
    """A TCP server on 127.0.0.1 that records whatever reaches it."""
    received: list[bytes] = []
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    server.settimeout(0.2)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                continue
            with conn:
                received.append(conn.recv(1024))

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield server.getsockname()[1], received
    stop.set()
    thread.join(2)
    server.close()


async def contained(sandbox: Executor, code: str, *expected_errors: str, **inputs: object) -> str:
    """Run ``code``: it must fail with one of ``expected_errors``; the sandbox must still work."""
    result = await sandbox.run(code, inputs=inputs, limits=LIMITS)  # type: ignore[arg-type]
    assert result.error is not None, f"hostile code ran to completion: {result.value!r}"
    assert result.error.type in expected_errors, result.error
    assert (await sandbox.run("21 * 2")).value == 42, "the executor did not serve the next run"
    return result.error.message


async def test_reading_etc_shadow_is_refused(sandbox: Executor) -> None:
    await contained(sandbox, "open('/etc/shadow').read()", "PermissionError", "FileNotFoundError")


async def test_reading_a_host_file_outside_the_sandbox_is_refused(sandbox: Executor, tmp_path: Path) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("the host's secret")
    await contained(sandbox, "open(path).read()", "PermissionError", "FileNotFoundError", path=str(secret))


async def test_writing_outside_the_sandbox_is_refused(sandbox: Executor, tmp_path: Path) -> None:
    target = tmp_path / "planted.txt"
    await contained(sandbox, "open(path, 'w').write('pwned')", "PermissionError", "FileNotFoundError",
                    path=str(target))
    assert not target.exists()


async def test_a_socket_to_a_local_server_never_connects(sandbox: Executor,
                                                         local_server: tuple[int, list[bytes]]) -> None:
    port, received = local_server
    code = "import socket\ns = socket.create_connection(('127.0.0.1', port))\ns.sendall(b'exfiltrated')"
    await contained(sandbox, code, "ModuleNotFoundError", "PermissionError", "OSError", port=port)
    await asyncio.sleep(0.3)  # give a connection that got through time to be recorded
    assert received == []


async def test_a_fork_bomb_is_contained(sandbox: Executor) -> None:
    await contained(sandbox, "import os\nwhile True:\n    os.fork()", "AttributeError", "PermissionError",
                    "ModuleNotFoundError", "BlockingIOError", "TimeoutError", KILLED)


async def test_a_memory_bomb_hits_the_memory_limit(sandbox: Executor) -> None:
    await contained(sandbox, "blocks = []\nwhile True:\n    blocks.append('x' * 10_000_000)", "MemoryError", KILLED)


async def test_an_infinite_loop_hits_the_time_limit(sandbox: Executor) -> None:
    await contained(sandbox, "while True:\n    pass", "TimeoutError")


async def test_deep_recursion_is_stopped(sandbox: Executor) -> None:
    await contained(sandbox, "def down(n):\n    return down(n + 1)\ndown(0)", "RecursionError")


async def test_huge_output_is_cut_at_the_output_limit(sandbox: Executor) -> None:
    result = await sandbox.run("for _ in range(100_000):\n    print('x' * 100)", limits=LIMITS)
    assert len(result.stdout) <= (LIMITS.output_bytes or 0) + 100 and result.stdout.endswith("[output truncated]")


async def test_os_system_cannot_touch_the_host(sandbox: Executor, tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    result = await sandbox.run("import os\nos.system('touch ' + path)", inputs={"path": str(marker)}, limits=LIMITS)
    # Monty has no os.system; a process sandbox may run the shell, but it cannot write there.
    assert result.error is not None or result.value != 0
    assert not marker.exists()
    assert (await sandbox.run("21 * 2")).value == 42


async def test_ctypes_aborting_the_interpreter_ends_only_the_run(sandbox: Executor) -> None:
    """ctypes is allowed in full-CPython sandboxes (tests/test_sandbox_attacks.py shows it loads and
    what the seccomp filter still refuses it); an abort() through it kills the run, not the host."""
    if sandbox.capabilities.isolation != "interpreter":
        loaded = await sandbox.run("import ctypes\nctypes.CDLL(None).getpid()", limits=LIMITS)
        assert loaded.value == 1, f"ctypes should load and run as pid 1 of the sandbox: {loaded}"
    await contained(sandbox, "import ctypes\nctypes.CDLL(None).abort()", "ModuleNotFoundError", KILLED)


async def test_killing_the_host_is_refused(sandbox: Executor) -> None:
    import os

    code = "import os, signal\nos.kill(host, signal.SIGKILL)"
    await contained(sandbox, code, "AttributeError", "ModuleNotFoundError", "PermissionError", "ProcessLookupError",
                    host=os.getpid())


async def test_junk_written_on_the_hosts_channel_is_contained(sandbox: Executor) -> None:
    code = ("import os\nfor fd in range(3, 64):\n    try:\n        os.write(fd, b'\\xff\\xff\\xff\\xffjunk')\n"
            "    except OSError:\n        pass")
    result = await sandbox.run(code, limits=LIMITS)
    assert result.error is None or result.error.type in ("ModuleNotFoundError", "AttributeError",
                                                         "SandboxProtocolError")
    assert (await sandbox.run("21 * 2")).value == 42
