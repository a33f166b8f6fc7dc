"""A certificate authority of one run's own, for the egress proxy to terminate its TLS.

The run trusts this CA alone (its ``SSL_CERT_FILE``); its key never leaves the host and is
forgotten when the run ends, so a certificate it issued is worth nothing to any other run.
Certificates are made with ``cryptography`` (``pip install 'ringzero[egress]'``): ECDSA P-256,
about a millisecond each, one per host the run reaches. The proxy asks through ``context_for``:
a certificate is issued off the event loop, the last ``KEPT_CONTEXTS`` are kept, and a run may
ask for ``NEW_NAMES_BURST`` new names at once and ``NEW_NAMES_PER_SECOND`` after (a wildcard
route lets the code name as many hosts as it likes; each would cost the host a key and memory).
"""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
import os
import ssl
import tempfile
import time
from collections import OrderedDict
from typing import Any

from ringzero.core.contract.errors import MissingExtra

__all__ = ["KEPT_CONTEXTS", "NEW_NAMES_BURST", "NEW_NAMES_PER_SECOND", "RunAuthority", "TooManyNames"]

try:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
except ImportError as exc:  # pragma: no cover - installed with the egress extra
    raise MissingExtra("Egress (the run's certificate authority)", "egress") from exc

_LIFETIME = datetime.timedelta(days=2)
KEPT_CONTEXTS = 32
"""Certificates (with their TLS contexts) one run keeps, the most recently used."""
NEW_NAMES_BURST = 16
NEW_NAMES_PER_SECOND = 4.0


class TooManyNames(Exception):
    """The run asked for certificates for new names faster than it may."""


class RunAuthority:
    """One run's CA: ``pem`` is what the run trusts; ``server_context(host)`` is what the proxy
    presents to the run for ``host``."""

    def __init__(self) -> None:
        self._key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "ringzero egress, one run")])
        now = datetime.datetime.now(datetime.timezone.utc)
        self._name = name
        self._cert = (
            x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(self._key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + _LIFETIME)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                         content_commitment=False, key_encipherment=False, data_encipherment=False,
                                         key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
            .sign(self._key, hashes.SHA256()))
        self.pem = self._cert.public_bytes(serialization.Encoding.PEM).decode("ascii")
        self._contexts: OrderedDict[str, ssl.SSLContext] = OrderedDict()
        self._allowance = float(NEW_NAMES_BURST)
        self._counted_at = time.monotonic()

    def server_context(self, host: str) -> ssl.SSLContext:
        """A TLS server context presenting a certificate for ``host`` issued by this CA (made
        here, on the caller's thread)."""
        context = self._kept(host)
        if context is None:
            context = self._keep(host, self._issue(host))
        return context

    async def context_for(self, host: str) -> ssl.SSLContext:
        """``server_context`` for the proxy: a new name is counted against the run's rate
        (``TooManyNames`` past it) and its certificate issued off the event loop."""
        context = self._kept(host)
        if context is not None:
            return context
        now = time.monotonic()
        self._allowance = min(float(NEW_NAMES_BURST), self._allowance + (now - self._counted_at) * NEW_NAMES_PER_SECOND)
        self._counted_at = now
        if self._allowance < 1:
            raise TooManyNames(f"this run asked for more than {NEW_NAMES_BURST} new host names at once, or "
                               f"{NEW_NAMES_PER_SECOND:g} a second after")
        self._allowance -= 1
        issued = await asyncio.get_running_loop().run_in_executor(None, self._issue, host)
        return self._keep(host, issued)

    def _kept(self, host: str) -> ssl.SSLContext | None:
        context = self._contexts.get(host)
        if context is not None:
            self._contexts.move_to_end(host)
        return context

    def _keep(self, host: str, context: ssl.SSLContext) -> ssl.SSLContext:
        self._contexts[host] = context
        while len(self._contexts) > KEPT_CONTEXTS:
            self._contexts.popitem(last=False)
        return context

    def _issue(self, host: str) -> ssl.SSLContext:
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.timezone.utc)
        try:
            alt: Any = x509.IPAddress(ipaddress.ip_address(host))
        except ValueError:
            alt = x509.DNSName(host)
        cert = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, host[:64])]))
            .issuer_name(self._name).public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + _LIFETIME)
            .add_extension(x509.SubjectAlternativeName([alt]), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(self._key.public_key()),
                           critical=False)
            .sign(self._key, hashes.SHA256()))
        chain = cert.public_bytes(serialization.Encoding.PEM)
        key_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                    serialization.NoEncryption())
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.set_alpn_protocols(["http/1.1"])
        # ssl loads a certificate and key only from files: a private directory, gone at once
        with tempfile.TemporaryDirectory(prefix="ringzero-egress-") as folder:
            path = os.path.join(folder, "leaf.pem")
            with open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as file:
                file.write(chain + key_pem)
            context.load_cert_chain(path)
        return context
