"""Functions named by reference, ``module:qualname``: how a journaled program, a registered
tool or a ``--kernel`` factory is found again by a later Python process."""

from __future__ import annotations

import importlib
from typing import Any

from ringzero.core.errors import InvalidArgument

__all__ = ["import_reference", "importable_reference", "reference_of"]


def reference_of(obj: Any) -> str:
    """``module:qualname`` of a function or class, importable or not."""
    return f"{obj.__module__}:{obj.__qualname__}"


def importable_reference(obj: Any) -> str | None:
    """``module:qualname`` when another process could import it again: None for functions in
    ``__main__``, local functions and lambdas."""
    module, qualname = getattr(obj, "__module__", None), getattr(obj, "__qualname__", "")
    if not module or module == "__main__" or "<locals>" in qualname or "<lambda>" in qualname:
        return None
    return f"{module}:{qualname}"


def import_reference(reference: str, what: str) -> Any:
    """The object named by ``module:qualname``; InvalidArgument, naming ``what`` and why, if
    it cannot be imported."""
    module_name, colon, qualname = reference.partition(":")
    if not colon or not module_name or not qualname or "<locals>" in qualname:
        raise InvalidArgument(f"{what} {reference!r} is not an importable 'module:qualname' reference")
    try:
        target: Any = importlib.import_module(module_name)
        for part in qualname.split("."):
            target = getattr(target, part)
    except (ImportError, AttributeError, ValueError) as exc:
        raise InvalidArgument(f"cannot import {what} {reference!r}: {exc}") from exc
    return target
