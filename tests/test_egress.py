"""Egress with secrets added at the host (``ExecLimits(egress=Egress(...))``): sandboxed code
reaches the hosts a run allows, through the host, and never holds a secret.

Every server here is one the test starts on 127.0.0.1 (HTTPS with a test CA, or plain HTTP);
names are answered by a resolver the test controls (``Egress.resolver``), so ``api.test`` is
127.0.0.1 and ``Egress.addresses`` must allow that loopback address by name. The process
sandbox's code uses ``urllib`` through the proxy; Monty's calls ``http_request``. Each request
is made while a bystander runs on the same executor: its event loop never stalls 100 ms."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from ringzero import Context, Kernel, ToolInDoubt
from ringzero.checkpointers import SqliteCheckpointer
from ringzero.core.contract.egress import Egress, Secret
from ringzero.core.contract.errors import InvalidArgument
from ringzero.core.contract.protocols import Executor
from ringzero.core.contract.types import ExecLimits, ExecResult
from ringzero.core.support.timeouts import fail_after
from tests.egress_servers import LocalCA, Server
from tests.heartbeat import bystander

KEY = "sk-live-7Qv2xW9pL4mZ8tR3nB6yH1cJ5dF0gK"
PLACEHOLDER = "rz-secret-API_KEY"
MAX_STALL = 0.1
both = pytest.mark.parametrize("sandbox", ["process", "monty"], indirect=True)
process_only = pytest.mark.parametrize("sandbox", ["process"], indirect=True)


def policy(ca: LocalCA, *allow: str, answers: dict[str, list[str]] | None = None,
           addresses: tuple[str, ...] = ("127.0.0.1",), **options: Any) -> Egress:
    """Egress to ``allow`` with the secret API_KEY bound to api.test, placed by the code (in
    headers and the URL) unless ``header`` is given; every ``*.test`` name is 127.0.0.1 unless
    ``answers`` says otherwise."""
    table = {"api.test": ["127.0.0.1"], "echo.test": ["127.0.0.1"], **(answers or {})}
    return Egress(allow=list(allow), addresses=list(addresses), trust=str(ca.pem),
                  resolver=lambda host: table.get(host, []),
                  secrets={"API_KEY": Secret(KEY, hosts=["api.test"], header=options.pop("header", None),
                                             format=options.pop("format", "{}"), code_may_place=True,
                                             in_url=True)}, **options)


def fetch(sandbox: Executor, url: str, headers: str = "{}", method: str = "GET", body: str = "None") -> str:
    """Code that requests ``url`` the way the sandbox's code would, and ends with ``[status,
    body]`` or ``["error", message]``."""
    if type(sandbox).__name__ == "MontyExecutor":
        return (f"try:\n    r = http_request({method!r}, {url!r}, headers={headers}, body={body})\n"
                "    out = [r['status'], r.get('text', '')]\n"
                "except Exception as e:\n    out = ['error', str(e)]\nout")
    return ("import os, urllib.request, urllib.error\n"
            f"data = {body}\n"
            f"request = urllib.request.Request({url!r}, headers={headers}, method={method!r}, "
            "data=None if data is None else data.encode())\n"
            "try:\n    with urllib.request.urlopen(request, timeout=20) as r:\n"
            "        out = [r.status, r.read().decode()]\n"
            "except urllib.error.HTTPError as e:\n    out = ['error', f'{e.code} {e.reason}']\n"
            "except Exception as e:\n    out = ['error', str(e)]\nout")


async def paced(sandbox: Executor, code: str, egress: Egress) -> ExecResult:
    async with bystander(sandbox) as pace:
        result = await sandbox.run(code, limits=ExecLimits(wall_seconds=30.0, egress=egress))
    assert pace.runs > 0 and pace.wrong == [], "the bystander's runs did not complete"
    assert pace.longest_stall < MAX_STALL, f"the event loop stalled {pace.longest_stall * 1000:.0f} ms"
    assert result.error is None, result
    return result


KEY_HEADER = "{'Authorization': 'Bearer ' + " + "os.environ['API_KEY']}"
PLACEHOLDER_HEADER = "{'Authorization': 'Bearer " + PLACEHOLDER + "'}"


def key_header(sandbox: Executor) -> str:
    """The code's Authorization header: the process sandbox's code reads its environment;
    Monty's has none, so it writes the placeholder."""
    return PLACEHOLDER_HEADER if type(sandbox).__name__ == "MontyExecutor" else KEY_HEADER


