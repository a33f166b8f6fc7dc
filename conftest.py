"""Every Python block of the site (``docs/``) and of the README is a test (Sybil): a page's blocks
run in order in one namespace, as a reader would type them into ``python -m asyncio``, so a
block may ``await`` at its top level.

A page may hold setup a reader does not need to see (a model server on 127.0.0.1 for a block that
names a vendor, a file to read) in an HTML comment, ``<!-- invisible-code-block: python -->``;
it runs like the others, and what it enters into ``page_resources`` (an ExitStack) is closed
after the page. Each page runs in a folder of its own, so files a block makes (a state
database, a log) are gone after it, with its own event loop, closed after its last block, and
with the environment variables it sets put back.
"""

from __future__ import annotations

import ast
import asyncio
import contextlib
import os
import re
import sys
import tempfile
import types
from pathlib import Path
from typing import Any

from sybil import Example, Sybil
from sybil.evaluators.python import pad
from sybil.parsers.markdown import CodeBlockParser

ROOT = Path(__file__).resolve().parent
LOOP = "_page_loop"
HOME = "_page_home"
ENVIRONMENT = "_page_environment"


RUN_BY = re.compile(r"<!-- run by (tests/\w+\.py)::(\w+) -->\s*$")
"""Put before a block that must have a process to itself (it sets a global, as OpenTelemetry's
tracer provider is set once per process): the named test runs it, in a fresh interpreter."""


def _run_by_a_test(example: Example) -> bool:
    """Whether the block is run by the test named just before it; that test must exist and read
    this page (so renaming either breaks here, not silently)."""
    marker = RUN_BY.search(example.document.text[: example.start].rstrip() + "\n")
    if marker is None:
        return False
    test_file = ROOT / marker.group(1)
    text = test_file.read_text()
    page = Path(example.path).relative_to(ROOT).as_posix()
    assert f"def {marker.group(2)}(" in text, f"{marker.group(1)} has no test {marker.group(2)}"
    assert page in text, f"{marker.group(1)} does not read {page}"
    return True


def _evaluate(example: Example) -> None:
    """Runs one block; a block that awaits at its top level runs on the page's own loop."""
    __tracebackhide__ = True
    if _run_by_a_test(example):
        return
    source = pad(example.parsed, example.line + example.parsed.line_offset)
    code = compile(source, example.path, "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT, dont_inherit=True)
    namespace = example.namespace
    if "__name__" not in namespace:
        # The page is a module, as the reader's ``app.py`` would be: the programs it defines are
        # recorded by an importable ``module:name`` (a resume in this interpreter finds them).
        page = types.ModuleType(f"docs_page_{Path(example.path).stem.replace('-', '_')}")
        page.__getattr__ = lambda name: _lookup(namespace, name)  # type: ignore[method-assign]
        namespace["__name__"] = page.__name__
        sys.modules[page.__name__] = page
    result = eval(code, namespace)
    if asyncio.iscoroutine(result):
        namespace[LOOP].run_until_complete(result)
    namespace.pop("__builtins__", None)


def _lookup(namespace: dict[str, Any], name: str) -> Any:
    try:
        return namespace[name]
    except KeyError:
        raise AttributeError(name) from None


def _setup(namespace: dict[str, Any]) -> None:
    home = tempfile.TemporaryDirectory(prefix="ringzero-docs-")
    namespace[HOME] = (home, os.getcwd())
    os.chdir(home.name)
    namespace[LOOP] = asyncio.new_event_loop()
    namespace[ENVIRONMENT] = dict(os.environ)
    namespace["page_resources"] = contextlib.ExitStack()


def _teardown(namespace: dict[str, Any]) -> None:
    namespace["page_resources"].close()
    os.environ.clear()
    os.environ.update(namespace[ENVIRONMENT])
    loop: asyncio.AbstractEventLoop = namespace[LOOP]
    loop.run_until_complete(loop.shutdown_asyncgens())
    loop.close()
    sys.modules.pop(namespace.get("__name__", ""), None)
    home, cwd = namespace[HOME]
    os.chdir(cwd)
    home.cleanup()


pytest_collect_file = Sybil(
    parsers=[CodeBlockParser(language="python", evaluator=_evaluate)],
    patterns=["README.md", "docs/*.md"],
    setup=_setup,
    teardown=_teardown,
).pytest()

