"""The process sandbox's one route out: an HTTP proxy on the host, listening inside the run.

The run's init makes a listening socket on 127.0.0.1 in the run's own network namespace
(the process sandbox's ``_mounts.EGRESS_PORT``; nothing else is up there) and hands it to the
host before the code starts; the host accepts on it, so connections from the code land here,
in the host's process, and nowhere else. The code's clients find it through ``HTTP_PROXY`` and
``HTTPS_PROXY``, and trust the run's CA (``certificates``) through ``SSL_CERT_FILE`` and its kin
(``environment``).

- ``CONNECT host:port`` is answered only for a route the policy allows over HTTPS; the proxy
  then terminates the run's TLS with a certificate from the run's CA, reads each request in
  the tunnel and sends it on as ``https://host:port/...``;
- a plain request in absolute form (``GET http://host/...``) is sent on as it is, where the
  policy allows plain HTTP to that host.

Every request becomes one call of the run's ``http_request`` tool (``engine``) through the
run's ``HostTools``, so it is checked, charged, journaled and recorded like any tool call made
from code. A refusal is answered with a status (403 by the policy, 502 for a failure upstream)
whose reason phrase and body say why, so ``urllib``'s error names it. Requests are read and
answered whole; ``h11`` speaks HTTP on both sides.

The proxy is a lever on the host, so it is bounded before it reads: a request is judged from its
head (its route, the length it declares against the budget) before a byte of its body is read;
the bodies a run's connections hold at once count against what is left of its budget; a tunnel's
certificate is issued off the loop, at a bounded rate of new names (``certificates``).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import socket
import ssl
import urllib.parse
from collections.abc import Awaitable, Callable
from typing import Any

import h11

from ringzero.core.contract.egress import Egress
from ringzero.core.support.timeouts import cancel_and_wait, fail_after
from ringzero.providers.egress.certificates import RunAuthority, TooManyNames
from ringzero.providers.egress.engine import TOOL_NAME, EgressRun

__all__ = ["MAX_CLIENTS", "EgressProxy", "environment"]

CA_FILE = ".ringzero-egress-ca.pem"
"""The run's CA certificate, written in its scratch directory before the code starts."""
_HEAD_BYTES = 64 * 1024
MAX_CLIENTS = 32
"""Connections from one run's code served at once; one past them is closed as it arrives."""

Call = Callable[[str, list[Any], dict[str, Any]], Awaitable[tuple[bool, Any]]]
"""``HostTools.call``: ``(True, result)`` or ``(False, ShownError)``."""


def environment(egress: Egress, scratch: str, port: int) -> dict[str, str]:
    """What a run's environment gains for egress: the proxy for every common client, the run's
    CA as the one it trusts, and each secret's placeholder."""
    proxy = f"http://127.0.0.1:{port}"
    ca = f"{scratch}/{CA_FILE}"
    return {"HTTP_PROXY": proxy, "HTTPS_PROXY": proxy, "http_proxy": proxy, "https_proxy": proxy,
            "SSL_CERT_FILE": ca, "REQUESTS_CA_BUNDLE": ca, "CURL_CA_BUNDLE": ca, "PIP_CERT": ca,
            "NODE_EXTRA_CA_CERTS": ca, **egress.placeholders()}