@both
async def test_an_allowed_api_gets_the_real_key_and_the_code_only_the_placeholder(
        sandbox: Executor, ca: LocalCA, api: Server) -> None:
    result = await paced(sandbox, fetch(sandbox, f"https://api.test:{api.port}/echo?key={PLACEHOLDER}",
                                        key_header(sandbox)), policy(ca, f"api.test:{api.port}"))
    status, body = result.value
    assert status == 200
    assert api.headers("Authorization") == [f"Bearer {KEY}"]
    assert api.received[0].path == f"/echo?key={KEY}"
    assert KEY not in json.dumps(result.value) and f"Bearer {PLACEHOLDER}" in body  # the echo shows the placeholder
    assert KEY not in json.dumps(result.to_dict())  # nor does the run's record (its calls, its log)
    [record] = result.egress
    assert (record.host, record.status, record.path) == ("api.test", 200, f"/echo?key={PLACEHOLDER}")
    assert record.bytes_out > 0 and record.bytes_in > 0


@both
async def test_a_secret_with_a_header_is_set_whatever_the_code_sent(sandbox: Executor, ca: LocalCA,
                                                                    api: Server) -> None:
    egress = policy(ca, f"api.test:{api.port}", header="X-Api-Key", format="key={}")
    await paced(sandbox, fetch(sandbox, f"https://api.test:{api.port}/echo", "{'X-Api-Key': 'mine'}"), egress)
    assert api.headers("X-Api-Key") == [f"key={KEY}"]


@both
async def test_the_placeholder_sent_to_a_host_not_bound_to_it_arrives_as_the_placeholder(
        sandbox: Executor, ca: LocalCA, api: Server, plain: Server) -> None:
    egress = policy(ca, f"api.test:{api.port}", f"echo.test:{api.port}", f"http://api.test:{plain.port}")
    header = key_header(sandbox)
    await paced(sandbox, fetch(sandbox, f"https://echo.test:{api.port}/echo", header), egress)
    await paced(sandbox, fetch(sandbox, f"http://api.test:{plain.port}/echo", header), egress)  # bound, but not TLS
    assert api.headers("Authorization") == [f"Bearer {PLACEHOLDER}"]
    assert plain.headers("Authorization") == [f"Bearer {PLACEHOLDER}"]


REFUSED = {
    "a host not on the list": ("https://other.test:{https}/echo", "not on this run's egress allow-list"),
    "an IP literal for an allowed name": ("https://127.0.0.1:{https}/echo", "IP address the egress policy does "
                                                                             "not list"),
    "a name that resolves to loopback": ("https://loop.test:{https}/echo", "loopback"),
    "a name that resolves to a private address": ("https://private.test:{https}/echo", "private"),
    "a name that resolves to the metadata address": ("https://metadata.test:{https}/echo", "link-local"),
    "a name that resolves to NAT64 of the metadata address": ("https://nat64.test:{https}/echo",
                                                              "link-local address"),
    "a name that resolves to 6to4 of a private address": ("https://sixtofour.test:{https}/echo", "private address"),
    "http:// to an HTTPS-only host": ("http://api.test:{https}/echo", "HTTPS only"),
    "a CONNECT to another port": ("https://api.test:{other}/echo", "another port"),
}


@both
@pytest.mark.parametrize("row", list(REFUSED))
async def test_a_request_off_the_policy_is_refused_with_a_clear_error(sandbox: Executor, ca: LocalCA, api: Server,
                                                                      row: str) -> None:
    url, why = REFUSED[row]
    answers = {"loop.test": ["127.0.0.2"], "private.test": ["10.20.30.40"], "metadata.test": ["169.254.169.254"],
               "nat64.test": ["64:ff9b::a9fe:a9fe"], "sixtofour.test": ["2002:a00:1::1"]}
    egress = policy(ca, f"api.test:{api.port}", f"loop.test:{api.port}", f"private.test:{api.port}",
                    f"metadata.test:{api.port}", f"nat64.test:{api.port}", f"sixtofour.test:{api.port}",
                    answers=answers)
    result = await paced(sandbox, fetch(sandbox, url.format(https=api.port, other=api.port + 1 if api.port < 65535
                                                            else api.port - 1)), egress)
    assert result.value[0] == "error" and why in result.value[1], result.value
    assert api.received == []
    assert result.egress and result.egress[-1].refused is not None and why in result.egress[-1].refused


