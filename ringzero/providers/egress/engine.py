"""One run's egress: the ``http_request`` host tool every request of the run goes through.

Sandboxed code calls it itself (Monty's code, any executor's), and the process sandbox's proxy
(``proxy``) turns each request a client makes into a call to it, so that one policy, one
secret store, one budget and one log serve every route out, and a run inside a kernel process
journals each request as a tool call made from code (a recorded one is answered from the
journal after a crash, never sent twice). A request:

1. is refused unless its scheme, host and port are on ``Egress.allow`` (an IP literal only
   where allowed as that literal; plain HTTP only where allowed for it);
2. has its host resolved by the host (``Egress.resolver``, else the system's), every address
   checked: a private, loopback or link-local one is refused unless ``Egress.addresses`` lists
   it; the connection goes to a checked address, so a second answer cannot rebind it;
3. over HTTPS to a host a secret is bound to, has the secret's ``header`` set by the host
   (and, where the secret lets the code place it, its placeholder replaced by its value in
   header values, and in the URL where ``in_url``); upstream TLS is verified (``Egress.trust``,
   else the system's CAs); such a request asks for ``Accept-Encoding: identity``, and a body
   encoded anyway is refused, since a secret in it could not be found;
4. is charged, request and response in bytes, to ``Egress.budget_bytes``, and refused or cut
   where it would pass it;
5. shows the code the secret's placeholder wherever the response holds the secret, in any
   spelling a server makes (``scrub``): body, header names and values, reason phrase, and
   the words of any error, before they reach a span, a log or the code; and is logged
   (``EgressRecord``; attributes on the tool's span).

HTTP is spoken with ``h11``; nothing here parses HTTP by hand.
"""

from __future__ import annotations

import asyncio
import base64
import inspect
import ipaddress
import socket
import urllib.parse
from collections.abc import Sequence
from typing import Any

import h11

from ringzero.core.contract.egress import Egress, EgressRecord, Secret, is_ip, normal_host, placeholder
from ringzero.core.contract.errors import EgressFailed, EgressRefused, ToolError
from ringzero.core.support.telemetry import egress_span
from ringzero.core.support.timeouts import fail_after
from ringzero.core.support.tool_parameters import code_may_set
from ringzero.providers.egress.addresses import carried_ipv4, translation_without_fixed_place
from ringzero.providers.egress.scrub import SecretScrub
from ringzero.providers.egress.upstream import HOP_BY_HOP, Upstreams

__all__ = ["TOOL_NAME", "EgressRun"]

TOOL_NAME = "http_request"
_SCRUB_ON_LOOP = 64 * 1024


