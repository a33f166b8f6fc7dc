"""What a run may reach on the network, and with which secrets: ``ExecLimits(egress=Egress(...))``.

Sandboxed code has no network by default. An :class:`Egress` lets one run reach the hosts it
lists, through the host: the process sandbox's only route out is a proxy the host runs
(``ringzero.providers.egress``), and every executor offers the code an ``http_request`` tool
that goes through the same policy. Names are resolved by the host, never the code; an address
that is private, loopback or link-local is refused unless ``addresses`` lists it; a secret
never enters the sandbox: the host adds it (by default as the ``Authorization`` header) only to
an HTTPS request to a host the secret is bound to, and the code holds at most a placeholder
(``rz-secret-NAME``).
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from ringzero.core.contract.errors import InvalidArgument

__all__ = ["PLACEHOLDER_PREFIX", "Egress", "EgressRecord", "Resolver", "Route", "Secret", "is_ip", "normal_host",
           "placeholder"]

PLACEHOLDER_PREFIX = "rz-secret-"
Resolver = Callable[[str], "Awaitable[Sequence[str]] | Sequence[str]"]
"""How the host finds a name's addresses: ``host -> [address, ...]`` (sync or async)."""

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_HOST = re.compile(r"^(\*\.)?[a-z0-9]([a-z0-9-]*[a-z0-9])?(\.[a-z0-9]([a-z0-9-]*[a-z0-9])?)*$")
_HEADER = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")


def placeholder(name: str) -> str:
    """What the code holds in place of the secret ``name``."""
    return PLACEHOLDER_PREFIX + name


def normal_host(host: str) -> str | None:
    """``host`` as policy compares it (lower case, no trailing dot, an IPv6 literal without its
    brackets), or None where it is neither a DNS name nor an IP literal."""
    host = host.strip().lower().rstrip(".")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    try:
        return str(ipaddress.ip_address(host))
    except ValueError:
        pass
    return host if _HOST.match(host) and not host.startswith("*.") else None


@dataclass(frozen=True)
class Route:
    """One entry of ``Egress.allow``: a scheme, a host (``*.example.org`` matches every name
    below example.org, not example.org itself) and a port."""

    scheme: Literal["https", "http"]
    host: str
    port: int

    @classmethod
    def parse(cls, entry: str) -> Route:
        """``"api.example.com"`` (HTTPS, port 443), ``"api.example.com:8443"``, ``"*.example.org"``,
        ``"http://cache.internal:8080"`` (plain HTTP, allowed only where written so), an IP literal
        (``"10.1.2.3:443"``, ``"[::1]:8443"``). Raises InvalidArgument naming what is wrong."""
        if not isinstance(entry, str) or not entry.strip():
            raise InvalidArgument(f"an Egress.allow entry must be a host, not {entry!r}")
        text = entry.strip()
        scheme: Literal["https", "http"] = "https"
        for prefix, named in (("https://", "https"), ("http://", "http")):
            if text.lower().startswith(prefix):
                scheme, text = named, text[len(prefix):]  # type: ignore[assignment]
        if "/" in text or "@" in text:
            raise InvalidArgument(f"Egress.allow entry {entry!r}: give a host and port, not a URL path or user")
        host, port = _split_port(text, 443 if scheme == "https" else 80, entry)
        wildcard = host.startswith("*.")
        normal = normal_host(host[2:] if wildcard else host)
        if normal is None or (wildcard and is_ip(normal)):
            raise InvalidArgument(f"Egress.allow entry {entry!r}: {host!r} is not a host name or IP address")
        return cls(scheme, ("*." if wildcard else "") + normal, port)

    def matches(self, scheme: str, host: str, port: int) -> bool:
        if scheme != self.scheme or port != self.port:
            return False
        if self.host.startswith("*."):
            return host.endswith(self.host[1:]) and not is_ip(host)
        return host == self.host

    def __str__(self) -> str:
        shown = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.scheme}://{shown}:{self.port}"


def is_ip(host: str) -> bool:
    """Whether ``host`` is an IP literal (not a name)."""
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def _split_port(text: str, default: int, entry: str) -> tuple[str, int]:
    if text.startswith("["):  # [v6]:port
        host, _, rest = text[1:].partition("]")
        port_text = rest[1:] if rest.startswith(":") else ""
        if rest and not rest.startswith(":"):
            raise InvalidArgument(f"Egress.allow entry {entry!r} is not host[:port]")
    elif text.count(":") == 1:
        host, port_text = text.split(":")
    else:
        host, port_text = text, ""
    if not port_text:
        return host, default
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise InvalidArgument(f"Egress.allow entry {entry!r}: {port_text!r} is not a port")
    return host, int(port_text)