@both
async def test_a_name_is_resolved_once_per_request_by_the_host_and_a_later_answer_is_checked_again(
        sandbox: Executor, ca: LocalCA, api: Server) -> None:
    """DNS rebinding: the second answer for the same name is a private address, and the
    request it would carry is refused; of a mixed answer, only the allowed address is used."""
    answers = iter([["10.1.1.1", "127.0.0.1"], ["169.254.169.254"]])
    asked: list[str] = []

    def resolver(host: str) -> list[str]:
        asked.append(host)
        return next(answers)

    egress = Egress(allow=[f"api.test:{api.port}"], addresses=["127.0.0.1"], trust=str(ca.pem), resolver=resolver)
    url = f"https://api.test:{api.port}/echo"
    code = fetch(sandbox, url) + "\nfirst = out\n" + fetch(sandbox, url) + "\n[first, out]"
    result = await paced(sandbox, code, egress)
    first, second = result.value
    assert first[0] == 200 and second[0] == "error" and "link-local" in second[1], result.value
    assert asked == ["api.test", "api.test"] and len(api.received) == 1


@both
async def test_the_egress_budget_stops_a_large_upload(sandbox: Executor, ca: LocalCA, api: Server) -> None:
    egress = policy(ca, f"api.test:{api.port}", budget_bytes=64 * 1024)
    result = await paced(sandbox, fetch(sandbox, f"https://api.test:{api.port}/upload", method="POST",
                                        body="'x' * 200_000"), egress)
    assert result.value[0] == "error" and "egress budget" in result.value[1], result.value
    assert api.received == []


@both
@pytest.mark.parametrize("path", ["/bytes/300000", "/bytes/300000?chunked=1"], ids=["with a length", "chunked"])
async def test_the_egress_budget_stops_a_large_download(sandbox: Executor, ca: LocalCA, api: Server,
                                                        path: str) -> None:
    egress = policy(ca, f"api.test:{api.port}", budget_bytes=64 * 1024)
    result = await paced(sandbox, fetch(sandbox, f"https://api.test:{api.port}{path}"), egress)
    assert result.value[0] == "error" and "egress budget" in result.value[1], result.value
    assert sum(r.bytes_in for r in result.egress) <= 64 * 1024 + 65536  # cut within one read of the budget


@process_only
async def test_the_code_cannot_go_around_the_proxy(sandbox: Executor, ca: LocalCA, api: Server) -> None:
    """Straight to the server's address, a name of its own, or another port of the proxy's
    loopback: nothing is there but the proxy."""
    code = ("import socket\nout = []\n"
            f"for target in [('127.0.0.1', {api.port}), ('127.0.0.1', 3129), ('10.0.0.1', 443)]:\n"
            "    try:\n        socket.create_connection(target, timeout=2).close()\n        out.append('connected')\n"
            "    except OSError as e:\n        out.append(type(e).__name__)\n"
            "try:\n    socket.getaddrinfo('api.test', 443)\n    out.append('resolved')\n"
            "except OSError as e:\n    out.append(type(e).__name__)\nout")
    result = await paced(sandbox, code, policy(ca, f"api.test:{api.port}"))
    assert "connected" not in result.value and "resolved" not in result.value, result.value
    assert api.received == []


MEMORY_SCAN = """
import ctypes, hashlib, re
def holds(prefix, digest, size):
    found = False
    for line in open('/proc/self/maps'):
        fields = line.split()
        span, perms, path = fields[0], fields[1], (fields[5] if len(fields) > 5 else '')
        if not perms.startswith('r') or path not in ('', '[heap]', '[stack]'):
            continue  # a file's pages hold the file: the code can read those anyway
        start, end = (int(x, 16) for x in span.split('-'))
        data = ctypes.string_at(start, end - start)
        for hit in re.finditer(re.escape(prefix), data):
            if hashlib.sha256(data[hit.start():hit.start() + size]).hexdigest() == digest:
                found = True
    return found
def readable(path):
    try:
        return open(path, 'rb').read()
    except PermissionError:
        return b''
"""


