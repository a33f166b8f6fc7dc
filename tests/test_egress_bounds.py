"""The egress proxy and Monty's quick path as levers on the host, bounded (issue 69).

One run's code could make the host hold memory, descriptors and certificates without end, or
hold the threads every other run needs: each test here pulls one such lever and checks what
the host holds, or how long a bystander waits."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Any

import pytest

from ringzero.core.contract.egress import Egress
from ringzero.core.contract.protocols import Executor
from ringzero.core.contract.types import ExecLimits
from tests.egress_servers import LocalCA, Server, serving
from tests.test_egress import paced

process_only = pytest.mark.parametrize("sandbox", ["process"], indirect=True)
monty_only = pytest.mark.parametrize("sandbox", ["monty"], indirect=True)


def open_policy(ca: LocalCA, *allow: str, **options: Any) -> Egress:
    """Egress to ``allow``; every name is 127.0.0.1."""
    return Egress(allow=list(allow), addresses=["127.0.0.1"], trust=str(ca.pem), resolver=lambda host: ["127.0.0.1"],
                  **options)


RAW = """
import socket
def ask(head, body=b'', wait=5):
    s = socket.create_connection(('127.0.0.1', 3128))
    s.settimeout(wait)
    s.sendall(head + body)
    try:
        return s.recv(4096).split(b'\\r\\n')[0].decode()
    except socket.timeout:
        return 'no answer'
    finally:
        s.close()
