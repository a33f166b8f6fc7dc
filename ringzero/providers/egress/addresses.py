"""What an address reaches, for the egress policy's check: the IPv4 address inside every IPv6
form that carries one to an IPv4 host.

Python's ``ipaddress`` unwraps only IPv4-mapped addresses (``::ffff:a.b.c.d``) and calls the
other translation forms global, so ``64:ff9b::a9fe:a9fe`` (NAT64 of 169.254.169.254) would
pass a check for private addresses and reach the metadata service through a NAT64 gateway.
Each form is judged by the IPv4 address it carries (all of them, for Teredo's server and
client); a form whose IPv4 position the operator chooses (local-use NAT64, ``64:ff9b:1::/48``,
RFC 8215) is refused unless the policy lists it; and of IPv6 otherwise only global unicast
(``2000::/3``) passes.
"""

from __future__ import annotations

import ipaddress

__all__ = ["carried_ipv4", "translation_without_fixed_place"]

_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")
"""NAT64's well-known prefix (RFC 6052): the IPv4 address in the last 32 bits."""
_LOCAL_NAT64 = ipaddress.IPv6Network("64:ff9b:1::/48")
"""Local-use NAT64 (RFC 8215): the IPv4 address sits where the operator's prefix length puts it."""
_SIIT = ipaddress.IPv6Network("::ffff:0:0:0/96")
"""IPv4-translated addresses (RFC 2765, SIIT): the IPv4 address in the last 32 bits."""
_COMPATIBLE = ipaddress.IPv6Network("::/96")
"""IPv4-compatible addresses (deprecated, RFC 4291): the IPv4 address in the last 32 bits."""
_GLOBAL_UNICAST = ipaddress.IPv6Network("2000::/3")


def carried_ipv4(ip: ipaddress.IPv6Address) -> list[ipaddress.IPv4Address]:
    """The IPv4 addresses ``ip`` carries to an IPv4 host (none for a plain IPv6 address)."""
    if ip.ipv4_mapped is not None:
        return [ip.ipv4_mapped]
    if ip.sixtofour is not None:
        return [ip.sixtofour]
    if ip.teredo is not None:
        return list(ip.teredo)
    if ip in _NAT64 or ip in _SIIT or (ip in _COMPATIBLE and int(ip) > 1):
        return [ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)]
    return []


def translation_without_fixed_place(ip: ipaddress.IPv6Address) -> bool:
    """Whether ``ip`` carries an IPv4 address at a place only its network's operator knows
    (local-use NAT64), or is outside global unicast: what cannot be judged by what it carries."""
    return ip in _LOCAL_NAT64 or ip not in _GLOBAL_UNICAST