@process_only
async def test_the_secret_is_nowhere_in_the_sandbox(sandbox: Executor, ca: LocalCA, api: Server) -> None:
    """After a request that used it: not in the code's environment or any process's in the
    sandbox that /proc lets it read, not in a forked child's, not in the code's own memory
    (every anonymous mapping: where a core dump would find it; core dumps are off besides).
    The same memory scan finds the secret where it is given to the code as an input: the scan
    can see it."""
    import hashlib

    prefix, digest = KEY[:8].encode(), hashlib.sha256(KEY.encode()).hexdigest()
    scan = MEMORY_SCAN + f"\nPREFIX, DIGEST, SIZE = {prefix!r}, {digest!r}, {len(KEY)}\n"
    code = (fetch(sandbox, f"https://api.test:{api.port}/echo", KEY_HEADER) + "\nstatus = out[0]\n" + scan +
            "import glob, resource\n"
            "environs = b''.join(readable(p) for p in glob.glob('/proc/[0-9]*/environ'))\n"
            "read, write = os.pipe()\n"
            "child = os.fork()\n"
            "if child == 0:\n"
            "    os.write(write, b'1' if PREFIX in str(os.environ).encode() else b'0')\n"
            "    os._exit(0)\n"
            "os.waitpid(child, 0)\n"
            "[status, os.environ['API_KEY'], PREFIX in environs, os.read(read, 1).decode(),\n"
            " holds(PREFIX, DIGEST, SIZE), resource.getrlimit(resource.RLIMIT_CORE)]")
    result = await paced(sandbox, code, policy(ca, f"api.test:{api.port}"))
    assert result.value == [200, PLACEHOLDER, False, "0", False, [0, 0]], result.value
    assert api.headers("Authorization") == [f"Bearer {KEY}"]
    control = await sandbox.run(scan + "\nsecret = ''.join(reversed(GIVEN))\nholds(PREFIX, DIGEST, SIZE)",
                                inputs={"GIVEN": KEY[::-1]})
    assert control.value is True, control


@both
async def test_a_run_without_egress_has_no_http_request_tool_and_no_route_out(sandbox: Executor,
                                                                             api: Server) -> None:
    result = await sandbox.run(fetch(sandbox, f"https://api.test:{api.port}/echo"), limits=ExecLimits(wall_seconds=20))
    assert result.value is not None and result.value[0] == "error", result
    assert api.received == []


def test_a_policy_that_cannot_hold_is_refused_naming_what_is_wrong() -> None:
    with pytest.raises(InvalidArgument, match="list of hosts"):
        Egress(allow="api.example.com")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match="not a port"):
        Egress(allow=["api.example.com:99999"])
    with pytest.raises(InvalidArgument, match="URL path"):
        Egress(allow=["https://api.example.com/v1"])
    with pytest.raises(InvalidArgument, match="does not list for HTTPS"):
        Egress(allow=["http://api.example.com"], secrets={"K": Secret("v", hosts=["api.example.com"])})
    with pytest.raises(InvalidArgument, match="environment variable name"):
        Egress(allow=["a.example"], secrets={"not a name": Secret("v", hosts=["a.example"])})
    with pytest.raises(InvalidArgument, match=r"Egress\.addresses"):
        Egress(allow=["a.example"], addresses=["not an address"])
    assert "hunter2" not in repr(Secret("hunter2", hosts=["a.example"]))


async def test_a_tool_of_the_same_name_is_refused_in_a_run_with_egress(ca: LocalCA, tmp_path: Path) -> None:
    from ringzero.providers.executors import MontyExecutor

    executor = MontyExecutor()
    try:
        with pytest.raises(InvalidArgument, match="http_request"):
            await executor.run("1", tools={"http_request": lambda: 1},
                               limits=ExecLimits(egress=Egress(allow=["a.example"])))
    finally:
        await executor.aclose()


