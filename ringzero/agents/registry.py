"""A tool registry with progressive discovery: the model sees only the tools a task needs.

Each tool is described by its name, signature and the first line of its docstring. ``search``
ranks tools for a query with BM25 over those words (names split at underscores and case
changes); give ``embed=`` (texts to vectors) to rank by cosine similarity instead. Tools are
registered by reference too (``module:qualname``), so a resumed agent finds them again.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from ringzero.core.contract.errors import InvalidArgument
from ringzero.core.support.ranking import Embed, rank
from ringzero.core.support.references import import_reference, importable_reference
from ringzero.core.support.tool_parameters import ToolParameters

__all__ = ["ToolRegistry", "ToolSpec", "import_tool", "signature_of"]



@dataclass(frozen=True)
class ToolSpec:
    """One registered tool: what the model is told of it, and the function itself."""

    name: str
    signature: str
    summary: str
    function: Callable[..., Any]
    reference: str | None
    """``module:qualname`` when the function can be imported again (None for local functions)."""

    def describe(self) -> str:
        return f"{self.name}{self.signature}: {self.summary}" if self.summary else f"{self.name}{self.signature}"

    @property
    def text(self) -> str:
        """What search ranks: the name's words, the signature's parameter names, the docstring."""
        return " ".join([self.name, self.signature, inspect.getdoc(self.function) or ""])


def import_tool(reference: str) -> Callable[..., Any]:
    """The function named by ``module:qualname``."""
    target = import_reference(reference, "the tool")
    if not callable(target):
        raise InvalidArgument(f"the tool {reference!r} is not callable")
    function: Callable[..., Any] = target
    return function


def signature_of(fn: Callable[..., Any]) -> str:
    """``(city: str) -> str``: the parameters the code may set (the host's, such as an
    ``api_key=`` default, are left out: the model never sees their values), annotations evaluated
    where they can be (modules with postponed annotations store them as strings), as written
    where they cannot."""
    parameters = ToolParameters(fn, getattr(fn, "__name__", "tool"))
    try:
        return str(parameters.shown(inspect.signature(fn, eval_str=True)))
    except Exception:  # an annotation naming something not importable at run time
        shown = parameters.shown()
        return "(...)" if shown is None else str(shown).replace("'", "")


class ToolRegistry:
    """Tools by name, searchable."""

    def __init__(self, tools: Iterable[Callable[..., Any] | str] | Mapping[str, Callable[..., Any]] = (), *,
                 embed: Embed | None = None) -> None:
        self._tools: dict[str, ToolSpec] = {}
        self.embed = embed
        if isinstance(tools, Mapping):
            for name, fn in tools.items():
                self.register(fn, name=name)
        else:
            for fn in tools:
                self.register(fn)

    def register(self, tool: Callable[..., Any] | str, *, name: str | None = None) -> ToolSpec:
        """Add a function (or a ``module:qualname`` reference to one); returns its spec."""
        fn = import_tool(tool) if isinstance(tool, str) else tool
        if not callable(fn):
            raise InvalidArgument(f"a tool must be a function, not {fn!r}")
        name = name or getattr(fn, "__name__", None)
        if not name or not name.isidentifier():
            raise InvalidArgument(f"a tool needs a name that is a Python identifier, not {name!r}")
        if name in self._tools:
            raise InvalidArgument(f"a tool named {name!r} is already registered")
        signature = signature_of(fn)
        doc = (inspect.getdoc(fn) or "").strip().splitlines()
        reference = tool if isinstance(tool, str) else importable_reference(fn)
        spec = ToolSpec(name, signature, doc[0] if doc else "", fn, reference)
        self._tools[name] = spec
        return spec

    def __len__(self) -> int:
        return len(self._tools)

    def __iter__(self) -> Iterator[ToolSpec]:
        return iter(self._tools.values())

    def __getitem__(self, name: str) -> ToolSpec:
        try:
            return self._tools[name]
        except KeyError:
            raise InvalidArgument(f"no tool named {name!r}; registered: {', '.join(self._tools) or 'none'}") from None

    def functions(self) -> dict[str, Callable[..., Any]]:
        """Every tool's function by name: what the sandbox gets."""
        return {spec.name: spec.function for spec in self}

    def references(self) -> list[str]:
        """Every tool's ``module:qualname``; raises for a tool that cannot be imported again."""
        missing = [spec.name for spec in self if spec.reference is None]
        if missing:
            raise InvalidArgument(f"tools {', '.join(missing)} are defined in __main__ or inside a function, so a "
                                  "resumed agent could not import them; define them at module level in a module")
        return [spec.reference for spec in self if spec.reference is not None]

    def describe(self, names: Iterable[str] | None = None) -> str:
        """One line per tool, ``name(signature): summary``."""
        chosen = self if names is None else (self[n] for n in names)
        return "\n".join(f"- {spec.describe()}" for spec in chosen)

    def search(self, query: str, limit: int = 5) -> list[ToolSpec]:
        """The tools that best match ``query``, best first (ties keep registration order)."""
        if limit < 1 or not self._tools:
            return []
        specs = list(self)
        scores = rank(query, [s.text for s in specs], self.embed)
        ranked = sorted(range(len(specs)), key=lambda i: -scores[i])
        return [specs[i] for i in ranked[:limit] if scores[i] > 0]

