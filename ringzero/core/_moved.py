"""Modules that moved, kept at their old paths for a release with a warning (CHANGELOG.md).

Each old module is a few lines calling ``forward``: a name asked of it is looked up at its new
home, with a ``DeprecationWarning`` that names where to import it from now."""

from __future__ import annotations

import importlib
import warnings
from typing import Any

__all__ = ["forward"]


def forward(old: str, new: str) -> Any:
    """A module ``__getattr__`` for the old module ``old``: each name comes from ``new``, with a
    warning saying so."""
    def __getattr__(name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        target = importlib.import_module(new)
        try:
            value = getattr(target, name)
        except AttributeError:
            raise AttributeError(f"module {old!r} has no attribute {name!r} (it moved to {new})") from None
        warnings.warn(f"{old} moved: import {name} from {new} (the old path goes in a later release)",
                      DeprecationWarning, stacklevel=2)
        return value

    return __getattr__
