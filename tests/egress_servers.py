r"""Servers the egress tests start on 127.0.0.1: HTTPS with a test CA (trustme), and plain HTTP.

Each records what it received (method, path, headers, body), so a test can say what arrived
and what never did. ``GET /echo`` answers with the request's path and headers as JSON (gzipped
where the request accepts gzip; ``?style=escaped``: every character but letters and digits as
``\uXXXX`` and ``/`` as ``\/``; ``?style=upper``: upper-cased; ``?cut=N``: its first N
characters), ``GET /gzip`` the same, gzipped whatever was asked, ``GET /missing...`` 404 quoting the
path, ``GET /reflect`` puts its Authorization header in its reason phrase, an ``X-Seen`` header
and an ``X-Seen-<token>`` header's name, ``GET /badline`` a status line h11 refuses, quoting the
Authorization header, ``GET /empty`` answers 204, ``HEAD`` 200 with a length and no body;
``GET /bytes/N`` with N bytes (``?chunked=1``: without a length); ``POST`` answers with the body's
length.
"""

from __future__ import annotations

import gzip
import http.server
import json
import ssl
import threading
import time
import urllib.parse
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import trustme


@dataclass
class Received:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes


@dataclass
class Server:
    port: int
    scheme: str
    received: list[Received] = field(default_factory=list)

    def headers(self, name: str) -> list[str | None]:
        """Header ``name``'s value in each request received (names are case-insensitive)."""
        return [r.headers.get(name.lower()) for r in self.received]


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True
    server: Any

    def _record(self, body: bytes = b"") -> None:
        self.server.record.received.append(Received(self.command, self.path,
                                                     {k.lower(): v for k, v in self.headers.items()}, body))

    def _send(self, body: bytes, chunked: bool = False, status: int = 200, encoding: str | None = None) -> None:
        self.send_response(status)
        if encoding is not None:
            self.send_header("Content-Encoding", encoding)
        if chunked:
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for start in range(0, len(body), 16384):
                part = body[start:start + 16384]
                self.wfile.write(b"%x\r\n%s\r\n" % (len(part), part))
            self.wfile.write(b"0\r\n\r\n")
        else:
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    def do_GET(self) -> None:
        self._record()
        if self.path.startswith("/empty"):
            self.send_response(204)
            self.end_headers()
        elif self.path.startswith("/reflect"):  # the key back in the reason phrase, a header and a header's name
            reflected = self.headers.get("Authorization", "")
            self.send_response(200, reflected)
            self.send_header("X-Seen", reflected)
            self.send_header("X-Seen-" + reflected.rpartition(" ")[2], "1")
            self.send_header("Content-Length", "0")
            self.end_headers()
        elif self.path.startswith("/badline"):  # h11 refuses the line, and its error quotes it
            self.wfile.write(b"HTTP/1.1 2x0 " + self.headers.get("Authorization", "").encode() + b"\r\n\r\n")
            self.close_connection = True
        elif self.path.startswith("/missing"):
            self._send(f"no such path: {self.path}".encode(), status=404)
        elif self.path.startswith("/bytes/"):
            size = int(self.path.split("/")[2].split("?")[0])
            self._send(b"x" * size, chunked="chunked=1" in self.path)
        else:
            self._send_echo()

    def _send_echo(self) -> None:
        query = urllib.parse.parse_qs(urllib.parse.urlsplit(self.path).query)
        text = json.dumps({"path": self.path, "headers": dict(self.headers.items())})
        style = query.get("style", [""])[0]
        if style == "escaped":  # as some servers write JSON: every sign escaped, and the solidus
            text = "".join(c if c.isalnum() or c in '{}":, ' else "\\/" if c == "/" else f"\\u{ord(c):04X}"
                           for c in text)
        elif style == "upper":
            text = text.upper()
        if "cut" in query:
            text = text[:int(query["cut"][0])]
        body = text.encode()
        if self.path.startswith("/gzip") or "gzip" in self.headers.get("Accept-Encoding", ""):
            self._send(gzip.compress(body), encoding="gzip")
        else:
            self._send(body)

    def do_HEAD(self) -> None:
        self._record()
        self.send_response(200)
        self.send_header("Content-Length", "5")
        self.end_headers()

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self._record(body)
        if "hold" in self.path:  # an answer that takes a while: a host killed meanwhile leaves it in flight
            time.sleep(2)
        self._send(json.dumps({"received": len(body)}).encode())

    def log_message(self, *args: object) -> None:
        pass


@dataclass
class LocalCA:
    ca: trustme.CA
    pem: Path


def local_ca(folder: Path) -> LocalCA:
    ca = trustme.CA()
    pem = folder / "test-ca.pem"
    ca.cert_pem.write_to_path(str(pem))
    return LocalCA(ca, pem)


@contextmanager
def serving(ca: LocalCA | None, names: tuple[str, ...] = ("api.test", "echo.test", "127.0.0.1")) -> Iterator[Server]:
    """A threaded server on 127.0.0.1 (HTTPS with a certificate for ``names`` where ``ca`` is
    given, else plain HTTP), for the block."""
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    httpd.daemon_threads = True
    if ca is not None:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ca.ca.issue_cert(*names).configure_cert(context)
        httpd.socket = context.wrap_socket(httpd.socket, server_side=True)
    record = Server(httpd.server_address[1], "https" if ca else "http")
    httpd.record = record  # type: ignore[attr-defined]
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield record
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(5)


@pytest.fixture(scope="module")
def ca(tmp_path_factory: pytest.TempPathFactory) -> LocalCA:
    """A test CA the egress tests' servers hold certificates of (and their policies trust)."""
    return local_ca(tmp_path_factory.mktemp("egress-ca"))


@pytest.fixture
def api(ca: LocalCA) -> Iterator[Server]:
    """An HTTPS server for ``api.test`` and ``echo.test``."""
    with serving(ca) as server:
        yield server


@pytest.fixture
def plain() -> Iterator[Server]:
    """A plain HTTP server."""
    with serving(None) as server:
        yield server