@dataclass(frozen=True, repr=False)
class Secret:
    """A value the code never holds; the host adds it to HTTPS requests to one of ``hosts``
    (each also in ``Egress.allow``), and nowhere else.

    By default the host places it: ``header`` (``Authorization``) is set to
    ``format.format(value)`` (``Bearer {}``) on every such request, whatever the code sent.
    With ``code_may_place=True`` the code places it itself, writing its placeholder
    (``rz-secret-NAME``, in the process sandbox's environment as ``NAME``) in a header value
    (``header=None`` then leaves every header to the code); with ``in_url=True`` as well, in
    the URL too (percent-encoded there). The value found in a response, in any spelling a
    server makes (``ringzero.providers.egress.scrub``), is shown to the code as the placeholder."""

    value: str
    hosts: tuple[str, ...]
    header: str | None = "Authorization"
    format: str = "Bearer {}"
    code_may_place: bool = False
    in_url: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.value, str) or not self.value:
            raise InvalidArgument("a Secret's value must be a non-empty string")
        if isinstance(self.hosts, str) or not self.hosts or not all(isinstance(h, str) for h in self.hosts):
            raise InvalidArgument("a Secret's hosts must be a list of host names, e.g. hosts=['api.example.com']")
        object.__setattr__(self, "hosts", tuple(self.hosts))
        if self.header is not None and not _HEADER.match(str(self.header)):
            raise InvalidArgument(f"a Secret's header must be an HTTP header name, not {self.header!r}")
        if not isinstance(self.format, str) or "{}" not in self.format:
            raise InvalidArgument(f"a Secret's format must hold '{{}}' where the value goes, not {self.format!r}")
        if not isinstance(self.code_may_place, bool) or not isinstance(self.in_url, bool):
            raise InvalidArgument("a Secret's code_may_place and in_url are True or False")
        if self.header is None and not self.code_may_place:
            raise InvalidArgument("a Secret without a header is never sent: give header='X-Api-Key' (the host sets "
                                  "it), or code_may_place=True (the code writes the placeholder where it goes)")
        if self.in_url and not self.code_may_place:
            raise InvalidArgument("a Secret with in_url=True is placed by the code: give code_may_place=True too")

    def __repr__(self) -> str:  # the value stays out of logs and tracebacks
        return (f"Secret(hosts={list(self.hosts)!r}, header={self.header!r}, code_may_place={self.code_may_place!r}, "
                f"in_url={self.in_url!r})")


@dataclass(frozen=True, eq=False)
class Egress:
    """What one run may reach: ``allow`` lists routes (:meth:`Route.parse`); ``secrets`` maps a
    name to its :class:`Secret`; ``addresses`` lists the private, loopback or link-local
    addresses and networks (``"10.0.0.0/8"``) a name may resolve to, or an allowed IP literal
    be; ``budget_bytes`` bounds the bytes sent and received in all (request and response lines,
    headers and bodies); ``trust`` is a PEM file of the certificate authorities upstream
    servers are verified against (the system's, where None); ``resolver`` answers names in
    place of the system resolver (a test's own DNS answers); ``timeout`` bounds one request."""

    allow: Sequence[str] = ()
    secrets: Mapping[str, Secret] = field(default_factory=dict)
    addresses: Sequence[str] = ()
    budget_bytes: int = 16 * 1024 * 1024
    trust: str | None = None
    resolver: Resolver | None = None
    timeout: float = 30.0

    def __post_init__(self) -> None:
        if isinstance(self.allow, str):
            raise InvalidArgument("Egress.allow is a list of hosts, e.g. allow=['api.example.com']")
        routes = tuple(Route.parse(entry) for entry in self.allow)
        object.__setattr__(self, "allow", tuple(str(entry) for entry in self.allow))
        object.__setattr__(self, "_routes", routes)
        if isinstance(self.addresses, str):
            raise InvalidArgument("Egress.addresses is a list of addresses or networks, e.g. ['10.0.0.0/8']")
        try:
            networks = tuple(ipaddress.ip_network(a, strict=False) for a in self.addresses)
        except (TypeError, ValueError) as exc:
            raise InvalidArgument(f"Egress.addresses: {exc}") from None
        object.__setattr__(self, "_networks", networks)
        if isinstance(self.budget_bytes, bool) or not isinstance(self.budget_bytes, int) or self.budget_bytes < 0:
            raise InvalidArgument(f"Egress.budget_bytes must be a whole number of bytes, not {self.budget_bytes!r}")
        if isinstance(self.timeout, bool) or not isinstance(self.timeout, (int, float)) or not self.timeout > 0:
            raise InvalidArgument(f"Egress.timeout must be a positive number of seconds, not {self.timeout!r}")
        object.__setattr__(self, "secrets", dict(self.secrets))
        for name, secret in self.secrets.items():
            if not isinstance(name, str) or not _NAME.match(name):
                raise InvalidArgument(f"a secret's name must be an environment variable name, not {name!r}")
            if not isinstance(secret, Secret):
                raise InvalidArgument(f"secret {name!r} must be a ringzero.Secret, not {type(secret).__name__}")
            for host in secret.hosts:
                normal = normal_host(host)
                if normal is None or not any(r.scheme == "https" and r.matches("https", normal, r.port)
                                             for r in routes):
                    raise InvalidArgument(f"secret {name!r} is bound to {host!r}, which Egress.allow does not "
                                          "list for HTTPS")

    @property
    def routes(self) -> tuple[Route, ...]:
        return self._routes  # type: ignore[attr-defined,no-any-return]

    @property
    def networks(self) -> tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]:
        return self._networks  # type: ignore[attr-defined,no-any-return]

    def placeholders(self) -> dict[str, str]:
        """The process sandbox's environment entries for the secrets: ``NAME=rz-secret-NAME``."""
        return {name: placeholder(name) for name in self.secrets}


@dataclass(frozen=True)
class EgressRecord:
    """One request a run made (or tried) through the host: what its record and spans show.
    ``path`` is as the code sent it (placeholders, never secrets); ``refused`` says why the host
    refused it or why it failed, None for a request that got a response."""

    method: str
    scheme: str
    host: str
    port: int
    path: str
    status: int | None = None
    bytes_out: int = 0
    bytes_in: int = 0
    refused: str | None = None