PAID: list[int] = []
HANG_IN_PAY: list[bool] = []


async def pay(amount: int) -> int:
    PAID.append(amount)
    if HANG_IN_PAY:
        await asyncio.Event().wait()
    return amount


async def orders_then_pays(ctx: Context, port: int, trust: str) -> Any:
    """A program that posts an order to an API with its key, then pays, from code."""
    egress = Egress(allow=[f"api.test:{port}"], addresses=["127.0.0.1"], trust=trust,
                    resolver=lambda host: ["127.0.0.1"], secrets={"API_KEY": Secret(KEY, hosts=["api.test"])})
    code = (f"r = http_request('POST', 'https://api.test:{port}/orders', headers={PLACEHOLDER_HEADER}, "
            "body='one order')\npay(7)\nr['status']")
    try:
        out = await ctx.exec(code, tools={"pay": pay}, limits=ExecLimits(egress=egress))
    except ToolInDoubt as exc:
        return {"in doubt": exc.tool}
    return out.value


async def test_a_request_made_from_code_is_journaled_without_its_secret_and_never_sent_twice(
        tmp_path: Path, ca: LocalCA, api: Server) -> None:
    """The host dies in the tool called after the request: the resumed program's request is
    answered from the journal (the server saw one), the tool in flight is in doubt, and the
    store holds the placeholder, never the key."""
    PAID.clear()
    HANG_IN_PAY.append(True)
    db = tmp_path / "state.db"
    try:
        async with Kernel(checkpointer=SqliteCheckpointer(db)) as kernel:
            await kernel.spawn(orders_then_pays, api.port, str(ca.pem))
            async with fail_after(20):
                while not PAID:
                    await asyncio.sleep(0.01)
    finally:
        HANG_IN_PAY.clear()
    stored = await asyncio.to_thread(lambda: b"".join(p.read_bytes() for p in tmp_path.glob("state.db*")))
    assert b"http_request(" in stored and KEY.encode() not in stored
    async with Kernel(checkpointer=SqliteCheckpointer(db)) as kernel:
        [handle] = await kernel.recover()
        assert await handle.wait(timeout=30) == {"in doubt": "pay"}
    assert [(r.method, r.path, r.body) for r in api.received] == [("POST", "/orders", b"one order")]
    assert api.headers("Authorization") == [f"Bearer {KEY}"]


def test_a_policy_becomes_microsandboxs_own_network_scope_for_microvms() -> None:
    """A microVM cannot boot on every host: the policy is checked as the SDK objects it becomes
    (what ``MicrosandboxExecutor(egress=...)`` passes to ``Sandbox.create``)."""
    from ringzero.providers.executors.microsandbox_egress import microvm_network

    network, secrets = microvm_network(Egress(
        allow=["api.example.com", "*.example.org:8443", "10.0.0.1:443"],
        secrets={"API_KEY": Secret(KEY, hosts=["api.example.com"], header="Authorization")}))
    policy = network._to_dict()["custom_policy"]
    assert policy["default_egress"] == policy["default_ingress"] == "deny"
    allowed = [(r["destination_kind"], r["destination"], r["protocol"], r["port"]) for r in policy["rules"]]
    assert allowed == [("group", "host", "udp", "53"), ("group", "host", "tcp", "53"),
                       ("domain", "api.example.com", "tcp", "443"), ("domain_suffix", ".example.org", "tcp", "8443"),
                       ("ip", "10.0.0.1", "tcp", "443")]
    assert [s._to_dict() for s in secrets] == [{"env_var": "API_KEY", "value": KEY, "allow": ["api.example.com"],
                                                "placeholder": PLACEHOLDER,
                                                "substitution": {"header_fields": ["authorization"]}}]


@process_only
@pytest.mark.parametrize("client", ["httpx", "requests"])
async def test_common_clients_find_the_proxy_and_the_runs_ca_themselves(sandbox: Executor, ca: LocalCA,
                                                                      api: Server, client: str) -> None:
    pytest.importorskip(client, reason=f"{client} is not installed in this environment")
    code = (f"import os, {client}\n"
            f"r = {client}.get('https://api.test:{api.port}/echo', "
            "headers={'Authorization': 'Bearer ' + os.environ['API_KEY']}, timeout=20)\n"
            "[r.status_code, r.json()['headers'].get('authorization')]")
    result = await paced(sandbox, code, policy(ca, f"api.test:{api.port}"))
    assert result.value == [200, f"Bearer {PLACEHOLDER}"]  # the echo, as the code is shown it
    assert api.headers("Authorization") == [f"Bearer {KEY}"]


