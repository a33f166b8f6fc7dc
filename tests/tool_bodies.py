"""Tool functions for the sandboxed-tool tests (module level, as real tools are)."""

from __future__ import annotations

import json
from typing import Dict  # noqa: UP035 - a module-level name used only in an annotation, on purpose

from langchain_core.callbacks import CallbackManagerForToolRun
from langchain_core.tools import BaseTool, tool

SECRET_SETTING = "host only"


def word_stats(text: str, top: int = 2) -> dict[str, object]:
    """Count the words of a text and list the most common ones."""
    counts: dict[str, int] = {}
    for word in text.lower().split():
        counts[word] = counts.get(word, 0) + 1
    ranked = sorted(counts, key=lambda w: (-counts[w], w))
    return {"words": len(text.split()), "top": ranked[:top]}


def read_file(path: str) -> str:
    """Read a file (a host would let it; a sandbox must not)."""
    with open(path) as f:
        return f.read()


def divide(a: float, b: float) -> float:
    """Divide a by b (b = 0 raises inside the sandbox)."""
    return a / b


def uses_module_json(data: str) -> str:
    """Pretty-print JSON using the module's import."""
    return json.dumps(json.loads(data), indent=2)


def uses_module_constant() -> str:
    """Return a module-level setting."""
    return SECRET_SETTING


@tool
def shout(text: str) -> str:
    """Shout the text back."""
    return text.upper() + "!"


def annotated(values: list[int]) -> Dict[str, int]:  # noqa: UP006
    """Sum values (its annotations name typing constructs the sandbox does not need)."""
    total: int = 0
    for value in values:
        total += value
    return {"total": total}


def crew_word_count(text: str) -> int:
    """Count the words of a text."""
    return len(text.split())


def crew_read_file(path: str) -> str:
    """Read a file."""
    with open(path) as f:
        return f.read()


def split_words(text: str) -> tuple[str, list[str]]:
    """Split a text: the count for the model, the words as the artifact."""
    words = text.split()
    return f"{len(words)} words", words


def echo_line(line: str) -> str:
    """Echo one line (a single-input Tool's function)."""
    return "echo " + line


async def add_later(a: int, b: int) -> int:
    """Add two numbers, asynchronously."""
    return a + b


class Upper(BaseTool):
    """A LangChain tool class whose _run uses only its arguments."""

    name: str = "upper"
    description: str = "Upper-case a text."

    def _run(self, text: str, run_manager: CallbackManagerForToolRun | None = None) -> str:
        return text.upper()
