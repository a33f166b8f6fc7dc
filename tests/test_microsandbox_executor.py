"""MicrosandboxExecutor without a booted VM: the host probe, configuration, the pool, the
guest's half of the protocol (run by a real python over pipes), framing and error mapping.
Booting runs are in the shared suites, which skip with the probe's reason where VMs cannot boot."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import microsandbox as ms
import pytest

from ringzero.core.contract.errors import ExecutorError, InvalidArgument
from ringzero.providers.executors._runner import frame
from ringzero.providers.executors.boundary import FrameBuffer, ProtocolViolation
from ringzero.providers.executors.microsandbox import (
    RUNNER_SOURCE,
    MicrosandboxExecutor,
    SandboxPool,
    map_failure,
    microvm_unavailable_reason,
)


def fake_rootfs(tmp_path: Path) -> Path:
    """A directory shaped like an mmdebstrap root (configuration checks only look at its shape)."""
    python = tmp_path / "rootfs" / "usr" / "bin" / "python3"
    python.parent.mkdir(parents=True)
    python.write_text("")
    return tmp_path / "rootfs"


def test_the_probe_names_each_missing_requirement(tmp_path: Path) -> None:
    assert "does not exist" in (microvm_unavailable_reason(kvm=str(tmp_path / "kvm")) or "")
    kvm = tmp_path / "kvm"
    kvm.write_text("")
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("flags\t\t: fpu sse2 avx\n")
    assert "no vmx or svm" in (microvm_unavailable_reason(kvm=str(kvm), cpuinfo=str(cpuinfo)) or "")
    cpuinfo.write_text("flags\t\t: fpu vmx sse2\n")
    assert microvm_unavailable_reason(kvm=str(kvm), cpuinfo=str(cpuinfo)) is None  # runtime is bundled


async def test_start_refuses_with_the_probes_reason_where_vms_cannot_boot(tmp_path: Path) -> None:
    reason = microvm_unavailable_reason()
    if reason is None:
        pytest.skip("microVMs can boot on this host: the refusal path does not apply")
    executor = MicrosandboxExecutor(fake_rootfs(tmp_path))
    with pytest.raises(ExecutorError, match=r"microVMs cannot boot|KVM|kvm|runtime"):
        await executor.start()
    await executor.aclose()


def test_the_image_must_be_a_root_file_system_with_python(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgument, match="mmdebstrap"):
        MicrosandboxExecutor(tmp_path / "missing")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(InvalidArgument, match="has no python3"):
        MicrosandboxExecutor(empty)
    executor = MicrosandboxExecutor(fake_rootfs(tmp_path), workspace=tmp_path / "ws")
    assert executor.capabilities.isolation == "microvm" and executor.capabilities.network is False
    assert executor.workspace == (tmp_path / "ws").resolve()


class Box:
    def __init__(self, n: int) -> None:
        self.n, self.alive = n, True


async def test_the_pool_hands_out_idle_sandboxes_and_never_exceeds_its_size() -> None:
    made: list[Box] = []

    async def create() -> Box:
        made.append(Box(len(made)))
        return made[-1]

    async def destroy(box: Box) -> None:
        box.alive = False

    pool: SandboxPool[Box] = SandboxPool(create, destroy, size=2)
    await pool.fill()
    a, b = await pool.acquire(), await pool.acquire()
    third = asyncio.create_task(pool.acquire())
    await asyncio.sleep(0.01)
    assert not third.done() and len(made) == 2  # full: the third waits
    await pool.release(a)
    assert await third is a
    await pool.discard(b)  # broken: destroyed, and its slot is free again
    assert not b.alive and pool.live == 1
    c = await pool.acquire()
    assert c.n == 2 and pool.live == 2
    await pool.release(c)
    await pool.close()
    assert not c.alive


async def test_a_failed_start_gives_its_pool_slot_back() -> None:
    attempts = 0

    async def create() -> Box:
        nonlocal attempts
        attempts += 1
        if attempts == 1:
            raise ExecutorError("did not boot")
        return Box(attempts)

    async def destroy(box: Box) -> None:
        return None

    pool: SandboxPool[Box] = SandboxPool(create, destroy, size=1)
    with pytest.raises(ExecutorError):
        await pool.acquire()
    assert pool.live == 0
    assert (await pool.acquire()).n == 2


def test_the_guest_runner_speaks_the_protocol_over_stdin_and_stdout() -> None:
    """The exact source shipped into the VM, run by a real python over pipes."""
    guest = subprocess.Popen([sys.executable, "-c", RUNNER_SOURCE], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert guest.stdin is not None and guest.stdout is not None
    request = {"op": "run", "code": "x = lookup('a')\nprint('got', x)\nx * 2", "inputs": {}, "tools": ["lookup"],
               "output_bytes": 1000}
    guest.stdin.write(frame(request))
    guest.stdin.flush()
    frames = FrameBuffer()

    def read() -> dict[str, object]:
        while True:
            got = frames.feed(guest.stdout.read1(65536))  # type: ignore[union-attr]
            if got:
                return got[0]

    call = read()
    assert (call["op"], call["name"], call["data"]) == ("call", "lookup", [b'[["a"],{}]'])
    guest.stdin.write(frame({"op": "result", "value": 21}))
    guest.stdin.flush()
    done = read()
    guest.stdin.close()
    guest.stdout.close()
    assert guest.wait(10) == 0
    assert (done["op"], done["data"], done["error"]) == ("done", [b"42", b"got 21\n"], None)


def test_frames_are_reassembled_from_any_chunking_and_oversize_or_junk_is_refused() -> None:
    data = frame({"op": "call", "name": "a"}, b"[[1],{}]") + frame({"op": "done"}, b"", b"out")
    buffer = FrameBuffer()
    got = [m for i in range(len(data)) for m in buffer.feed(data[i:i + 1])]
    assert got == [{"op": "call", "name": "a", "data": [b"[[1],{}]"]}, {"op": "done", "data": [b"", b"out"]}]
    with pytest.raises(ProtocolViolation, match="limit"):
        FrameBuffer(control=10).feed(b"\x00\x00\x10\x00")
    with pytest.raises(ProtocolViolation, match="limit"):  # data over the limit, refused from what the message says
        FrameBuffer(limit=10).feed(frame({"op": "done"}, b"x" * 11, b""))
    with pytest.raises(ProtocolViolation, match="were announced"):  # data that is not what the message said
        FrameBuffer().feed(frame({"op": "done", "data": [3]}) + frame_bytes(b"12345"))
    with pytest.raises(ProtocolViolation, match="malformed"):
        FrameBuffer().feed(b"\x00\x00\x00\x03abc")
    with pytest.raises(ProtocolViolation, match="malformed"):  # nesting that would exhaust a recursive parser
        FrameBuffer().feed(frame_bytes(b'{"op":"done","value":' + b"[" * 100_000 + b"]" * 100_000 + b"}"))
    with pytest.raises(ProtocolViolation, match="levels deep"):  # nesting that parses, but deeper than allowed
        FrameBuffer().feed(frame_bytes(b'{"op":"done","value":' + b"[" * 200 + b"]" * 200 + b"}"))


def frame_bytes(payload: bytes) -> bytes:
    return len(payload).to_bytes(4, "big") + payload


def test_sdk_errors_map_to_run_errors_or_executor_errors() -> None:
    timeout = map_failure(ms.ExecTimeoutError("exec timed out after 2s"))
    assert timeout is not None and timeout.type == "TimeoutError"
    gone = map_failure(ms.SandboxNotRunningError("not running"))
    assert gone is not None and gone.type == "SandboxKilled"
    assert map_failure(ms.ImageNotFoundError("no such image")) is None  # the executor's failure, raised