@process_only
async def test_a_flood_of_connections_to_the_proxy_holds_at_most_its_cap_on_the_host(
        sandbox: Executor, ca: LocalCA, api: Server) -> None:
    """Each connection the code opens costs the host a descriptor: past ``MAX_CLIENTS`` held at
    once, the host closes the next as it arrives; once the code lets them go, a request goes through."""
    from ringzero.providers.egress.proxy import MAX_CLIENTS

    opened = MAX_CLIENTS + 24  # within the run's 64 descriptors
    code = ("import socket\n"
            f"held = [socket.create_connection(('127.0.0.1', 3128)) for _ in range({opened})]\n"
            "import select, time\ntime.sleep(0.5)\n"
            "ready, _, _ = select.select(held, [], [], 0)\n"
            "closed = sum(s.recv(1) == b'' for s in ready)\n"
            "for s in held:\n    s.close()\n"
            "time.sleep(0.2)\n" + fetch(sandbox, f"https://api.test:{api.port}/echo") + "\n[closed, out[0]]")
    result = await paced(sandbox, code, policy(ca, f"api.test:{api.port}"))
    closed, status = result.value
    assert closed == opened - MAX_CLIENTS and status == 200, result.value


@both
async def test_the_secret_reflected_in_a_reason_or_header_or_quoted_by_an_error_is_shown_as_its_placeholder(
        sandbox: Executor, ca: LocalCA, api: Server) -> None:
    url = f"https://api.test:{api.port}"
    if type(sandbox).__name__ == "MontyExecutor":
        code = (f"r = http_request('GET', '{url}/reflect', headers={PLACEHOLDER_HEADER})\n"
                "seen = [r['reason'], dict(r['headers'])['x-seen']]\n"
                f"try:\n    http_request('GET', '{url}/echo', headers={{'X-Bad': '{PLACEHOLDER}\\r\\nEvil: 1'}})\n"
                "except Exception as e:\n    seen.append(str(e))\nseen")
    else:
        code = ("import http.client, os, ssl\n"
                f"c = http.client.HTTPSConnection('127.0.0.1', 3128, context=ssl.create_default_context())\n"
                f"c.set_tunnel('api.test', {api.port})\n"
                "c.request('GET', '/reflect', headers={'Authorization': 'Bearer ' + os.environ['API_KEY']})\n"
                "r = c.getresponse()\nr.read()\n"
                "[r.reason, r.getheader('X-Seen')]")
    result = await paced(sandbox, code, policy(ca, f"api.test:{api.port}"))
    assert KEY not in json.dumps(result.to_dict())
    assert result.value[:2] == [f"Bearer {PLACEHOLDER}"] * 2, result.value
    assert api.headers("Authorization")[0] == f"Bearer {KEY}"
    if len(result.value) > 2:  # Monty's: a header that would split the request is refused, naming the placeholder
        assert "not valid HTTP" in result.value[2] and len(api.received) == 1


@process_only
async def test_answers_without_a_body_keep_the_clients_connection_going(sandbox: Executor, ca: LocalCA,
                                                                        api: Server) -> None:
    """A 204 and a HEAD's answer carry no body: the proxy sends none, and the client's next
    request on the same tunnel is answered."""
    code = ("import http.client, ssl\n"
            "c = http.client.HTTPSConnection('127.0.0.1', 3128, context=ssl.create_default_context())\n"
            f"c.set_tunnel('api.test', {api.port})\nout = []\n"
            "for method, path in [('GET', '/empty'), ('HEAD', '/echo'), ('GET', '/echo')]:\n"
            "    c.request(method, path)\n    r = c.getresponse()\n    out.append([r.status, len(r.read())])\nout")
    result = await paced(sandbox, code, policy(ca, f"api.test:{api.port}"))
    assert result.value[:2] == [[204, 0], [200, 0]] and result.value[2][0] == 200 and result.value[2][1] > 0
    assert [r.method for r in api.received] == ["GET", "HEAD", "GET"]


