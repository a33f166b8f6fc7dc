"""Which parameters of a host tool sandboxed code may set: the host's values stay the host's.

A tool called from sandboxed code runs on the host, with the host's defaults, closures and
bound arguments, which is where an endpoint or a credential lives
(``def fetch(path, base_url=API, api_key=KEY)``). The code chooses the arguments, so the rule
that decides what it may pass cannot depend on how a parameter is spelled or passed:

- every call is bound with the tool's signature first (positional, keyword and ``**`` alike),
  so a value passed by position is judged as the parameter it fills;
- a parameter without a default is the code's: the call cannot be made without it;
- everything else (a parameter with a default, ``*args``, a keyword caught by ``**kwargs``)
  keeps what the host gave it, unless the tool's author lets the code set it, in one line:
  ``@ringzero.code_may_set("limit", "sort_key")``; naming the ``**`` parameter itself lets the
  code pass any keyword into it, naming the ``*`` parameter any number of extra positions;
- a keyword the host bound with ``functools.partial`` and the ``idempotency_key`` the kernel
  passes are never the code's, declared or not;
- a tool whose signature cannot be read (a C function) takes positional arguments and the
  keywords it declares, nothing else.

A call that breaks the rule is refused before the tool runs with a ``TypeError`` that names
the parameter and never quotes the host's value. A LangChain or CrewAI tool's ``args_schema``
is such a declaration: ``schema_tool`` turns one into a host function with exactly those
parameters, each the code's.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any, TypeVar

__all__ = ["CODE_SETS", "IDEMPOTENCY_KEY", "ToolParameters", "code_may_set", "declare", "declared",
           "schema_tool"]

F = TypeVar("F", bound=Callable[..., Any])

IDEMPOTENCY_KEY = "idempotency_key"
"""The keyword the kernel fills with the same key on every attempt of a call (``ringzero.core.support.effects``)."""
CODE_SETS = "__ringzero_code_sets__"
"""The attribute ``code_may_set`` leaves on a tool: the names the code may set."""


def declare(tool: F, attribute: str, value: Any) -> F:
    """Leave a declaration (``@idempotent``, ``@cpu_bound``, ``@code_may_set``) on ``tool``,
    also on an object that refuses new attributes (a pydantic model such as a CrewAI tool)."""
    try:
        setattr(tool, attribute, value)
    except (AttributeError, TypeError, ValueError):
        object.__setattr__(tool, attribute, value)
    return tool


def declared(tool: Any, attribute: str, default: Any = None) -> Any:
    """A declaration on ``tool``, or on the function it wraps (a ``functools.partial``'s, a
    framework tool's ``func``); ``default`` where neither has one."""
    for target in (tool, getattr(tool, "func", None)):
        value = getattr(target, attribute, None)
        if value is not None:
            return value
    return default


def code_may_set(*names: str) -> Callable[[F], F]:
    """Let sandboxed code set these parameters of a host tool, which otherwise keep the host's
    values (defaults, ``*args``, keywords of ``**kwargs``)::

        @ringzero.code_may_set("limit", "sort_key")
        def listing(table, sort_key="name", limit=10, api_key=API_KEY): ...

    The code may now call ``listing("items", limit=3)``; ``listing("items", api_key=...)`` is
    a ``TypeError``. Declarations add up when stacked."""
    bad = [n for n in names if not isinstance(n, str) or not n.isidentifier()]
    if bad:
        raise TypeError(f"code_may_set takes parameter names, not {bad!r}")

    def mark(tool: F) -> F:
        return declare(tool, CODE_SETS, frozenset(getattr(tool, CODE_SETS, ())) | frozenset(names))

    return mark


def _plain_call(signature: inspect.Signature | None) -> int | None:
    """How many positional arguments, and nothing else, always make an allowed call: the
    tool's leading positional parameters without a default, where every later parameter has
    a default or is ``*args``/``**kwargs`` (those stay the host's); None where no such count."""
    if signature is None:
        return None
    count, leading = 0, True
    for parameter in signature.parameters.values():
        plain = parameter.kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD) \
            and parameter.default is inspect.Parameter.empty
        if leading and plain:
            count += 1
            continue
        leading = False
        required = parameter.default is inspect.Parameter.empty and parameter.kind not in (
            inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
        if required:
            return None
    return count


class ToolParameters:
    """One tool's rule, read once (a run reads it at the tool's first call): ``refusal`` says
    why a call may not be made, or None."""

    def __init__(self, tool: Any, name: str) -> None:
        self.name = name
        self.fixed = frozenset(tool.keywords) if isinstance(tool, functools.partial) else frozenset()
        self.declared = frozenset(declared(tool, CODE_SETS, frozenset())) - self.fixed - {IDEMPOTENCY_KEY}
        try:
            self.signature: inspect.Signature | None = inspect.signature(tool)
        except (TypeError, ValueError):  # a C function without a text signature
            self.signature = None
        self._plain_call = _plain_call(self.signature)

    def _host_keeps(self, parameter: str) -> TypeError:
        if parameter in self.fixed:
            return TypeError(f"argument {parameter!r} of {self.name}() is fixed by the host and cannot be passed")
        if parameter == IDEMPOTENCY_KEY:
            return TypeError(f"argument {parameter!r} of {self.name}() is passed by the kernel, not by the code")
        return TypeError(f"{self.name}() does not let the code set {parameter!r}: the host keeps its value "
                         f"(the tool's author may allow it with @ringzero.code_may_set({parameter!r}))")

    def refusal(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> TypeError | None:
        """Why the code may not make this call (a ``TypeError`` naming the parameter, never a
        value), or None."""
        if not kwargs and len(args) == self._plain_call:  # the common call: nothing to bind
            return None
        for key in kwargs:
            if key in self.fixed or key == IDEMPOTENCY_KEY:
                return self._host_keeps(key)
        if self.signature is None:
            extra = [key for key in kwargs if key not in self.declared]
            return self._host_keeps(extra[0]) if extra else None
        try:
            bound = self.signature.bind(*args, **kwargs)
        except TypeError as exc:  # the call does not fit (Python's words name parameters, never values)
            return TypeError(f"{self.name}(): {exc}")
        parameters = self.signature.parameters
        for key, value in bound.arguments.items():
            parameter = parameters[key]
            if key in self.declared:
                continue
            if parameter.kind is inspect.Parameter.VAR_KEYWORD:
                extra = [k for k in value if k not in self.declared]
                if extra:
                    return self._host_keeps(extra[0])
            elif parameter.kind is inspect.Parameter.VAR_POSITIONAL:
                if value:
                    return TypeError(f"{self.name}() does not let the code pass more than its named arguments "
                                     f"(*{key}): the tool's author may allow it with "
                                     f"@ringzero.code_may_set({key!r})")
            elif parameter.default is not inspect.Parameter.empty:
                return self._host_keeps(key)
        return None

    def shown(self, signature: inspect.Signature | None = None) -> inspect.Signature | None:
        """``signature`` (the tool's own where not given) as the code, and the model that writes
        it, may use it: the host's parameters left out, so that neither learns their values, and
        the keywords declared for ``**`` shown by name. None where it cannot be read."""
        signature = signature or self.signature
        if signature is None:
            return None
        kept, extra = [], []
        for key, parameter in signature.parameters.items():
            if parameter.kind is inspect.Parameter.VAR_KEYWORD and key not in self.declared:
                extra = [inspect.Parameter(k, inspect.Parameter.KEYWORD_ONLY, default=_ABSENT)
                         for k in sorted(self.declared - set(signature.parameters))]
            elif key in self.declared or (parameter.default is inspect.Parameter.empty and parameter.kind not in (
                    inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)):
                kept.append(parameter)
        return signature.replace(parameters=[*kept, *extra])


class _Absent:
    """The default of an optional schema field: the call leaves it out, and the framework
    applies its own default."""

    def __repr__(self) -> str:
        return "..."


_ABSENT = _Absent()


def schema_tool(name: str, fields: Sequence[str], required: Collection[str],
                call: Callable[[dict[str, Any]], Any]) -> Callable[..., Any]:
    """A host function with exactly ``fields`` as parameters, each the code's to set (a
    framework tool's ``args_schema`` is its author's declaration), in that order for positional
    calls; ``call`` gets the arguments given, by name. ``call`` may be a coroutine function."""
    parameters = [inspect.Parameter(f, inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                    default=inspect.Parameter.empty if f in required else _ABSENT)
                  for f in fields]
    # required fields first, as Python requires of a signature; a positional call maps onto this order
    parameters.sort(key=lambda p: p.default is not inspect.Parameter.empty)
    signature = inspect.Signature(parameters)

    def given(args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in signature.bind(*args, **kwargs).arguments.items() if v is not _ABSENT}

    async def awaited(*args: Any, **kwargs: Any) -> Any:
        return await call(given(args, kwargs))

    def called(*args: Any, **kwargs: Any) -> Any:
        return call(given(args, kwargs))

    tool: Callable[..., Any] = awaited if inspect.iscoroutinefunction(call) else called
    tool.__name__ = tool.__qualname__ = name
    declare(tool, "__signature__", signature)
    return declare(tool, CODE_SETS, frozenset(fields))
