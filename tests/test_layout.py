"""The package's shape, read from its source.

No module reaches into another's private names, nor imports from another package's private
module; no import circle joins core with a backend, and none runs inside core at all; core's
layers import downwards only (contract, then support, then the private engine, which only the
face imports); and no module writes the attributes of a class another module defines. Each
rule is a function of the modules' source, run on the package and on a probe that breaks it."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

import ringzero

PACKAGE = Path(ringzero.__file__).parent

THIRD_PARTY_PRIVATE = {"_exit", "_replace"}
"""Private names of other libraries that are their documented API (``os._exit``, a named
tuple's ``_replace``)."""


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


# ---------------------------------------------------------------------------------- core's layers
# Each rule below is a function of the modules' syntax trees, so that a probe (a module made
# up to break the rule) shows the rule fails where it must.

Trees = dict[str, tuple[ast.Module, bool]]
"""Module name -> (its syntax tree, whether it is a package's ``__init__``)."""

CONTRACT, SUPPORT, ENGINE, FACE, OUTSIDE = range(5)
LAYER_NAMES = ("the contract", "support", "the engine", "the face", "outside core")


def _trees() -> Trees:
    return {name: (ast.parse(path.read_text()), path.name == "__init__.py") for name, path in _modules().items()}


def _with_probe(name: str, source: str) -> Trees:
    """The package's modules and the probe ``name``; a source holding ``# ---- <name>`` lines is
    several probe modules, each named by the line before it."""
    trees = _trees()
    for part in source.split("# ---- "):
        if part.strip():
            first, _, rest = part.partition("\n")
            module, text = (first.strip(), rest) if first.startswith("ringzero.") else (name, part)
            trees[module] = (ast.parse(text), False)
    return trees


def _type_only_nodes(tree: ast.AST) -> set[int]:
    """The nodes under ``if TYPE_CHECKING:``: annotations' imports, which never run."""
    found: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.body:
                found.update(id(n) for n in ast.walk(child))
    return found


def _imports_of(name: str, tree: ast.AST, is_package: bool, known: set[str], *,
                run_time_only: bool) -> set[str]:
    """The ringzero modules ``name`` imports, at any level (function-level imports included;
    those under ``if TYPE_CHECKING:`` only where not ``run_time_only``)."""
    skip = _type_only_nodes(tree) if run_time_only else set()
    package = name if is_package else name.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[:len(parts) - node.level + 1] + ([base] if base else []))
            # ``from package import module`` imports the module (its package's __init__ runs
            # first, as it does for every import of a module in it); ``from package import
            # name`` imports the package.
            found.update(f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names)
    return {m for m in found if m in known}


def _graph(trees: Trees, *, run_time_only: bool) -> dict[str, set[str]]:
    known = set(trees)
    return {name: _imports_of(name, tree, is_package, known, run_time_only=run_time_only)
            for name, (tree, is_package) in trees.items()}


def core_cycles(trees: Trees) -> list[set[str]]:
    """Circles of imports inside core: module-level and function-level imports, and those under
    ``if TYPE_CHECKING:`` too (an annotation that names a module above is an arrow back up, even
    where it never runs)."""
    graph = _graph(trees, run_time_only=False)
    core = {name: {m for m in targets if m.startswith("ringzero.core")} for name, targets in graph.items()
            if name.startswith("ringzero.core")}
    return _circles(core)


def package_circles(trees: Trees) -> list[set[str]]:
    """Circles anywhere in the package, annotations' imports included: a backend's modules stand
    in layers too (a part names what it needs of the module that holds it as a protocol), and
    a circle that holds core and a backend is a backend under core."""
    return _circles(_graph(trees, run_time_only=False))


def layer_of(name: str) -> int:
    """``ringzero.core.contract``, ``.support`` and ``._engine`` are a layer each; the other modules
    of ``ringzero.core`` are its face."""
    parts = name.split(".")
    if parts[:2] != ["ringzero", "core"]:
        return OUTSIDE
    folder = parts[2] if len(parts) > 2 else ""
    return {"contract": CONTRACT, "support": SUPPORT, "_engine": ENGINE}.get(folder, FACE)


def layer_breaches(trees: Trees) -> list[str]:
    """Core's layers import downwards: the contract imports nothing above it, not even for an
    annotation; support imports the contract and itself; the engine imports no face; and the
    engine is imported by itself and the face alone."""
    breaches = []
    for name, targets in _graph(trees, run_time_only=False).items():
        mine = layer_of(name)
        for target in sorted(targets):
            theirs = layer_of(target)
            if theirs in (OUTSIDE, mine):
                continue
            allowed = {CONTRACT: theirs < CONTRACT, SUPPORT: theirs < SUPPORT, ENGINE: theirs < ENGINE,
                       FACE: True, OUTSIDE: theirs != ENGINE}[mine]
            if not allowed:
                breaches.append(f"{name} ({LAYER_NAMES[mine]}) imports {target} ({LAYER_NAMES[theirs]})")
    return breaches


