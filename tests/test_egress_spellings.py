"""A secret cannot come back to the code in any spelling a server or ringzero makes.

A bound API that reflects its request (an echo, an error quoting the key, a 404 quoting the
path) is common; each test here has such a server hand the secret back another way than the
bytes that went out (compressed, percent-encoded, JSON-escaped, upper-cased, cut short, as a
header's name, quoted by a parser's error) and checks that the code, the run's record and the
spans hold the placeholder and never 8 consecutive characters of the key, decoded as a reader
would decode them. Each runs on the process sandbox (``urllib`` through the proxy) and Monty
(``http_request``), with a bystander keeping its pace."""

from __future__ import annotations

import json
import re
import urllib.parse
from typing import Any

import pytest

from ringzero import Context, Kernel
from ringzero.checkpointers import MemoryCheckpointer
from ringzero.core.contract.egress import Egress, Secret
from ringzero.core.contract.errors import InvalidArgument
from ringzero.core.contract.protocols import Executor
from ringzero.core.contract.types import ExecLimits
from tests.egress_servers import LocalCA, Server
from tests.test_egress import KEY, PLACEHOLDER, fetch, paced

both = pytest.mark.parametrize("sandbox", ["process", "monty"], indirect=True)
SIGNED = "ak/7Qv+Zr2=Lp9xW4m/Tz8+Kd3=Hs6/Jn1+"
"""A key with the characters a URL or JSON writes another way."""


HOST_PLACED = Secret(KEY, hosts=["api.test"], header="Authorization", format="Bearer {}")
"""The default placement, spelled out."""


def bound(ca: LocalCA, port: int, secret: Secret | None = None) -> Egress:
    """Egress to api.test with the secret API_KEY (placed by the host, as by default)."""
    return Egress(allow=[f"api.test:{port}"], addresses=["127.0.0.1"], trust=str(ca.pem),
                  resolver=lambda host: ["127.0.0.1"], secrets={"API_KEY": secret or HOST_PLACED})


def read(text: str) -> str:
    """``text`` as a reader decodes it: percent-encoding, JSON escapes and case undone."""
    plain = urllib.parse.unquote(text).replace("\\/", "/")
    return re.sub(r"\\+u([0-9A-Fa-f]{4})", lambda m: chr(int(m.group(1), 16)), plain).lower()


def revealed(text: str, key: str) -> str | None:
    """The longest stretch (8 characters or more) of ``key`` that ``text`` spells once read
    (``read``), or None."""
    plain = read(text)
    for size in range(len(key), 7, -1):
        for start in range(len(key) - size + 1):
            if key[start:start + size].lower() in plain:
                return key[start:start + size]
    return None


def is_monty(sandbox: Executor) -> bool:
    return type(sandbox).__name__ == "MontyExecutor"


@both
async def test_a_compressed_reply_never_reaches_the_code(sandbox: Executor, ca: LocalCA, api: Server) -> None:
    """The code asks for gzip: the server is asked for identity and its echo is scrubbed; a
    server that compresses anyway is refused, not shown."""
    url = f"https://api.test:{api.port}"
    asked = "{'Accept-Encoding': 'gzip'}"
    code = fetch(sandbox, f"{url}/echo", asked) + "\nfirst = out\n" + fetch(sandbox, f"{url}/gzip", asked) + \
        "\n[first, out]"
    result = await paced(sandbox, code, bound(ca, api.port))
    (status, body), second = result.value
    assert status == 200 and f"Bearer {PLACEHOLDER}" in body, result.value
    assert second[0] == "error" and ("encoded" in second[1] or "502" in second[1]), second
    assert api.headers("Accept-Encoding") == ["identity", "identity"]
    assert revealed(json.dumps(result.to_dict()), KEY) is None


SPELLINGS = {
    "percent-encoded in a 404 quoting the path": ("/missing/{key}", "SIGNED"),
    "JSON escapes (\\/ and \\u002B)": ("/echo?style=escaped", "SIGNED"),
    "upper case": ("/echo?style=upper", "KEY"),
}


@both
@pytest.mark.parametrize("row", list(SPELLINGS))
async def test_a_secret_the_server_spells_another_way_is_shown_as_its_placeholder(
        sandbox: Executor, ca: LocalCA, api: Server, row: str) -> None:
    path, which = SPELLINGS[row]
    key = SIGNED if which == "SIGNED" else KEY
    secret = Secret(key, hosts=["api.test"], code_may_place=True, in_url=True)
    url = f"https://api.test:{api.port}{path.format(key=PLACEHOLDER)}"
    header = "{'Authorization': 'Bearer " + PLACEHOLDER + "'}"
    code = fetch(sandbox, url, header)
    if not is_monty(sandbox):  # urllib raises on a 404: the code reads the error's body
        code = code.replace("out = ['error', f'{e.code} {e.reason}']", "out = [e.code, e.read().decode()]")
    result = await paced(sandbox, code, bound(ca, api.port, secret))
    sent = api.received[0]
    assert key in urllib.parse.unquote(sent.path) + sent.headers["authorization"]  # it went out, and came back
    shown = json.dumps(result.value)
    assert revealed(shown, key) is None and revealed(json.dumps(result.to_dict()), key) is None, shown
    assert PLACEHOLDER.lower() in read(shown), shown


