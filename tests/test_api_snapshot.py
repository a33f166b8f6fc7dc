"""The public API, pinned: every name the public modules export, with its signature, against
``tests/api/public_api.json``; griffe (the tool mkdocstrings is built on) reads the code and
judges what changed. A break (a name removed or moved without a shim, a parameter renamed,
made required or reordered, a default changed) fails ``make test`` naming each one; any other
change (a name or parameter added) fails too, until the snapshot is written again:

    .venv/bin/python -m tests.test_api_snapshot

after saying it in CHANGELOG.md (and, for a break, keeping a shim that warns for a release:
README, "Versions")."""

from __future__ import annotations

import copy
import json
import re
import sys
from pathlib import Path
from typing import Any

import griffe

SNAPSHOT = Path(__file__).parent / "api" / "public_api.json"
PUBLIC = [
    "ringzero",
    "ringzero.protocols",
    "ringzero.testing",
    "ringzero.checkpointers",
    "ringzero.compat.checkpointer",
    "ringzero.compat.executor",
    "ringzero.compat.llm",
    "ringzero.compat.scheduler",
    "ringzero.providers.executors",
    "ringzero.providers.llm",
    "ringzero.providers.schedulers",
    "ringzero.agents",
    "ringzero.adapters.langgraph",
    "ringzero.adapters.crewai",
    "ringzero.adapters.langchain",
    "ringzero.adapters.mcp",
    "ringzero.adapters.smolagents",
]
"""The modules whose exported names are the contract (README, "Versions"); everything else may move."""
_NOISE = ("docstring", "lineno", "endlineno", "filepath", "relative_filepath", "relative_package_filepath",
          "analysis", "runtime", "decorators", "git_info", "source_link")


def current() -> dict[str, dict[str, Any]]:
    """Each public module's exported names, as griffe reads them from the code (statically)."""
    loader = griffe.GriffeLoader(allow_inspection=False)
    package = loader.load("ringzero")
    loader.resolve_aliases(implicit=False, external=None)
    surface: dict[str, dict[str, Any]] = {}
    for path in PUBLIC:
        module: Any = package if path == "ringzero" else package[path[len("ringzero."):]]
        members = {}
        for name in sorted(module.exports or ()):
            if name == "__version__":
                continue  # its value changes every release, by design
            found = module[name]
            target = found.final_target if found.is_alias else found
            members[name] = _lean(json.loads(target.as_json()))
        surface[path] = members
    return surface


def _walk(node: Any, visit: Any) -> Any:
    """``visit`` each mapping in ``node`` (griffe's JSON), outermost first; returns ``node``."""
    if isinstance(node, dict):
        visit(node)
        for value in node.values():
            _walk(value, visit)
    elif isinstance(node, list):
        for value in node:
            _walk(value, visit)
    return node


def _lean(node: Any) -> Any:
    """griffe's JSON without what is not the API: docstrings, places, private members."""
    def leaner(mapping: dict[str, Any]) -> None:
        for key in _NOISE:
            mapping.pop(key, None)
        members = mapping.get("members")
        if isinstance(members, dict):
            for name in [n for n in members if n.startswith("_") and not (n.startswith("__") and n.endswith("__"))]:
                del members[name]
    return _walk(node, leaner)


def _placed(node: Any) -> Any:
    """``node`` with the line numbers griffe's decoder asks for (the snapshot keeps none)."""
    def placed(mapping: dict[str, Any]) -> None:
        if "kind" in mapping and "name" in mapping:
            mapping.setdefault("lineno", 0)
            mapping.setdefault("endlineno", 0)
    return _walk(node, placed)


def as_module(path: str, members: dict[str, Any]) -> griffe.Module:
    """A griffe module holding ``members`` (JSON as ``current`` makes it)."""
    module = griffe.Module(path.rsplit(".", 1)[-1], filepath=Path(path.replace(".", "/") + ".py"))
    for name, data in members.items():
        module.set_member(name, json.loads(json.dumps(_placed(copy.deepcopy(data))), object_hook=griffe.json_decoder))
    module.exports = list(members)
    return module


def breakages(old: dict[str, dict[str, Any]], new: dict[str, dict[str, Any]]) -> list[str]:
    """What griffe calls a break between the two surfaces, one line each, and names removed."""
    found = []
    for path, members in old.items():
        now = new.get(path)
        if now is None:
            found.append(f"{path}: the module is no longer public")
            continue
        found += [f"{path}.{name}: removed" for name in members if name not in now]
        kept = {name: data for name, data in members.items() if name in now}
        for breakage in griffe.find_breaking_changes(as_module(path, kept), as_module(path, {n: now[n] for n in kept})):
            said = re.sub(r"\x1b\[[0-9;]*m", "", breakage.explain(style=griffe.ExplanationStyle.ONE_LINE))
            found.append(f"{path}: {said.split(': ', 1)[-1]}")
    return found


def changes(old: dict[str, dict[str, Any]], new: dict[str, dict[str, Any]]) -> list[str]:
    """Every name added, and every name whose description differs, breaking or not."""
    found = [f"{path}: the module is new" for path in new if path not in old]
    for path, members in new.items():
        before = old.get(path, {})
        found += [f"{path}.{name}: {'added' if name not in before else 'changed'}"
                  for name, data in members.items() if before.get(name) != data]
    return found


def written(surface: dict[str, dict[str, Any]]) -> str:
    """The snapshot's text: a line per name, so that a change is a diff of its lines."""
    lines = ["{"]
    for i, (path, members) in enumerate(surface.items()):
        lines.append(f" {json.dumps(path)}: {{")
        for j, (name, data) in enumerate(members.items()):
            comma = "," if j < len(members) - 1 else ""
            lines.append(f"  {json.dumps(name)}: {json.dumps(data, sort_keys=True, separators=(',', ':'))}{comma}")
        lines.append(" }" + ("," if i < len(surface) - 1 else ""))
    lines.append("}")
    return "\n".join(lines) + "\n"


def test_the_public_api_is_the_snapshot_s() -> None:
    pinned = json.loads(SNAPSHOT.read_text())
    now = current()
    broken = breakages(pinned, now)
    other = changes(pinned, now)
    assert not broken and not other, (
        "the public API changed against tests/api/public_api.json:\n  "
        + "\n  ".join(broken or ["(nothing breaks)"])
        + ("\nother changes:\n  " + "\n  ".join(other) if other else "")
        + "\nSay it in CHANGELOG.md (a break keeps a shim that warns), then write the snapshot again: "
          ".venv/bin/python -m tests.test_api_snapshot")


def test_a_planted_rename_is_a_break_the_snapshot_test_names() -> None:
    """The check itself: a parameter renamed, and a name removed, each come out as a break."""
    pinned = json.loads(SNAPSHOT.read_text())
    planted = copy.deepcopy(pinned)
    init = planted["ringzero"]["Secret"]["members"]["__init__"]
    init["parameters"][1]["name"] = "secret_value"  # value -> secret_value
    del planted["ringzero.protocols"]["Checkpointer"]
    found = breakages(pinned, planted)
    assert any("ringzero.protocols.Checkpointer: removed" in line for line in found), found
    assert any("Secret" in line and "value" in line for line in found), found
    assert breakages(pinned, pinned) == []


if __name__ == "__main__":
    SNAPSHOT.parent.mkdir(exist_ok=True)
    SNAPSHOT.write_text(written(current()))
    print(f"wrote {SNAPSHOT}", file=sys.stderr)
