"""One run's connections to the servers its requests go to, spoken with ``h11``.

A connection is opened to an address the policy checked (never to a name, which could resolve
elsewhere the second time), with TLS verified for the host's name where the request is HTTPS.
It is kept open after a complete exchange, for the run's next request to the same address,
port and name (``_KEPT`` per name, ``KEPT_IN_ALL`` for the run; ``AT_ONCE`` exchanges at a
time), so a run cannot take the host's descriptors; a request that finds its kept connection
closed by the server before any byte of a response is sent again on a new one only where its
method is idempotent (RFC 9110 9.2.2), and a POST or PATCH always takes a new connection, so no
request is ever sent twice by us.
"""

from __future__ import annotations

import asyncio
import ssl
from typing import Protocol

import h11

from ringzero.core.contract.errors import EgressFailed

__all__ = ["HOP_BY_HOP", "Charge", "Upstreams"]

HOP_BY_HOP = frozenset({b"connection", b"keep-alive", b"proxy-authorization", b"proxy-authenticate",
                        b"proxy-connection", b"te", b"trailer", b"transfer-encoding", b"upgrade", b"content-length",
                        b"host"})
"""Headers that speak of one connection, not of the request: the host sets its own."""
IDEMPOTENT = frozenset({"GET", "HEAD", "OPTIONS", "PUT", "DELETE", "TRACE"})
_READ = 65536
_KEPT = 4
"""Idle connections kept per address, port and name."""
KEPT_IN_ALL = 16
"""Idle connections one run keeps in all (a wildcard route reaches many names)."""
AT_ONCE = 16
"""Exchanges one run has open upstream at once (the code may gather many requests)."""

Response = tuple[int, str, list[tuple[str, str]], bytes]
Key = tuple[str, int, "str | None"]


class Charge(Protocol):
    """Counts one request's bytes against its run's budget; each raises EgressFailed past it."""

    def sending(self) -> None:
        """The request goes out (charged once, however many connections it is tried on)."""

    def received(self, size: int) -> None: ...

    def announced(self, length: int) -> None: ...


class _Connection:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.h11 = h11.Connection(h11.CLIENT)

    def close(self) -> None:
        self.writer.transport.abort()  # at once: a TLS goodbye could outlast the run's loop


class _Stale(Exception):
    """A kept connection the server had closed before answering anything."""


class Upstreams:
    """The run's open connections upstream."""

    def __init__(self, trust: str | None) -> None:
        self.trust = trust
        self._context: ssl.SSLContext | None = None
        self._idle: dict[Key, list[_Connection]] = {}
        self._at_once = asyncio.Semaphore(AT_ONCE)

    def kept(self) -> int:
        """Idle connections kept now."""
        return sum(len(kept) for kept in self._idle.values())

    def close(self) -> None:
        for kept in self._idle.values():
            for connection in kept:
                connection.close()
        self._idle.clear()

    def _tls(self) -> ssl.SSLContext:
        if self._context is None:
            self._context = ssl.create_default_context(cafile=self.trust)
            self._context.set_alpn_protocols(["http/1.1"])
        return self._context

    async def exchange(self, address: str, port: int, tls_host: str | None, request: h11.Request, payload: bytes,
                       charge: Charge) -> Response:
        """Send ``request`` (and ``payload``) to ``address`` and read the whole response (at most
        ``AT_ONCE`` of a run's exchanges at a time)."""
        async with self._at_once:
            return await self._exchange_one(address, port, tls_host, request, payload, charge)

    async def _exchange_one(self, address: str, port: int, tls_host: str | None, request: h11.Request,
                            payload: bytes, charge: Charge) -> Response:
        key: Key = (address, port, tls_host)
        method = request.method.decode("ascii")
        kept = self._idle.get(key, []) if method in IDEMPOTENT else []
        while kept:
            connection = kept.pop()
            try:
                return await self._exchange(connection, key, request, payload, charge, reused=True)
            except _Stale:
                continue
        connection = await self._open(key, request)
        try:
            return await self._exchange(connection, key, request, payload, charge, reused=False)
        except _Stale:
            raise EgressFailed(f"{_shown(key)} closed the connection without a response") from None

    async def _open(self, key: Key, request: h11.Request) -> _Connection:
        address, port, tls_host = key
        try:
            reader, writer = await asyncio.open_connection(address, port, ssl=self._tls() if tls_host else None,
                                                           server_hostname=tls_host)
        except ssl.SSLError as exc:
            raise EgressFailed(f"{tls_host}'s TLS certificate was not verified: {exc.reason or exc}") from None
        except OSError as exc:
            raise EgressFailed(f"{_shown(key)} could not be reached: {exc.strerror or exc}") from None
        return _Connection(reader, writer)

    async def _exchange(self, connection: _Connection, key: Key, request: h11.Request, payload: bytes,
                        charge: Charge, *, reused: bool) -> Response:
        done = False
        try:
            wire = connection.h11
            charge.sending()
            connection.writer.write(wire.send(request) + wire.send(h11.Data(data=payload))
                                    + wire.send(h11.EndOfMessage()))
            await connection.writer.drain()
            response = await self._response(connection, charge, reused)
            done = True
            return response
        except (OSError, h11.ProtocolError) as exc:
            if reused and isinstance(exc, ConnectionError):
                raise _Stale from None
            raise EgressFailed(f"{_shown(key)} broke off the exchange: {exc}") from None
        finally:
            if done and connection.h11.our_state is h11.DONE and connection.h11.their_state is h11.DONE:
                connection.h11.start_next_cycle()
                kept = self._idle.setdefault(key, [])
                if len(kept) < _KEPT and self.kept() < KEPT_IN_ALL:
                    kept.append(connection)
                else:
                    connection.close()
            else:
                connection.close()

    async def _response(self, connection: _Connection, charge: Charge, reused: bool) -> Response:
        status, reason, headers, chunks = 0, "", [], []
        while True:
            event = connection.h11.next_event()
            if event is h11.NEED_DATA:
                data = await connection.reader.read(_READ)
                if not data and reused and not status:
                    raise _Stale
                charge.received(len(data))
                connection.h11.receive_data(data)
            elif isinstance(event, h11.Response):
                status, reason = event.status_code, event.reason.decode("latin-1")
                headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in event.headers
                           if k.lower() not in HOP_BY_HOP]
                length = dict(event.headers).get(b"content-length")
                if length is not None and length.isdigit():
                    charge.announced(int(length))
            elif isinstance(event, h11.Data):
                chunks.append(bytes(event.data))
            elif isinstance(event, h11.EndOfMessage):
                return status, reason, headers, b"".join(chunks)
            elif isinstance(event, h11.ConnectionClosed):
                raise EgressFailed("the server closed the connection before the response was complete")
            # an InformationalResponse (100 Continue): read on


def _shown(key: Key) -> str:
    address, port, tls_host = key
    return f"{tls_host or address}:{port} ({address})"
