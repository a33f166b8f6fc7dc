"""An ``Egress`` policy as microsandbox's own network scope, for a microVM's guest.

The guest's traffic leaves through microsandbox's network stack, not through ringzero's proxy:
``microvm_network`` turns the policy into the SDK's rules and secrets, which microsandbox
enforces itself (what it does and does not: SECURITY.md). Each route becomes an allow rule
(TCP to that port of that domain, domain suffix or address) over a deny-all default, with DNS to
the sandbox's gateway (the guest resolves names through microsandbox); each secret becomes a
secret entry with ringzero's placeholder, allowed for its hosts (with its ``header``, substituted
in that header only: microsandbox sets no header itself, so the guest's code writes it with the
placeholder). ``Egress.addresses``, ``budget_bytes``, ``resolver`` and ``trust`` have no
counterpart there and are not passed; ``Secret.format`` and ``in_url`` neither, and responses
are not scrubbed (SECURITY.md).
"""

from __future__ import annotations

from typing import Any

from ringzero.core.contract.egress import Egress, Route, is_ip, placeholder

__all__ = ["microvm_network"]


def microvm_network(egress: Egress) -> tuple[Any, list[Any]]:
    """``(ms.Network, [ms.SecretEntry])`` for ``Sandbox.create(network=..., secrets=...)``."""
    import microsandbox as ms

    rules = [*ms.Rule.allow_dns()]
    rules.extend(ms.Rule.allow(protocol=ms.Protocol.TCP, port=route.port, destination=_destination(ms, route))
                 for route in egress.routes)
    network = ms.Network(policy=ms.NetworkPolicy(default_egress=ms.Action.DENY, default_ingress=ms.Action.DENY,
                                                 rules=tuple(rules)))
    secrets = [
        ms.Secret.env(name, value=secret.value, allow=list(secret.hosts), placeholder=placeholder(name),
                      substitution=ms.SecretSubstitution(header_fields=(secret.header.lower(),))
                      if secret.header else None)
        for name, secret in egress.secrets.items()]
    return network, secrets


def _destination(ms: Any, route: Route) -> Any:
    if route.host.startswith("*."):
        return ms.Destination.domain_suffix(route.host[1:])
    return ms.Destination.ip(route.host) if is_ip(route.host) else ms.Destination.domain(route.host)
