"""ProcessExecutor specifics: full CPython with installed packages, a private scratch dir per
run, an unprivileged uid, and Monty pointing users here for what it cannot run."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from ringzero.core.contract.protocols import Executor
from ringzero.providers.executors import MontyExecutor
from tests.executors import _started
from tests.test_processes import until


@pytest.fixture
async def process() -> AsyncIterator[Executor]:
    instance = await _started("process")
    yield instance
    await instance.aclose()


PANDAS_CODE = """
import pandas as pd
frame = pd.DataFrame({"group": ["a", "b", "a", "b"], "value": [1, 2, 3, 4]})
frame.groupby("group")["value"].sum().to_dict()
"""


async def test_installed_packages_like_pandas_run(process: Executor) -> None:
    result = await process.run(PANDAS_CODE)
    assert result.error is None, result.error
    assert result.value == {"a": 4, "b": 6}


async def test_monty_refuses_pandas_and_points_to_the_process_executor() -> None:
    monty = MontyExecutor(max_workers=1)
    result = await monty.run(PANDAS_CODE)
    await monty.aclose()
    assert result.error is not None and result.error.type == "ModuleNotFoundError"
    assert "ProcessExecutor" in result.error.message


async def test_each_run_gets_its_own_private_writable_scratch(process: Executor) -> None:
    first = await process.run("import os\nopen('note.txt', 'w').write('kept?')\n[os.getcwd(), os.environ['HOME']]")
    assert first.error is None, first.error
    assert first.value == ["/tmp", "/tmp"]
    second = await process.run("import os, tempfile\n[os.path.exists('note.txt'), tempfile.gettempdir()]")
    assert second.value == [False, "/tmp"], "a run saw what an earlier run wrote"
    assert not Path("/tmp/note.txt").exists(), "the scratch was the host's /tmp"  # noqa: ASYNC240


@pytest.mark.skipif(os.geteuid() != 0, reason="the uid is only changed when the host runs as root")
async def test_each_run_has_a_uid_of_its_own_when_the_host_is_root(process: Executor) -> None:
    from ringzero.providers.executors._confine import RUN_UIDS

    code = "import os, time\ntime.sleep(0.3)\n[os.getuid(), os.getgid(), os.geteuid()]"
    first, second = await asyncio.gather(process.run(code), process.run(code))
    assert first.value is not None and second.value is not None, (first, second)
    assert first.value[0] == first.value[1] == first.value[2] >= RUN_UIDS, first
    assert second.value[0] >= RUN_UIDS and second.value[0] != first.value[0], "two runs shared a uid"


async def test_no_network_interface_is_up_inside(process: Executor) -> None:
    code = ("import socket\nout = 'connected'\ntry:\n    socket.create_connection(('127.0.0.1', 9), timeout=1)\n"
            "except OSError as e:\n    out = type(e).__name__\nout")
    assert (await process.run(code)).value in ("PermissionError", "OSError", "ConnectionRefusedError")


async def test_a_process_the_code_leaves_behind_is_killed_with_the_run(process: Executor) -> None:
    def leftover_alive() -> bool:  # a host tool: the check sees the leftover while the run lives
        return any(p.isdigit() and _is_sleeper(p) for p in os.listdir("/proc"))

    code = ("import ctypes, os, time\nif os.fork() == 0:\n    ctypes.CDLL(None).prctl(15, b'rz-leftover', 0, 0, 0)\n"
            "    time.sleep(30)\n    os._exit(0)\ntime.sleep(0.2)\nleftover_alive()")
    result = await process.run(code, tools={"leftover_alive": leftover_alive})
    assert result.error is None, result.error
    assert result.value is True, "the leftover process was not visible during the run"
    # The run's PID namespace dies with its init, so nothing the code forked outlives it
    # (the kernel tears the namespace down asynchronously: allow it a moment).
    deadline = time.monotonic() + 5
    while leftover_alive() and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert not leftover_alive()


def _is_sleeper(pid: str) -> bool:
    """The process the code left behind: it named itself (PR_SET_NAME) to be found."""
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip() == "rz-leftover"
    except OSError:
        return False


WEAKER_HOST = """
import asyncio, json, sys
from ringzero.providers.executors import _confine
from ringzero.providers.executors.process import ProcessExecutor
from ringzero.core.contract.errors import ExecutorError