def private_module_imports(trees: Trees) -> list[str]:
    """A private module (``_http``, ``_engine``) is its package's: only modules inside that
    package import it (or anything beneath it)."""
    reached = []
    for name, targets in _graph(trees, run_time_only=False).items():
        for target in sorted(targets):
            parts = target.split(".")
            for i, part in enumerate(parts):
                if part.startswith("_") and not part.startswith("__"):
                    owner = ".".join(parts[:i])
                    if not (name == owner or name.startswith(owner + ".")):
                        reached.append(f"{name} imports {target}, private to {owner}")
                    break
    return reached


def _class_attributes(tree: ast.AST) -> set[str]:
    """The attributes the classes of a module define: assigned on ``self`` or ``cls``, declared
    in the class body, or named in ``__slots__``."""
    names: set[str] = set()
    for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
        for node in cls.body:
            if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                names.add(node.target.id)
            elif isinstance(node, ast.Assign):
                for target in node.targets:
                    if isinstance(target, ast.Name):
                        names.add(target.id)
                        if target.id == "__slots__":
                            names.update(c.value for c in ast.walk(node.value)
                                         if isinstance(c, ast.Constant) and isinstance(c.value, str))
        for node in ast.walk(cls):
            if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) and \
                    isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
                names.add(node.attr)
    return {n for n in names if not (n.startswith("__") and n.endswith("__"))}


def _imported_names(tree: ast.AST) -> set[str]:
    """Names a module binds by importing a module (``import sys``): their attributes are modules'."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
    return names


def _on_self(node: ast.expr) -> bool:
    return isinstance(node, ast.Name) and node.id in ("self", "cls")


FRAMEWORK_FIELDS = frozenset({"args_schema"})
"""Fields of LangChain's and CrewAI's tool classes (pydantic models: assignment is their API),
which a ringzero class overrides as those frameworks' subclasses do: not ringzero state. The
adapters set them on the user's tool objects to hide the ``idempotency_key`` parameter from the
model; the frameworks offer no other way to change an existing tool's schema."""


def foreign_attribute_writes(trees: Trees) -> list[str]:
    """No module writes an attribute of an object whose class another ringzero module defines: not
    by assignment (``process.in_syscall = ...``), nor by ``setattr``/``object.__setattr__`` with the
    name written out, nor through an object's ``__dict__``. A class owns its state; another module
    asks it to change (a method). An attribute is judged by its name: one a class of another
    module defines, and no class of the writer's own."""
    own = {name: _class_attributes(tree) for name, (tree, _) in trees.items()}
    defined_by: dict[str, set[str]] = defaultdict(set)
    for name, attributes in own.items():
        for attribute in attributes:
            defined_by[attribute].add(name)

    def foreign(module: str, attribute: str) -> bool:
        if attribute in FRAMEWORK_FIELDS:
            return False
        return attribute not in own[module] and bool(defined_by.get(attribute, set()) - {module})

    writes = []
    for name, (tree, _) in trees.items():
        modules = _imported_names(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.ctx, (ast.Store, ast.Del)):
                if _on_self(node.value) or (isinstance(node.value, ast.Name) and node.value.id in modules):
                    continue
                if node.attr == "__dict__" or foreign(name, node.attr):
                    writes.append(f"{name}:{node.lineno}: {ast.unparse(node)} = ...")
            elif isinstance(node, ast.Call):
                func = ast.unparse(node.func)
                if func in ("setattr", "delattr", "object.__setattr__", "object.__delattr__") and len(node.args) >= 2 \
                        and not _on_self(node.args[0]) and isinstance(node.args[1], ast.Constant) \
                        and isinstance(node.args[1].value, str) and foreign(name, node.args[1].value):
                    writes.append(f"{name}:{node.lineno}: {func}(..., {node.args[1].value!r}, ...)")
                elif isinstance(node.func, ast.Attribute) and isinstance(node.func.value, ast.Attribute) and \
                        node.func.value.attr == "__dict__" and not _on_self(node.func.value.value) and \
                        node.func.attr in ("update", "setdefault", "pop", "clear", "__setitem__"):
                    writes.append(f"{name}:{node.lineno}: {func}(...)")
            elif isinstance(node, ast.Subscript) and isinstance(node.ctx, (ast.Store, ast.Del)) and \
                    isinstance(node.value, ast.Attribute) and node.value.attr == "__dict__" and \
                    not _on_self(node.value.value):
                writes.append(f"{name}:{node.lineno}: {ast.unparse(node)} = ...")
    return writes


