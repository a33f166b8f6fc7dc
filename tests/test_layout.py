"""The package's shape, read from its source: no module reaches into another's private names,
no import circle joins core with a backend, and modules stay small enough to read."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import ringzero

PACKAGE = Path(ringzero.__file__).parent
MAX_LINES = 400

THIRD_PARTY_PRIVATE = {"_exit"}
"""Private names of other libraries that are their documented API (``os._exit``)."""


def _modules() -> dict[str, Path]:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


def _own_private_names(tree: ast.AST) -> set[str]:
    """The private names a module defines: its functions, classes, attributes and globals."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            names.add(node.attr)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith("_"):
            names.add(node.value)  # __slots__ entries
    return {name for name in names if name.startswith("_")}


def _on_super(node: ast.Attribute) -> bool:
    """``super()._hook``: a subclass calling the framework hook it overrides (ToolNode's)."""
    return isinstance(node.value, ast.Call) and isinstance(node.value.func, ast.Name) and \
        node.value.func.id == "super"


def _imported_modules(name: str, tree: ast.AST) -> set[str]:
    """Every ringzero module ``name`` imports, at any level (function-level imports included)."""
    package = name.rsplit(".", 1)[0] if _modules()[name].name != "__init__.py" else name
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[:len(parts) - node.level + 1] + ([base] if base else []))
            found.add(base)
            found.update(f"{base}.{a.name}" for a in node.names)
    return {m for m in found if m.startswith("ringzero")}


def test_no_module_reaches_into_another_modules_private_names() -> None:
    """A name with a leading underscore is its module's own: another module that needs it gets a
    public (or core-internal) name for it. Private modules (``_confine``) are their package's."""
    modules = _modules()
    reached: dict[str, list[str]] = defaultdict(list)
    for name, path in modules.items():
        tree = ast.parse(path.read_text())
        own = _own_private_names(tree)
        package = name.rsplit(".", 1)[0]
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
                if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
                    continue
                if node.attr in own or node.attr in THIRD_PARTY_PRIVATE or _on_super(node):
                    continue
                reached[name].append(f"{node.lineno}: .{node.attr}")
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and \
                    node.func.id in ("getattr", "hasattr", "setattr") and len(node.args) >= 2 and \
                    isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str):
                attribute = node.args[1].value
                if attribute.startswith("_") and not attribute.startswith("__") and attribute not in own:
                    reached[name].append(f"{node.lineno}: {node.func.id}(..., {attribute!r})")
            elif isinstance(node, ast.ImportFrom) and node.module:
                for alias in node.names:
                    if not alias.name.startswith("_"):
                        continue
                    if f"{node.module}.{alias.name}" in modules and node.module == package:
                        continue  # a private module of its own package
                    reached[name].append(f"{node.lineno}: import {alias.name} from {node.module}")
    assert dict(reached) == {}


def test_nothing_uses_the_private_names_of_asyncio_or_aiosqlite() -> None:
    """Names a module of ours defines too hide from the test above: these are flagged anyway (the
    event loop's queues, aiosqlite's thread and connection), and so is any ``asyncio._name``."""
    foreign = {"_ready", "_scheduled", "_selector", "_run_once", "_execute", "_tx", "_conn"}
    reached = []
    for name, path in _modules().items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr in foreign and not (
                    isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")) and not (
                    isinstance(node.ctx, ast.Store)):
                reached.append(f"{name}:{node.lineno}: .{node.attr}")
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and \
                    node.value.id == "asyncio" and node.attr.startswith("_"):
                reached.append(f"{name}:{node.lineno}: asyncio.{node.attr}")
    assert reached == []


def test_no_import_circle_joins_core_with_a_backend() -> None:
    """Core names protocols; backends (checkpointers, providers, adapters) import core, never the
    other way, so no circle of imports holds both."""
    modules = _modules()
    graph = {name: _imported_modules(name, ast.parse(path.read_text())) & modules.keys()
             for name, path in modules.items()}
    for circle in _circles(graph):
        layers = {m.split(".")[1] for m in circle if m.count(".") >= 1}
        assert not ("core" in layers and layers & {"checkpointers", "providers", "adapters"}), sorted(circle)


def _circles(graph: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected parts of ``graph`` with more than one module (Tarjan's)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[set[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in graph.get(node, ()):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            part = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                part.add(member)
                if member == node:
                    break
            if len(part) > 1:
                found.append(part)

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_module_is_longer_than_a_maintainer_reads_at_once() -> None:
    over = {str(path.relative_to(PACKAGE.parent)): lines for path in _modules().values()
            if (lines := len(path.read_text().splitlines())) > MAX_LINES}
    assert over == {}, "split these modules"