async def posts_twice_without_tools(ctx: Context, port: int, trust: str) -> Any:
    """The sandboxes page's form: egress, no tools; two POSTs from code, a second of work between them."""
    egress = Egress(allow=[f"api.test:{port}"], addresses=["127.0.0.1"], trust=trust,
                    resolver=lambda host: ["127.0.0.1"])
    url = f"https://api.test:{port}/orders"
    code = (f"first = http_request('POST', '{url}', body='10')\nx = 0\nfor i in range(20_000_000):\n    x += i\n"
            f"second = http_request('POST', '{url}', body='20')\n[first['status'], second['status']]")
    out = await ctx.exec(code, limits=ExecLimits(egress=egress, wall_seconds=30))
    return out.value if out.error is None else out.error.message


@pytest.mark.parametrize("executor", ["monty", "process"])
async def test_a_run_with_egress_and_no_tools_journals_its_requests_and_never_sends_one_twice(
        tmp_path: Path, ca: LocalCA, api: Server, executor: str) -> None:
    """The host stops after the first POST, while the code works: the resumed run's first POST
    is answered from the journal, so the server sees each POST once."""
    from ringzero.providers.executors import MontyExecutor, ProcessExecutor

    def kernel() -> Kernel:
        made = MontyExecutor() if executor == "monty" else ProcessExecutor()
        return Kernel(checkpointer=SqliteCheckpointer(tmp_path / "state.db"), executor=made)

    async with kernel() as first:
        await first.spawn(posts_twice_without_tools, api.port, str(ca.pem))
        async with fail_after(20):
            while not api.received:
                await asyncio.sleep(0.01)
        # the answer's way back (proxy, scrub, journal) takes milliseconds; the code's loop after
        # it a second or more: the host stops while the code works, not while the answer travels
        await asyncio.sleep(0.3)
    async with kernel() as second:
        [handle] = await second.recover()
        assert await handle.wait(timeout=30) == [200, 200]
    assert [(r.method, r.body) for r in api.received] == [("POST", b"10"), ("POST", b"20")]


TRANSLATED = {
    "64:ff9b::a9fe:a9fe": "169.254.169.254, a link-local",  # NAT64 (RFC 6052) of the metadata address
    "64:ff9b::a00:1": "10.0.0.1, a private",
    "64:ff9b:1::a9fe:a9fe": "a local-use NAT64 one",  # RFC 8215: where the IPv4 sits is the operator's
    "2002:a9fe:a9fe::1": "169.254.169.254, a link-local",  # 6to4
    "2001:0:4136:e378:8000:63bf:3fff:fdd2": "192.0.2.45, a private",  # Teredo: its client
    "::a9fe:a9fe": "169.254.169.254, a link-local",  # IPv4-compatible
    "::ffff:0:a00:1": "10.0.0.1, a private",  # SIIT, IPv4-translated
    "::ffff:127.0.0.1": "127.0.0.1, a loopback",  # IPv4-mapped
    "100::1": "100::1, a private",  # discard-only
    "2001:db8::1": "2001:db8::1, a private",  # documentation
}


@pytest.mark.parametrize("address", list(TRANSLATED))
def test_an_ipv6_form_that_carries_an_ipv4_address_is_judged_by_that_address(address: str) -> None:
    """Python's ipaddress calls NAT64, 6to4, Teredo, compatible and SIIT forms global: each is
    refused where the IPv4 address it carries would be; public ones pass, listed ones pass."""
    from ringzero.providers.egress.engine import EgressRun

    run = EgressRun(Egress(allow=["a.test"]))
    refusal = run.address_refusal(address)
    assert refusal is not None and TRANSLATED[address] in refusal, refusal
    for public in ("64:ff9b::808:808", "2002:808:808::1", "2606:4700:4700::1111", "8.8.8.8"):
        assert run.address_refusal(public) is None, public
    assert EgressRun(Egress(allow=["a.test"], addresses=["64:ff9b::/96"])).address_refusal("64:ff9b::a00:1") is None