_confine.seccomp_deny()  # from here on, unshare() fails: a host without namespaces

async def main():
    out = {}
    try:
        await ProcessExecutor().start()
        out["refused"] = None
    except ExecutorError as exc:
        out["refused"] = str(exc)
    weaker = ProcessExecutor(allow_weaker_isolation=True)
    result = await weaker.run("21 * 2")
    out.update(value=result.value, missing=sorted(weaker.missing_controls), network=weaker.capabilities.network)
    await weaker.aclose()
    print(json.dumps(out))

asyncio.run(main())
"""


async def test_a_host_that_cannot_enforce_a_control_is_refused_unless_weaker_isolation_is_accepted(
    process: Executor,
) -> None:
    import json
    import subprocess
    import sys

    out = await asyncio.to_thread(subprocess.run, [sys.executable, "-c", WEAKER_HOST], capture_output=True,
                                  text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["refused"] is not None and "namespaces" in report["refused"]
    assert "allow_weaker_isolation=True" in report["refused"]
    assert report["value"] == 42 and "namespaces" in report["missing"] and report["network"] is True


async def test_the_sandbox_refuses_what_the_host_would_refuse_as_too_deep_itself(process: Executor) -> None:
    """An argument nested 98 levels crosses (inside the call's own two levels); a deeper one
    makes the call raise ValueError in the code, as the host would have answered, without
    leaving the sandbox; a final value over 100 levels is refused as output. None reaches the
    host as a message that breaks the protocol: on Python 3.13, whose json encodes 5,000
    levels, one did, and the run was killed."""
    received: list[int] = []

    def depth(value: object) -> int:
        levels = 0
        while isinstance(value, list):
            value, levels = (value[0] if value else None), levels + 1
        received.append(levels)
        return levels

    nest = "def nest(n):\n    x = []\n    for _ in range(n - 1):\n        x = [x]\n    return x\n"
    calls = await process.run(nest + "out = [depth(nest(98))]\ntry:\n    depth(nest(5000))\n"
                              "except ValueError as e:\n    out.append(str(e))\nout", tools={"depth": depth})
    assert calls.error is None, calls
    assert calls.value == [98, "the arguments to depth() nests lists or dicts more than 100 levels deep"]
    assert received == [98] and [c.error for c in calls.tool_calls] == [None]  # the refusal never left the sandbox
    at_the_edge = await process.run(nest + "depth(nest(99))", tools={"depth": depth})
    assert at_the_edge.error is not None and at_the_edge.error.type == "ValueError", at_the_edge
    assert at_the_edge.tool_calls == () and received == [98]
    for levels, refused in ((100, False), (101, True), (5000, True)):
        final = await process.run(nest + f"nest({levels})")
        if refused:
            assert final.value is None and final.error is not None, final
            assert final.error.type == "OutputLimitExceeded" and "nests too deeply" in final.error.message, final
        else:
            assert final.error is None and final.value is not None, final


def _proc_status(pid: str) -> dict[str, str]:
    with open(f"/proc/{pid}/status") as f:
        return dict(line.rstrip("\n").split(":\t", 1) for line in f if ":\t" in line)


async def test_each_run_is_one_fork_of_the_fork_server_born_as_the_init_of_its_own_pid_namespace(
    process: Executor,
) -> None:
    """One fork per run, not a fork that unshares and forks again: every child of the fork
    server (its warm inits) is pid 1 of a PID namespace of its own, and the server's own next
    children are still born in the server's namespace (it points them back after each fork)."""
    assert (await process.run("import os\nos.getpid()")).value == 1
    [server] = process.servers  # type: ignore[attr-defined]
    server_pid = str(server.process.pid)

    def children() -> dict[str, dict[str, str]]:
        found = {}
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                status = _proc_status(pid)
                if status.get("PPid") == server_pid:
                    found[pid] = {**status, "ns": os.readlink(f"/proc/{pid}/ns/pid")}
            except OSError:  # gone meanwhile
                pass
        return found

    await until(lambda: len(children()) >= 2)  # its warm=2 inits, ready for the next runs
    own = os.readlink(f"/proc/{server_pid}/ns/pid")

    def children_born_at_home() -> bool:
        try:
            return os.readlink(f"/proc/{server_pid}/ns/pid_for_children") == own
        except FileNotFoundError:  # unshared, its child not forked yet: the link names no namespace
            return False

    # Between its unshare and its setns (a spawn under way) it is the new one; never for longer.
    await until(children_born_at_home)
    inits = children()
    for pid, status in inits.items():
        assert status["NSpid"].split() == [pid, "1"], status["NSpid"]
        assert status["ns"] != own
    assert len({status["ns"] for status in inits.values()}) == len(inits), "two runs share a PID namespace"


COUNT_SOCKETS = ("import os, stat\nsockets = 0\nfor fd in range(3, 1024):\n    try:\n"
                 "        sockets += stat.S_ISSOCK(os.fstat(fd).st_mode)\n    except OSError:\n        pass\nsockets")


async def test_a_run_holds_no_socket_of_the_fork_server_but_its_own_channel() -> None:
    """An init is forked while the fork server holds the links of the inits waiting before it:
    it closes every descriptor it inherited, so the code finds only its own channel."""
    from ringzero.providers.executors import ProcessExecutor

    executor = ProcessExecutor(warm=3)
    try:
        for _ in range(4):  # every init now waiting was forked while others waited
            assert (await executor.run("1")).value == 1
        assert (await executor.run(COUNT_SOCKETS)).value == 1
    finally:
        await executor.aclose()


async def test_runs_find_common_modules_warm_and_none_of_the_kernel_in_memory(process: Executor) -> None:
    """Every run is a fork of the fork server's memory: it holds the standard library modules
    agent code often imports, and not ringzero's kernel (nor the asyncio and ssl it loads)."""
    from ringzero.providers.executors._forkserver import COMMON_MODULES

    loaded = (await process.run("import sys\nsorted(sys.modules)")).value
    assert isinstance(loaded, list)
    assert set(COMMON_MODULES) <= set(loaded)
    assert [m for m in loaded if m.startswith("ringzero.core") or m in ("asyncio", "ssl")] == []
    assert (await process.run("import asyncio\nasyncio.run(asyncio.sleep(0, 42))")).value == 42


async def test_a_pool_of_fork_servers_grows_only_while_runs_overlap_and_never_past_its_size() -> None:
    """Runs one at a time use one fork server. A run asked for while every server has one in
    flight starts another server in the background; the next run goes to the idle one; with
    ``fork_servers`` running and all busy, no more start. Closing stops them all."""
    from ringzero.providers.executors import ProcessExecutor

    release = asyncio.Event()

    async def hold() -> int:  # a host tool: the run stays in flight until the test lets it go
        await release.wait()
        return 7

    executor = ProcessExecutor(warm=1, fork_servers=2)
    try:
        for n in range(3):
            assert (await executor.run(f"{n} + 1")).value == n + 1
        assert len(executor.servers) == 1 and not executor.growing
        first = asyncio.create_task(executor.run("hold()", tools={"hold": hold}))
        await until(lambda: executor.servers[0].runs == 1)
        assert (await executor.run("2 * 3")).value == 6  # served by the busy server meanwhile
        assert executor.growing, "no second server was started while the first had a run in flight"
        await until(lambda: not executor.growing)
        assert len(executor.servers) == 2 and all(s.alive for s in executor.servers)
        second = asyncio.create_task(executor.run("hold()", tools={"hold": hold}))
        await until(lambda: [s.runs for s in executor.servers] == [1, 1])  # the new server took it
        assert (await executor.run("40 + 2")).value == 42
        assert not executor.growing and len(executor.servers) == 2
        release.set()
        assert [(await first).value, (await second).value] == [7, 7]
        servers = list(executor.servers)
    finally:
        await executor.aclose()
    assert executor.servers == () and all(s.process.returncode is not None for s in servers)


def test_fork_servers_must_be_a_whole_number_of_at_least_one() -> None:
    from ringzero.core.contract.errors import InvalidArgument
    from ringzero.providers.executors import ProcessExecutor

    for bad in (0, -1, 1.5, True, "2"):
        with pytest.raises(InvalidArgument, match="fork_servers must be a whole number of at least 1"):
            ProcessExecutor(fork_servers=bad)  # type: ignore[arg-type]
    assert ProcessExecutor().fork_servers == len(os.sched_getaffinity(0))