def test_no_import_circle_in_the_package() -> None:
    assert [sorted(c) for c in package_circles(_trees())] == []


def test_no_import_circle_inside_core() -> None:
    assert [sorted(c) for c in core_cycles(_trees())] == []


def test_core_s_layers_import_downwards_and_only_the_face_imports_the_engine() -> None:
    assert layer_breaches(_trees()) == []


def test_no_module_imports_another_package_s_private_module() -> None:
    assert private_module_imports(_trees()) == []


def test_no_module_writes_the_attributes_of_another_module_s_class() -> None:
    assert foreign_attribute_writes(_trees()) == []


def test_core_is_drawn_in_its_three_layers_and_a_face() -> None:
    layers = {layer_of(name) for name in _modules() if name.startswith("ringzero.core.")}
    assert layers == {CONTRACT, SUPPORT, ENGINE, FACE}


PROBES = [
    ("a circle inside core", core_cycles, "",
     "# ---- ringzero.core.support.probe\nfrom ringzero.core.support import other_probe\n"
     "# ---- ringzero.core.support.other_probe\n"
     "def f():\n    from ringzero.core.support.probe import g  # a function-level import: it runs\n",
     "ringzero.core.support.other_probe"),
    ("a circle inside core through an annotation's import", core_cycles, "",
     "# ---- ringzero.core.support.probe\nfrom ringzero.core.support import other_probe\n"
     "# ---- ringzero.core.support.other_probe\nfrom typing import TYPE_CHECKING\n"
     "if TYPE_CHECKING:\n    from ringzero.core.support.probe import g\n",
     "ringzero.core.support.other_probe"),
    ("a circle inside a backend, through an annotation's import", package_circles, "",
     "# ---- ringzero.checkpointers.probe\nfrom ringzero.checkpointers import other_probe\n"
     "# ---- ringzero.checkpointers.other_probe\nfrom typing import TYPE_CHECKING\n"
     "if TYPE_CHECKING:\n    from ringzero.checkpointers.probe import Probe\n", "ringzero.checkpointers.other_probe"),
    ("a backend in a circle with core", package_circles, "",
     "# ---- ringzero.core.support.probe\nfrom ringzero.providers import probe\n"
     "# ---- ringzero.providers.probe\nfrom ringzero.core.support.probe import g\n", "ringzero.providers.probe"),
    ("the contract importing the engine, for an annotation", layer_breaches, "ringzero.core.contract.probe",
     "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ringzero.core._engine.process import Process\n",
     "ringzero.core.contract.probe (the contract) imports ringzero.core._engine.process"),
    ("support importing the engine", layer_breaches, "ringzero.core.support.probe",
     "from ringzero.core._engine.journal import Journal\n", "ringzero.core.support.probe (support)"),
    ("a backend importing the engine", layer_breaches, "ringzero.providers.probe",
     "from ringzero.core._engine.runtime import Runtime\n", "ringzero.providers.probe (outside core) imports"),
    ("a public name from another package's private module", private_module_imports, "ringzero.adapters.probe",
     "from ringzero.providers.llm._http import error_of_exception\n", "private to ringzero.providers.llm"),
    ("a write of another class's attribute", foreign_attribute_writes, "ringzero.core._engine.probe",
     "def f(process):\n    process.in_syscall = None\n", "process.in_syscall"),
    ("a write through setattr", foreign_attribute_writes, "ringzero.core._engine.probe",
     "def f(process):\n    setattr(process, 'fenced', None)\n", "setattr(..., 'fenced'"),
    ("a write through object.__setattr__", foreign_attribute_writes, "ringzero.core._engine.probe",
     "def f(message):\n    object.__setattr__(message, 'content', '')\n", "object.__setattr__(..., 'content'"),
    ("a write through __dict__", foreign_attribute_writes, "ringzero.core._engine.probe",
     "def f(message):\n    message.__dict__['cache'] = 1\n", "message.__dict__['cache']"),
]


@pytest.mark.parametrize(("rule", "probe", "source", "named"), [p[1:] for p in PROBES], ids=[p[0] for p in PROBES])
def test_each_rule_fails_on_a_probe_that_breaks_it(rule: Any, probe: str, source: str, named: str) -> None:
    found = rule(_with_probe(probe, source))
    assert any(named in str(item) for item in found), found