class EgressProxy:
    """Serves one run's listening socket until ``aclose``."""

    def __init__(self, listener: socket.socket, run: EgressRun, call: Call, authority: RunAuthority) -> None:
        self.listener = listener
        self.run = run
        self.call = call
        self.authority = authority
        self._one_at_a_time = asyncio.Lock()  # a run's calls are journaled in order, as its code made them
        self._buffered = 0
        """Bytes of request bodies held now, across the run's connections (bounded by its budget's remainder)."""
        self._clients: set[asyncio.Task[None]] = set()
        self._accepting: asyncio.Task[None] | None = None

    def start(self) -> None:
        self.listener.setblocking(False)
        self._accepting = asyncio.get_running_loop().create_task(self._accept())

    async def _accept(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                client, _ = await loop.sock_accept(self.listener)
            except OSError:  # the host is out of descriptors for now: the code's client waits in the backlog
                await asyncio.sleep(0.05)
                continue
            if len(self._clients) >= MAX_CLIENTS:  # a run's code cannot take the host's descriptors
                client.close()
                continue
            task = loop.create_task(self._serve(client))
            self._clients.add(task)
            task.add_done_callback(self._clients.discard)

    async def aclose(self) -> None:
        """Stop accepting, end every connection, close the listening socket."""
        tasks = [t for t in (self._accepting, *self._clients) if t is not None]
        await cancel_and_wait(tasks)
        self.listener.close()

    async def _serve(self, client: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        try:
            connection = h11.Connection(h11.SERVER, max_incomplete_event_size=_HEAD_BYTES)
            request = await _next_request(connection, lambda: loop.sock_recv(client, 65536))
            if request is None:
                return
            if request.method == b"CONNECT":
                await self._tunnel(client, connection, request)
                return
            reader, writer = await asyncio.open_connection(sock=client)
            try:
                await self._requests(connection, request, reader, writer, None)
            finally:
                await _end(writer)
        except (OSError, h11.ProtocolError, asyncio.IncompleteReadError):
            pass  # the code's client went away or spoke nonsense: its connection ends
        finally:
            client.close()

    async def _tunnel(self, client: socket.socket, connection: h11.Connection, request: h11.Request) -> None:
        loop = asyncio.get_running_loop()
        host, _, port_text = request.target.decode("latin-1").rpartition(":")
        host = host[1:-1] if host.startswith("[") else host
        refusal = "a CONNECT names host:port" if not port_text.isdigit() else \
            self.run.route_refusal("https", host, int(port_text))
        if refusal is None and not isinstance(connection.next_event(), h11.EndOfMessage):
            refusal = "a CONNECT has no body"
        if refusal is not None:
            self.run.log_refusal("CONNECT", "https", host, int(port_text) if port_text.isdigit() else 0, refusal)
            await loop.sock_sendall(client, _refusal(connection, 403, refusal))
            return
        name = self.run.normal(host)
        try:
            context = await self.authority.context_for(name)
        except TooManyNames as exc:
            self.run.log_refusal("CONNECT", "https", host, int(port_text), str(exc))
            await loop.sock_sendall(client, _refusal(connection, 429, str(exc)))
            return
        await loop.sock_sendall(client, connection.send(h11.Response(status_code=200, headers=[],
                                                                     reason=b"Connection established")))
        if connection.trailing_data[0]:
            return  # the client spoke before the tunnel was open: no TLS follows
        reader = asyncio.StreamReader()
        protocol = asyncio.StreamReaderProtocol(reader)
        transport, _ = await loop.connect_accepted_socket(lambda: protocol, client, ssl=context,
                                                          ssl_handshake_timeout=30)
        writer = asyncio.StreamWriter(transport, protocol, reader, loop)
        try:
            inner = h11.Connection(h11.SERVER, max_incomplete_event_size=_HEAD_BYTES)
            first = await _next_request(inner, lambda: reader.read(65536))
            if first is not None:
                await self._requests(inner, first, reader, writer, (name, int(port_text)))
        finally:
            await _end(writer)

    async def _requests(self, connection: h11.Connection, request: h11.Request | None,
                        reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                        tunnel: tuple[str, int] | None) -> None:
        """Answer requests on one connection (in a tunnel to ``tunnel``, else in absolute form)
        until the client closes it. Each is judged from its head (where it goes, the length it
        declares) before a byte of its body is read, and its body is held against the run's
        bound on bytes held at once, across all its connections."""
        while request is not None:
            url, refusal = self._judged(request, tunnel)
            if refusal is not None:
                status, why = refusal
                writer.write(_refusal(connection, status, why))
                await writer.drain()
                await _let_read(writer, reader)
                return  # its body, if any, is never kept: the connection ends
            try:
                body = await self._held_body(connection, reader)
            except _TooMuchAtOnce as exc:
                writer.write(_refusal(connection, 413, str(exc)))
                await writer.drain()
                await _let_read(writer, reader)
                return
            try:
                writer.write(await self._answer(connection, request, url, body))
                await writer.drain()
            finally:
                self._buffered -= len(body)
            if connection.our_state is not h11.DONE or connection.their_state is not h11.DONE:
                return
            connection.start_next_cycle()
            request = await _next_request(connection, lambda: reader.read(65536))

    def _judged(self, request: h11.Request, tunnel: tuple[str, int] | None) -> tuple[str, tuple[int, str] | None]:
        """The request's URL, and ``(status, why)`` where its head alone refuses it."""
        target = request.target.decode("latin-1")
        if tunnel is not None:
            if not target.startswith("/"):
                return "", (400, "in a tunnel, a request names a path")
            host, port = tunnel
            shown = f"[{host}]" if ":" in host else host
            url = f"https://{shown}:{port}{target}"
        elif target.lower().startswith("http://"):
            url = target
            parts = urllib.parse.urlsplit(url)
            try:
                port = parts.port or 80
            except ValueError:
                return url, (400, f"{url!r} has no valid port")
            why = self.run.route_refusal("http", parts.hostname or "", port)
            if why is not None:
                self.run.log_refusal(request.method.decode("latin-1"), "http", parts.hostname or "", port, why)
                return url, (403, why)
        else:
            return "", (400, "this is a proxy: send http:// URLs in full, or CONNECT for https://")
        length = _declared_length(request)
        if length is not None and length > self.run.remaining():
            return url, (413, f"the request body is {length} bytes, more than the {self.run.remaining()} bytes left "
                              "of this run's egress budget")
        return url, None

    async def _held_body(self, connection: h11.Connection, reader: asyncio.StreamReader) -> bytes:
        """The request's body, each byte counted in ``_buffered`` as it arrives; past the run's
        bound (what is left of its budget), ``_TooMuchAtOnce`` and the rest is not read."""
        chunks, held = [], 0
        try:
            while True:
                event = connection.next_event()
                if event is h11.NEED_DATA:
                    connection.receive_data(await reader.read(65536))
                elif isinstance(event, h11.Data):
                    size = len(event.data)
                    if self._buffered + size > self.run.remaining():
                        raise _TooMuchAtOnce(
                            f"the run's requests would hold more than the {self.run.remaining()} bytes left of its "
                            "egress budget at once: send one body at a time, or smaller ones")
                    self._buffered += size
                    held += size
                    chunks.append(bytes(event.data))
                elif isinstance(event, h11.EndOfMessage):
                    return b"".join(chunks)
                else:
                    raise h11.RemoteProtocolError(f"unexpected {type(event).__name__}")
        except BaseException:
            self._buffered -= held
            raise

    async def _answer(self, connection: h11.Connection, request: h11.Request, url: str, body: bytes) -> bytes:
        headers = [[k.decode("latin-1"), v.decode("latin-1")] for k, v in request.headers]
        async with self._one_at_a_time:
            ok, outcome = await self.call(TOOL_NAME, [request.method.decode("ascii"), url],
                                          {"headers": headers,
                                           "body_base64": base64.b64encode(body).decode("ascii")})
        if not ok:
            status = 403 if outcome.type == "EgressRefused" else 502
            return _refusal(connection, status, outcome.message or outcome.type)
        data = outcome["text"].encode() if "text" in outcome else base64.b64decode(outcome["base64"])
        head = [(k, v) for k, v in outcome["headers"]]
        if outcome["status"] in (204, 304) or request.method == b"HEAD":
            data = b""  # no body, and no length to say: a HEAD's would be the GET's, which the host did not keep
        else:
            head.append(("Content-Length", str(len(data))))
        return (connection.send(h11.Response(status_code=outcome["status"], headers=head,
                                             reason=outcome["reason"].encode("latin-1", "replace")))
                + connection.send(h11.Data(data=data)) + connection.send(h11.EndOfMessage()))


async def _let_read(writer: asyncio.StreamWriter, reader: asyncio.StreamReader) -> None:
    """Before closing on a client still sending its body: say we are done, and read and drop
    what arrives for a moment (at most 256 KiB), so the close does not reset the connection
    before the client has read why."""
    if writer.can_write_eof():
        writer.write_eof()
    dropped = 0
    with contextlib.suppress(TimeoutError, OSError, ssl.SSLError):
        async with fail_after(0.5):
            while dropped < 256 * 1024:
                data = await reader.read(65536)
                if not data:
                    return
                dropped += len(data)


class _TooMuchAtOnce(Exception):
    """A body that would pass the run's bound on bytes held at once."""


def _declared_length(request: h11.Request) -> int | None:
    for name, value in request.headers:
        if name.lower() == b"content-length" and value.isdigit():
            return int(value)
    return None


async def _end(writer: asyncio.StreamWriter) -> None:
    """Close a connection to the code's client: politely for a second at most, then at once
    (a TLS goodbye the client never answers must not outlast the run)."""
    writer.close()
    try:
        async with fail_after(1):
            await writer.wait_closed()
    except (TimeoutError, OSError, ssl.SSLError):
        pass
    finally:
        with contextlib.suppress(Exception):
            writer.transport.abort()


async def _next_request(connection: h11.Connection, read: Callable[[], Awaitable[bytes]]) -> h11.Request | None:
    """The next request's head, or None where the client closed the connection first."""
    while True:
        event = connection.next_event()
        if event is h11.NEED_DATA:
            connection.receive_data(await read())
        elif isinstance(event, h11.Request):
            return event
        elif isinstance(event, h11.ConnectionClosed):
            return None
        else:
            raise h11.RemoteProtocolError(f"unexpected {type(event).__name__}")


def _refusal(connection: h11.Connection, status: int, why: str) -> bytes:
    """A response saying ``why``: in the reason phrase (what ``urllib`` shows) and the body."""
    text = f"ringzero egress: {why}"
    reason = " ".join(text.encode("ascii", "replace").decode().split())[:300]
    body = (text + "\n").encode()
    with contextlib.suppress(h11.LocalProtocolError):
        return (connection.send(h11.Response(status_code=status, reason=reason.encode(), headers=[
                    ("Content-Type", "text/plain; charset=utf-8"), ("Content-Length", str(len(body))),
                    ("Connection", "close")]))
                + connection.send(h11.Data(data=body)) + connection.send(h11.EndOfMessage()))
    return b""
