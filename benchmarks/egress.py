"""What the egress proxy adds to a small HTTPS request, against the same request made directly.

An HTTPS server (a test CA, HTTP/1.1 keep-alive, a 20-byte answer) runs in a process of its
own on 127.0.0.1. One client process, the same ``http.client`` code for every path, makes
small GET requests on one kept connection and times each:

- **direct**: straight to the server (the peer);
- **through the proxy**: a CONNECT tunnel to ringzero's egress proxy (``EgressProxy`` with the
  run's ``http_request`` tool behind it: the policy, the host's name resolution, the run's own
  CA, the record of each request as a tool call, a kept upstream connection), listening here on
  the host's loopback;
- **from the process sandbox**: the same client code run by ``ProcessExecutor`` with
  ``ExecLimits(egress=...)``, through the proxy listening in the run's own network namespace.

Paired rounds: the first two paths in turn, each round's medians compared in that round.

    .venv/bin/python benchmarks/egress.py [--requests 300] [--rounds 7]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import trustme
from _progress import step
from rich.console import Console
from rich.table import Table

from ringzero import Egress, ExecLimits, Secret
from ringzero.core.contract.types import ExecResult
from ringzero.providers.egress.certificates import RunAuthority
from ringzero.providers.egress.proxy import EgressProxy
from ringzero.providers.executors import ProcessExecutor
from ringzero.providers.executors.boundary import HostTools

SERVER = """
import http.server, ssl, sys
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # headers and body go in two writes: no 40 ms wait for an ACK
    def do_GET(self):
        self.send_response(200); self.send_header("Content-Length", "20"); self.end_headers()
        self.wfile.write(b"0123456789abcdefghij")
    def log_message(self, *a): pass
httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
context.load_cert_chain(sys.argv[1])
httpd.socket = context.wrap_socket(httpd.socket, server_side=True)
print(httpd.server_address[1], flush=True)
httpd.serve_forever()
"""

CLIENT = """
import http.client, json, ssl, time
def timed(port, n, proxy=None, cafile=None):
    context = ssl.create_default_context(cafile=cafile)
    if proxy:
        connection = http.client.HTTPSConnection("127.0.0.1", proxy, context=context)
        connection.set_tunnel("api.test", port)
    else:
        connection = http.client.HTTPSConnection("api.test", port, context=context)
    times = []
    for _ in range(n + 20):
        start = time.perf_counter()
        connection.request("GET", "/small")
        body = connection.getresponse().read()
        times.append(time.perf_counter() - start)
        assert body == b"0123456789abcdefghij", body
    connection.close()
    return times[20:]
"""


def direct_client() -> str:
    """The client for the direct path resolves api.test to 127.0.0.1 (it has no proxy to ask)."""
    return CLIENT + textwrap.dedent("""
        import socket, sys
        real = socket.create_connection
        socket.create_connection = lambda address, *a, **k: real(("127.0.0.1", address[1]), *a, **k)
        port, n, proxy, cafile = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]) or None, sys.argv[4]
        print(json.dumps(timed(port, n, proxy, cafile)))
    """)


async def client(port: int, n: int, proxy: int, cafile: str) -> list[float]:
    process = await asyncio.create_subprocess_exec(sys.executable, "-c", direct_client(), str(port), str(n),
                                                   str(proxy), cafile, stdout=subprocess.PIPE)
    out, _ = await process.communicate()
    return list(json.loads(out))


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="ringzero-bench-egress-") as name:
        await measure(Path(name), args)


async def measure(folder: Path, args: argparse.Namespace) -> None:
    ca = trustme.CA()
    ca.cert_pem.write_to_path(str(folder / "ca.pem"))
    ca.issue_cert("api.test").private_key_and_cert_chain_pem.write_to_path(str(folder / "server.pem"))
    server = await asyncio.create_subprocess_exec(sys.executable, "-c", SERVER, str(folder / "server.pem"),
                                                  stdout=subprocess.PIPE)
    assert server.stdout is not None
    port = int((await server.stdout.readline()).decode())
    egress = Egress(allow=[f"api.test:{port}"], addresses=["127.0.0.1"], trust=str(folder / "ca.pem"),
                    resolver=lambda host: ["127.0.0.1"],  # with a key, as an API call has: added, and scrubbed
                    secrets={"API_KEY": Secret("sk-bench-7Qv2xW9pL4mZ8tR3nB6yH1cJ5dF0gK", hosts=["api.test"])})
    host = HostTools({}, ExecLimits(egress=egress, tool_bytes=1 << 20))
    assert host.egress is not None
    authority = RunAuthority()
    (folder / "run-ca.pem").write_text(authority.pem)
    listener = socket.create_server(("127.0.0.1", 0))
    proxy = EgressProxy(listener, host.egress, host.call, authority)
    proxy.start()
    rows: dict[str, list[float]] = {"direct": [], "proxy": []}
    overheads = []
    try:
        for index in range(args.rounds):
            step(f"round {index + 1} of {args.rounds}")
            direct = statistics.median(await client(port, args.requests, 0, str(folder / "ca.pem")))
            proxied = statistics.median(await client(port, args.requests, listener.getsockname()[1],
                                                     str(folder / "run-ca.pem")))
            rows["direct"].append(direct)
            rows["proxy"].append(proxied)
            overheads.append(proxied - direct)
        step("from the process sandbox")
        sandboxed = await from_sandbox(port, args.requests, egress)
    finally:
        await proxy.aclose()
        host.ended()
        server.kill()
        await server.wait()
    show(rows, overheads, sandboxed, args)


async def from_sandbox(port: int, n: int, egress: Egress) -> list[float]:
    executor = ProcessExecutor()
    try:
        code = CLIENT + f"\ntimed({port}, {n}, 3128)"  # HTTPS_PROXY's port; SSL_CERT_FILE is the run's CA
        result: ExecResult = await executor.run(code, limits=ExecLimits(egress=egress, wall_seconds=120))
    finally:
        await executor.aclose()
    if result.error is not None:
        raise SystemExit(f"the sandboxed client failed: {result.error}")
    return list(result.value)  # type: ignore[arg-type]


def show(rows: dict[str, list[float]], overheads: list[float], sandboxed: list[float],
         args: argparse.Namespace) -> None:
    table = Table(title=f"A small HTTPS GET on a kept connection: median of {args.requests} requests, "
                        f"{args.rounds} paired rounds ({os.cpu_count()} CPUs)")
    table.add_column("path")
    table.add_column("median µs", justify="right")
    table.add_column("added over direct, median of rounds µs", justify="right")
    table.add_row("direct to the server (the peer)", f"{statistics.median(rows['direct']) * 1e6:,.0f}", "-")
    table.add_row("through ringzero's egress proxy", f"{statistics.median(rows['proxy']) * 1e6:,.0f}",
                  f"[bold]+{statistics.median(overheads) * 1e6:,.0f}[/bold] (rounds {min(overheads) * 1e6:,.0f} to "
                  f"{max(overheads) * 1e6:,.0f})")
    table.add_row("from the process sandbox, through the proxy in its namespace",
                  f"{statistics.median(sandboxed) * 1e6:,.0f}",
                  f"+{(statistics.median(sandboxed) - statistics.median(rows['direct'])) * 1e6:,.0f} (one pass)")
    Console().print(table)


if __name__ == "__main__":
    asyncio.run(main())