"""


@process_only
async def test_a_request_is_judged_from_its_head_before_its_body_is_read(sandbox: Executor, ca: LocalCA,
                                                                         plain: Server) -> None:
    """The body was read up to the budget before the route was judged: a head declaring 100 MB
    to a host off the list kept the host reading. Now the head alone is answered."""
    off = b"POST http://other.test/x HTTP/1.1\r\nHost: other.test\r\nContent-Length: 100000000\r\n\r\n"
    large = (f"POST http://api.test:{plain.port}/x HTTP/1.1\r\nHost: api.test\r\n"
             "Content-Length: 100000000\r\n\r\n").encode()
    code = RAW + f"[ask({off!r}, b'x' * 1000), ask({large!r}, b'x' * 1000)]"
    result = await paced(sandbox, code, open_policy(ca, f"http://api.test:{plain.port}"))
    refused, too_large = result.value
    assert refused.startswith("HTTP/1.1 403") and "allow-list" in refused, result.value
    assert too_large.startswith("HTTP/1.1 413"), result.value
    assert plain.received == []


@process_only
async def test_bodies_a_run_holds_at_once_are_bounded_by_its_budget(sandbox: Executor, ca: LocalCA,
                                                                    plain: Server) -> None:
    """Eight connections upload 900 kB each against a 1 MB budget: the host held every body
    at once (32 connections, 16 MiB each: +525 MB). Now what it holds across a run's
    connections stays within what is left of the budget; the rest is refused as it arrives."""
    code = (RAW + "import threading\nout = [None] * 8\n"
            "def upload(i):\n"
            f"    head = ('POST http://api.test:{plain.port}/up HTTP/1.1\\r\\nHost: api.test\\r\\n'\n"
            "            'Content-Length: 900000\\r\\n\\r\\n').encode()\n"
            "    out[i] = ask(head, b'x' * 900000, wait=20)\n"
            "threads = [threading.Thread(target=upload, args=(i,)) for i in range(8)]\n"
            "[t.start() for t in threads]\n[t.join() for t in threads]\nout")
    result = await paced(sandbox, code, open_policy(ca, f"http://api.test:{plain.port}", budget_bytes=1_000_000))
    answers = result.value
    assert len(plain.received) <= 1, len(plain.received)
    assert any(a.startswith("HTTP/1.1 413") for a in answers), answers
    assert sum(r.bytes_out for r in result.egress) <= 1_000_000


@monty_only
async def test_gathered_uploads_cannot_each_pass_the_budget_against_one_remainder(sandbox: Executor, ca: LocalCA,
                                                                                  api: Server) -> None:
    """Ten 40 kB uploads the code gathers, against a 100 kB budget: each passed the check
    against the same remainder (14 times the budget went out). Now each reserves its bytes as
    it is made."""
    url = f"https://api.test:{api.port}/upload"
    code = ("import asyncio\n"
            "async def post():\n"
            "    try:\n"
            f"        return (await http_request('POST', '{url}', body='x' * 40000))['status']\n"
            "    except Exception as e:\n"
            "        return 'refused'\n"
            "await asyncio.gather(*[post() for _ in range(10)])")
    result = await paced(sandbox, code, open_policy(ca, f"api.test:{api.port}", budget_bytes=100_000))
    assert result.value.count(200) == len(api.received) <= 2, result.value
    assert any(r.refused is not None and "egress budget" in r.refused for r in result.egress), result.egress
    assert sum(len(r.body) for r in api.received) <= 100_000


@process_only
async def test_new_names_under_a_wildcard_route_are_rate_limited(sandbox: Executor, ca: LocalCA,
                                                                 api: Server) -> None:
    """Each new name under ``*.test`` had a certificate issued on the loop and kept for the run
    (+180 MB in 10 s). Now new names come at a bounded rate, certificates are made off the
    loop and the last 32 kept."""
    from ringzero.providers.egress import certificates

    burst = getattr(certificates, "NEW_NAMES_BURST", 16)
    code = RAW + (f"[ask(f'CONNECT n{{i}}.test:{api.port} HTTP/1.1\\r\\nHost: n{{i}}.test\\r\\n\\r\\n'.encode())"
                  " for i in range(60)]")
    result = await paced(sandbox, code, open_policy(ca, f"*.test:{api.port}"))
    answers = result.value
    established = sum(a.startswith("HTTP/1.1 200") for a in answers)
    limited = [a for a in answers if a.startswith("HTTP/1.1 429")]
    assert burst <= established < burst + 20 and len(limited) + established == 60, answers


def test_a_run_keeps_its_last_certificates_only() -> None:
    from ringzero.providers.egress.certificates import KEPT_CONTEXTS, RunAuthority

    authority = RunAuthority()
    for i in range(KEPT_CONTEXTS + 8):
        authority.server_context(f"n{i}.test")
    kept = [f"n{i}.test" for i in range(KEPT_CONTEXTS + 8) if authority._kept(f"n{i}.test") is not None]
    assert kept == [f"n{i}.test" for i in range(8, KEPT_CONTEXTS + 8)]


def connections_to(port: int) -> int:
    """Established TCP connections to 127.0.0.1:``port`` (the clients' ends)."""
    lines = Path("/proc/net/tcp").read_text().splitlines()[1:]
    return sum(1 for line in lines if line.split()[2] == f"0100007F:{port:04X}" and line.split()[3] == "01")


@monty_only
async def test_a_run_keeps_few_idle_connections_upstream_whatever_names_it_reaches(sandbox: Executor,
                                                                                   ca: LocalCA) -> None:
    """Sixty names under a wildcard route, each answered and kept alive by the server: every
    connection was kept, one per name (the host reached its descriptor limit). Now a run keeps 16."""
    from ringzero.providers.egress import upstream

    kept_in_all = getattr(upstream, "KEPT_IN_ALL", 16)
    grown: list[int] = []
    with serving(ca, names=("*.api.test",)) as wildcard:
        code = (f"for i in range(60):\n    http_request('GET', f'https://n{{i}}.api.test:{wildcard.port}/echo')\n"
                "count()")
        def count() -> int:
            grown.append(connections_to(wildcard.port))
            return grown[-1]

        egress = open_policy(ca, f"*.api.test:{wildcard.port}")
        result = await sandbox.run(code, tools={"count": count}, limits=ExecLimits(wall_seconds=30, egress=egress))
        assert result.error is None, result
        assert len(wildcard.received) == 60
    assert grown[0] <= kept_in_all, grown  # the run's idle connections upstream


SLOW: list[bool] = []


def turns_slow(x: int) -> int:
    """Quick until told otherwise: Monty answers it in its own thread; then it takes 5 s."""
    if SLOW:
        time.sleep(5)
    return x


async def test_a_quick_tool_turned_slow_holds_no_bystander_past_its_run_s_wall() -> None:
    """On Monty's quick path a tool that turned slow held the thread pydantic-monty answers on:
    with as many such runs as CPUs, a bystander's tool-less run waited 19.5 s behind two runs
    with a 1-second wall. Now the runs end at their wall, and the bystander on time."""
    from ringzero.providers.executors import MontyExecutor

    executor = MontyExecutor()
    SLOW.clear()
    try:
        warm = await executor.run("turns_slow(1)", tools={"turns_slow": turns_slow},
                                  limits=ExecLimits(wall_seconds=1))
        assert warm.value == 1, warm
        SLOW.append(True)
        started = time.monotonic()

        async def slow() -> float:
            result = await executor.run("turns_slow(2)", tools={"turns_slow": turns_slow},
                                        limits=ExecLimits(wall_seconds=1))
            assert result.error is not None and result.error.type == "TimeoutError", result
            return time.monotonic() - started

        async def bystander() -> float:
            await asyncio.sleep(0.3)
            begun = time.monotonic()
            result = await executor.run("1 + 1", limits=ExecLimits(wall_seconds=10))
            assert result.value == 2, result
            return time.monotonic() - begun

        *ended, waited = await asyncio.gather(*(slow() for _ in range(max(2, os.cpu_count() or 1))), bystander())
    finally:
        SLOW.clear()
        await executor.aclose()
    assert max(ended) < 3.0, ended  # the 1 s wall, and its 1 s backstop
    assert waited < 1.0, waited