class EgressRun:
    """The egress of one run: its policy, secrets, budget and log."""

    def __init__(self, egress: Egress) -> None:
        self.egress = egress
        self.spent = 0
        """Bytes sent and received so far, against ``egress.budget_bytes``."""
        self.log: list[EgressRecord] = []
        self.scrub = SecretScrub({placeholder(name): secret.value for name, secret in egress.secrets.items()})
        """Shows the code each secret's placeholder wherever a secret's value would reach it."""
        self.upstreams = Upstreams(egress.trust)
        """The run's connections upstream, kept open between requests (``close`` ends them)."""
        self.tool = self._make_tool()
        """The ``http_request`` tool: ``http_request(method, url, headers=None, body=None,
        body_base64=None)`` returns ``{"status", "reason", "headers", "text"}`` (``"base64"``
        in place of ``"text"`` for a body that is not UTF-8). Headers are ``[[name, value],
        ...]`` or a dict. Raises ``EgressRefused`` or ``EgressFailed`` with a message the code
        is shown."""

    def _make_tool(self) -> Any:
        run = self

        @code_may_set("headers", "body", "body_base64")
        async def http_request(method: str, url: str, headers: Any = None, body: str | None = None,
                               body_base64: str | None = None) -> dict[str, Any]:
            return await run.request(method, url, headers, body, body_base64)

        return http_request

    def route_refusal(self, scheme: str, host: str, port: int) -> str | None:
        """Why the policy refuses ``scheme://host:port`` before any name is resolved, or None."""
        normal = normal_host(host)
        if normal is None:
            return f"{host!r} is not a host name or IP address"
        if any(route.matches(scheme, normal, port) for route in self.egress.routes):
            return None
        if scheme == "http" and any(r.matches("https", normal, r.port) for r in self.egress.routes):
            return f"{normal} is allowed over HTTPS only, not plain http://"
        if any(r.matches(scheme, normal, r.port) for r in self.egress.routes):
            return f"{normal} is allowed on another port, not {port}"
        if is_ip(normal):
            return f"{normal} is an IP address the egress policy does not list (give the host's name)"
        return f"{normal}:{port} is not on this run's egress allow-list"

    def close(self) -> None:
        """The run ended: close its connections upstream."""
        self.upstreams.close()

    def normal(self, host: str) -> str:
        return normal_host(host) or host

    def log_refusal(self, method: str, scheme: str, host: str, port: int, why: str) -> None:
        """Log a request the proxy refused before it became a call (a CONNECT off the policy)."""
        self.log.append(EgressRecord(method, scheme, self.normal(host), port, "", refused=why))

    def remaining(self) -> int:
        return max(0, self.egress.budget_bytes - self.spent)

    async def request(self, method: Any, url: Any, headers: Any = None, body: Any = None,
                      body_base64: Any = None) -> dict[str, Any]:
        """The ``http_request`` tool's work (see ``tool``)."""
        if not isinstance(method, str) or not method.isalpha() or method.upper() == "CONNECT":
            raise EgressRefused(f"{method!r} is not an HTTP method http_request sends")
        if not isinstance(url, str):
            raise EgressRefused(f"url must be a string, not {type(url).__name__}")
        method = method.upper()
        parts = urllib.parse.urlsplit(url)
        scheme = parts.scheme.lower()
        if scheme not in ("http", "https") or not parts.hostname:
            raise EgressRefused(f"{url!r} is not an http:// or https:// URL")
        if parts.username is not None or parts.password is not None:
            raise EgressRefused("a URL with a user or password is not sent: give credentials as a secret")
        try:
            port = parts.port or (443 if scheme == "https" else 80)
        except ValueError:
            raise EgressRefused(f"{url!r} has no valid port") from None
        host = normal_host(parts.hostname) or parts.hostname
        target = urllib.parse.urlunsplit(("", "", parts.path or "/", parts.query, ""))
        record = {"method": method, "scheme": scheme, "host": host, "port": port, "path": target}
        try:
            pairs = _header_pairs(headers)
            payload = _body(body, body_base64)
            refusal = self.route_refusal(scheme, host, port)
            if refusal is not None:
                raise EgressRefused(refusal)
            with egress_span(method, scheme, host, port, target) as span:
                try:
                    response = await self._send(method, scheme, host, port, target, pairs, payload, record)
                except ToolError as exc:  # scrubbed here, before the span records it
                    raise type(exc)(self.scrubbed(str(exc))) from None
                if span is not None:
                    span.set_attribute("http.response.status_code", response["status"])
            return response
        except ToolError as exc:  # its words may quote what the server sent: shown with placeholders
            message = self.scrubbed(str(exc))
            self.log.append(EgressRecord(**record, refused=message))
            raise type(exc)(message) from None

    def scrubbed(self, text: str) -> str:
        """``text`` with every secret shown as its placeholder (``scrub``)."""
        return self.scrub.text(text)

    async def _send(self, method: str, scheme: str, host: str, port: int, target: str,
                    pairs: list[tuple[str, str]], payload: bytes, record: dict[str, Any]) -> dict[str, Any]:
        shown_host = f"[{host}]" if ":" in host else host
        host_header = ("Host", shown_host if port in (80, 443) else f"{shown_host}:{port}")
        length = [("Content-Length", str(len(payload)))] if payload or method in ("POST", "PUT", "PATCH") else []

        def http(target: str, pairs: list[tuple[str, str]]) -> tuple[h11.Request, list[tuple[str, str]]]:
            head = [host_header, *((k, v) for k, v in pairs if k.lower().encode() not in HOP_BY_HOP), *length]
            return h11.Request(method=method, target=target, headers=head), head

        try:  # judged as the code wrote it: h11's words may quote a header, and hold no secret yet
            http(target, pairs)
        except h11.LocalProtocolError as exc:
            raise EgressRefused(f"the request is not valid HTTP: {exc}") from None
        bound = self._bound_secrets(host) if scheme == "https" else {}
        if bound:  # a reply it might reflect a secret in must come as it is: an encoded one cannot be searched
            pairs = [(k, v) for k, v in pairs if k.lower() != "accept-encoding"] + [("Accept-Encoding", "identity")]
        for name, secret in bound.items():
            if secret.code_may_place:
                if secret.in_url:
                    target = target.replace(placeholder(name), urllib.parse.quote(secret.value, safe=""))
                pairs = [(k, v.replace(placeholder(name), secret.value)) for k, v in pairs]
            if secret.header is not None:
                pairs = [(k, v) for k, v in pairs if k.lower() != secret.header.lower()]
                pairs.append((secret.header, secret.format.format(secret.value)))
        try:
            request, head = http(target, pairs)
        except h11.LocalProtocolError:
            raise EgressRefused("a secret's value cannot be sent in an HTTP header as it is") from None
        out = len(method) + len(target) + 12 + sum(len(k) + len(v) + 4 for k, v in head) + len(payload)
        if out > self.remaining():
            raise EgressRefused(f"the request is {out} bytes, more than the {self.remaining()} bytes left of this "
                                f"run's egress budget ({self.egress.budget_bytes})")
        charge = _Charge(self, record, out)  # reserved now, before any await: gathered requests see it
        try:
            address = await self._checked_address(host, port)
            async with fail_after(self.egress.timeout):
                status, reason, headers, data = await self.upstreams.exchange(
                    address, port, host if scheme == "https" else None, request, payload, charge)
        except TimeoutError:
            raise EgressFailed(f"{host}:{port} did not answer within {self.egress.timeout} s") from None
        finally:
            charge.settle()
        encoding = next((v for k, v in headers if k.lower() == "content-encoding"), "identity")
        if bound and encoding.strip().lower() not in ("", "identity"):
            raise EgressFailed(f"the server sent its body encoded as {encoding!r}, though asked for identity: an "
                               "encoded body cannot be checked for the run's secrets, so it is not shown")
        data = await self._scrubbed_body(data)  # the code sees each secret's placeholder, never the value
        headers = [(self.scrubbed(k), self.scrubbed(v)) for k, v in headers]
        reason = self.scrubbed(reason)
        self.log.append(EgressRecord(**record, status=status))
        answer: dict[str, Any] = {"status": status, "reason": reason, "headers": [list(h) for h in headers]}
        try:
            answer["text"] = data.decode("utf-8")
        except UnicodeDecodeError:
            answer["base64"] = base64.b64encode(data).decode("ascii")
        return answer

    def _bound_secrets(self, host: str) -> dict[str, Secret]:
        return {name: secret for name, secret in self.egress.secrets.items()
                if any(normal_host(h) == host for h in secret.hosts)}

    async def _scrubbed_body(self, data: bytes) -> bytes:
        """``data`` scrubbed; a large body off the loop (a megabyte takes tens of milliseconds)."""
        if len(data) <= _SCRUB_ON_LOOP:
            return self.scrub.data(data)
        return await asyncio.get_running_loop().run_in_executor(None, self.scrub.data, data)

    async def _checked_address(self, host: str, port: int) -> str:
        """An address of ``host`` the policy allows connecting to: the first one resolved that
        is public or listed in ``Egress.addresses``. Raises EgressRefused where none is."""
        if is_ip(host):
            found: Sequence[str] = [host]
        else:
            found = await self._resolve(host, port)
        refused = []
        for address in found:
            why = self.address_refusal(address)
            if why is None:
                return address
            refused.append(why)
        if not refused:
            raise EgressFailed(f"{host} has no address")
        raise EgressRefused(f"{host} resolves to {'; '.join(refused)}")

    def address_refusal(self, address: str) -> str | None:
        """Why the run may not connect to ``address``, or None: a listed address passes; an IPv6
        form that carries an IPv4 address (mapped, NAT64, 6to4, Teredo, compatible, SIIT) is
        judged by what it carries (``addresses.carried_ipv4``); otherwise a public address passes."""
        try:
            ip = ipaddress.ip_address(address)
        except ValueError:
            return f"{address!r}, which is not an IP address"
        if self._listed(ip):
            return None
        if isinstance(ip, ipaddress.IPv6Address):
            carried = carried_ipv4(ip)
            for inner in carried:
                why = self._judged(inner)
                if why is not None:
                    return why if ip.ipv4_mapped is not None else f"{why} (carried inside {ip})"
            if carried:
                return None
            if translation_without_fixed_place(ip) and self._kind(ip) is None:
                return (f"{ip}, an IPv6 address outside global unicast (or a local-use NAT64 one) this run's egress "
                        "policy does not list (Egress.addresses)")
        return self._judged(ip)

    def _listed(self, ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
        return any(ip in network for network in self.egress.networks)

    def _judged(self, ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> str | None:
        if self._listed(ip):
            return None
        kind = self._kind(ip)
        if kind is None:
            return None
        return f"{ip}, {kind} address this run's egress policy does not list (Egress.addresses)"

    @staticmethod
    def _kind(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> str | None:
        return ("a loopback" if ip.is_loopback else "a link-local" if ip.is_link_local
                else "an unspecified" if ip.is_unspecified else "a multicast" if ip.is_multicast
                else "a private" if ip.is_private else "a reserved" if not ip.is_global else None)

    async def _resolve(self, host: str, port: int) -> Sequence[str]:
        resolver = self.egress.resolver
        try:
            if resolver is not None:
                found = resolver(host)
                answer = await found if inspect.isawaitable(found) else found
                return [str(a) for a in answer]
            infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except OSError as exc:
            raise EgressFailed(f"{host} could not be resolved: {exc}") from None
        return [str(info[4][0]) for info in infos]

class _Charge:
    """Charges one request's bytes to its run's budget, and keeps its record's counts. The
    request's own bytes are reserved when it is made (``spent`` counts them at once, so requests
    the code gathers cannot each pass against the same remainder) and given back by ``settle``
    where it was never sent."""

    def __init__(self, run: EgressRun, record: dict[str, Any], sent: int) -> None:
        self.run, self.record, self.sent = run, record, sent
        run.spent += sent
        self._went_out = False

    def sending(self) -> None:
        self._went_out = True
        self.record["bytes_out"] = self.sent

    def settle(self) -> None:
        """The request is over: where not one byte of it went out, its reservation is given back."""
        if not self._went_out:
            self.run.spent -= self.sent
            self.sent = 0

    def received(self, size: int) -> None:
        self.run.spent += size
        self.record["bytes_in"] = self.record.get("bytes_in", 0) + size
        if self.run.spent > self.run.egress.budget_bytes:
            raise EgressFailed(f"the response passed this run's egress budget ({self.run.egress.budget_bytes} bytes) "
                               "and was cut off")

    def announced(self, length: int) -> None:
        if length > self.run.remaining():
            raise EgressFailed(f"the response is {length} bytes, more than the {self.run.remaining()} bytes left of "
                               f"this run's egress budget ({self.run.egress.budget_bytes})")


def _header_pairs(headers: Any) -> list[tuple[str, str]]:
    if headers is None:
        return []
    items = list(headers.items()) if isinstance(headers, dict) else headers
    if not isinstance(items, list) or not all(
            isinstance(p, (list, tuple)) and len(p) == 2 and all(isinstance(x, str) for x in p) for p in items):
        raise EgressRefused("headers must be a dict of strings or a list of [name, value] pairs")
    return [(str(k), str(v)) for k, v in items]


def _body(body: Any, body_base64: Any) -> bytes:
    if body is not None and body_base64 is not None:
        raise EgressRefused("give body or body_base64, not both")
    if body is not None:
        if not isinstance(body, str):
            raise EgressRefused(f"body must be a string, not {type(body).__name__}")
        return body.encode("utf-8")
    if body_base64 is not None:
        try:
            return base64.b64decode(body_base64, validate=True)
        except (ValueError, TypeError):
            raise EgressRefused("body_base64 is not base64") from None
    return b""