@both
async def test_a_truncated_echo_shows_at_most_seven_characters_of_the_key(
        sandbox: Executor, ca: LocalCA, api: Server) -> None:
    """The code finds where the key sits in the echo, then has the server cut its echo at
    every place inside the key: the pieces end in at most the key's first 7 characters."""
    url = f"https://api.test:{api.port}/echo?cut="
    if is_monty(sandbox):
        get = "http_request('GET', '" + url + "' + str(n))['text']"
    else:
        get = "urllib.request.urlopen('" + url + "' + str(n), timeout=20).read().decode()"
    code = ("import urllib.request\n" if not is_monty(sandbox) else "") + (
        "n = 999\n"
        f"at = {get}.index('Bearer {PLACEHOLDER}') + 7\n"
        "pieces = []\n"
        f"for n in range(at, at + {len(KEY) + 2}):\n"
        f"    pieces.append({get}[at:])\n"
        "pieces")
    result = await paced(sandbox, code, bound(ca, api.port))
    pieces = result.value
    assert len(pieces) == len(KEY) + 2 and all(revealed(p, KEY) is None for p in pieces), pieces
    learned = max(len(p) for p in pieces if KEY.startswith(p))
    assert learned == 7, pieces  # the cut fell inside the key; what it shows stops at 7 characters
    assert PLACEHOLDER in pieces[-1]


@both
async def test_a_secret_reflected_as_a_header_name_is_shown_as_its_placeholder(
        sandbox: Executor, ca: LocalCA, api: Server) -> None:
    url = f"https://api.test:{api.port}/reflect"
    if is_monty(sandbox):
        code = f"r = http_request('GET', '{url}')\n[name for name, value in r['headers']]"
    else:
        code = ("import urllib.request\n"
                f"[name for name, value in urllib.request.urlopen('{url}', timeout=20).getheaders()]")
    result = await paced(sandbox, code, bound(ca, api.port))
    assert api.headers("Authorization") == [f"Bearer {KEY}"]
    assert f"x-seen-{PLACEHOLDER.lower()}" in [name.lower() for name in result.value], result
    assert revealed(json.dumps(result.to_dict()), KEY) is None, result


@both
async def test_the_host_places_a_secret_and_the_code_cannot_move_it(sandbox: Executor, ca: LocalCA,
                                                                    api: Server) -> None:
    """By default the host sets ``Authorization``; the placeholder the code writes elsewhere (a
    header of its own, the URL) arrives as the placeholder. ``code_may_place`` lets it place
    the key in header values, and ``in_url`` in the URL too."""
    url = f"https://api.test:{api.port}/echo?k={PLACEHOLDER}"
    own = "{'X-Mine': '" + PLACEHOLDER + "', 'Authorization': 'Bearer forged'}"
    for secret in (Secret(KEY, hosts=["api.test"]), Secret(KEY, hosts=["api.test"], header=None, code_may_place=True),
                   Secret(KEY, hosts=["api.test"], header=None, code_may_place=True, in_url=True)):
        await paced(sandbox, fetch(sandbox, url, own), bound(ca, api.port, secret))
    default, placed, in_url = api.received
    assert (default.headers["authorization"], default.headers["x-mine"], default.path) == (
        f"Bearer {KEY}", PLACEHOLDER, f"/echo?k={PLACEHOLDER}")
    assert (placed.headers["authorization"], placed.headers["x-mine"], placed.path) == (
        "Bearer forged", KEY, f"/echo?k={PLACEHOLDER}")
    assert (in_url.headers["x-mine"], in_url.path) == (KEY, f"/echo?k={KEY}")


def test_a_secret_that_would_never_be_sent_or_is_placed_in_a_url_by_the_host_is_refused() -> None:
    with pytest.raises(InvalidArgument, match="never sent"):
        Secret(KEY, hosts=["api.test"], header=None)
    with pytest.raises(InvalidArgument, match="code_may_place=True too"):
        Secret(KEY, hosts=["api.test"], in_url=True)
    assert KEY not in repr(Secret(KEY, hosts=["api.test"], code_may_place=True))


async def asks_a_server_whose_error_quotes_the_key(ctx: Context, port: int, trust: str) -> Any:
    egress = Egress(allow=[f"api.test:{port}"], addresses=["127.0.0.1"], trust=trust,
                    resolver=lambda host: ["127.0.0.1"], secrets={"API_KEY": HOST_PLACED})
    out = await ctx.exec(f"try:\n    http_request('GET', 'https://api.test:{port}/badline')\n"
                         "except Exception as e:\n    out = str(e)\nout", limits=ExecLimits(egress=egress))
    return out.value


async def test_an_error_quoting_the_secret_is_scrubbed_before_its_span_records_it(
        ca: LocalCA, api: Server, monkeypatch: pytest.MonkeyPatch) -> None:
    """h11 quotes the status line it refused, the key in it: the code's error, the ``GET``
    span's exception event and status, and every other span show the placeholder."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    monkeypatch.delenv("OTEL_SDK_DISABLED", raising=False)
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    try:
        async with Kernel(checkpointer=MemoryCheckpointer(), tracer_provider=provider) as kernel:
            said = await (await kernel.spawn(asks_a_server_whose_error_quotes_the_key, api.port, str(ca.pem))).wait(
                timeout=30)
        spans = exporter.get_finished_spans()
    finally:
        provider.shutdown()
    assert api.headers("Authorization") == [f"Bearer {KEY}"]
    assert PLACEHOLDER in said and revealed(said, KEY) is None, said
    [get] = [s for s in spans if s.name == "GET"]
    assert get.events and PLACEHOLDER in json.dumps([dict(e.attributes or {}) for e in get.events])
    everything = json.dumps([[s.name, dict(s.attributes or {}), s.status.description,
                              [dict(e.attributes or {}) for e in s.events]] for s in spans])
    assert revealed(everything, KEY) is None
