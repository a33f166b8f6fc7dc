"""A pytest plugin for langchain-core's own tool tests (its sdist, fetched at test time by
tests/test_upstream_tools.py): every tool the tests make (``@tool``, ``StructuredTool.from_function``,
``Tool.from_function``, ``StructuredTool(...)``, ``Tool(...)``, a ``BaseTool`` subclass of theirs)
is handed to them wrapped by ``sandboxed``, so its body runs in Monty; a tool ``sandboxed``
refuses is handed over as it was, and the refusal is counted by cause.

The summary line says how many tools were wrapped, how many calls ran in the sandbox, and the
refusals by cause; a refusal of a cause not in ``CAUSES`` fails the run. Tests that cannot pass by
the nature of a sandbox are in ``EXPECTED_TO_FAIL``, strict: one that starts passing fails the run.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import Any

import pytest
from langchain_core.tools import BaseTool, StructuredTool, Tool
from refusals import Refusals

import ringzero.adapters.langchain_tools as langchain_tools
from ringzero.core.contract.errors import InvalidArgument

CAUSES = {
    "uses self": "a tool class whose _run uses self (the tool object is not in the sandbox)",
    "takes no self parameter": "a tool class whose _run is not a plain method",
    "from an enclosing function": "a closure (uses names of an enclosing function)",
    "a lambda": "a lambda (no source to ship)",
    "uses module-level": "uses a module-level name",
    "the source of": "a callable without def source (a partial, a callable object)",
    "could not find the definition": "a callable without def source (a class)",
    "fills with a host object": "takes a host object (callbacks, run_manager, runtime, config)",
    "which is not JSON": "takes an argument that is not JSON (an enum, a datetime, a model)",
}
"""What a refusal says, and the cause the README documents (see ``sandboxed``)."""

EXPECTED_TO_FAIL = {
    "test_tool_call_id_passed_to_on_tool_start_callback[invoke]":
        "a sync invoke on a thread that runs an event loop waits for the sandbox: blockbuster flags the wait",
    "test_tool_call_id_passed_via_run_method[run]":
        "a sync run on a thread that runs an event loop waits for the sandbox: blockbuster flags the wait",
    "test_tool_ainvoke_does_not_mutate_inputs":
        "a sync invoke on a thread that runs an event loop waits for the sandbox: blockbuster flags the wait",
}

wrapped = 0
sandboxed_runs = 0
refused = Refusals(CAUSES)
_making = threading.local()
_run_shipped = langchain_tools.run_shipped


async def _counted_run(*args: Any, **kwargs: Any) -> Any:
    global sandboxed_runs
    sandboxed_runs += 1
    return await _run_shipped(*args, **kwargs)


def _wrap(made: Any) -> Any:
    """``made`` sandboxed, or as it was where ``sandboxed`` refuses it (the cause counted)."""
    global wrapped
    if not isinstance(made, BaseTool) or getattr(_making, "depth", 0):
        return made  # a tool made inside another maker's call: the outer one wraps it
    try:
        sandboxed = langchain_tools.sandboxed(made)
    except InvalidArgument as exc:
        refused.add(exc)
        return made
    wrapped += 1
    return sandboxed


def _making_one(make: Callable[..., Any]) -> Callable[..., Any]:
    """``make`` (a tool maker), its own inner makers' results left alone, its result wrapped."""

    @functools.wraps(make)
    def maker(*args: Any, **kwargs: Any) -> Any:
        _making.depth = getattr(_making, "depth", 0) + 1
        try:
            made = make(*args, **kwargs)
        finally:
            _making.depth -= 1
        if callable(made) and not isinstance(made, BaseTool):  # @tool("name", ...): a decorator
            return _making_one(made)
        return _wrap(made)

    return maker


def _made_directly(cls: Any, *args: Any, **kwargs: Any) -> Any:
    """Every pydantic model is made as usual; a LangChain tool a test makes itself (a BaseTool
    subclass, ``StructuredTool(...)``, ``Tool(...)``) is handed back sandboxed."""
    if not (isinstance(cls, type) and issubclass(cls, BaseTool)) or issubclass(cls, langchain_tools.ShippedTool) \
            or getattr(_making, "depth", 0):
        return type.__call__(cls, *args, **kwargs)
    _making.depth = 1
    try:
        made = type.__call__(cls, *args, **kwargs)
    finally:
        _making.depth = 0
    return _wrap(made)


def _substitute() -> None:
    import langchain_core.tools
    import langchain_core.tools.convert
    from pydantic._internal._model_construction import ModelMetaclass

    ModelMetaclass.__call__ = _made_directly  # type: ignore[method-assign,assignment]

    decorator = _making_one(langchain_core.tools.convert.tool)
    langchain_core.tools.tool = decorator  # type: ignore[assignment]
    langchain_core.tools.convert.tool = decorator  # type: ignore[assignment]
    for cls in (StructuredTool, Tool):
        original = cls.__dict__["from_function"].__func__
        cls.from_function = classmethod(_making_one(original))  # type: ignore[method-assign]
    langchain_tools.run_shipped = _counted_run  # type: ignore[assignment]


_substitute()  # at plugin import: before any test module runs `from langchain_core.tools import tool`


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        reason = EXPECTED_TO_FAIL.get(item.name)
        if reason is not None:
            item.add_marker(pytest.mark.xfail(reason=reason, strict=True))


def pytest_terminal_summary(terminalreporter: Any) -> None:
    refused.report(terminalreporter, f"ringzero: {wrapped} tools sandboxed, {sandboxed_runs} calls ran in the sandbox")


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    refused.fail_if_unknown(session)
