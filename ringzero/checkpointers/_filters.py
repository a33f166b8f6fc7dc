"""Metadata filtering shared by the checkpointers."""

from __future__ import annotations

from collections.abc import Mapping

from ringzero.core.types import JSON


def matches(metadata: Mapping[str, JSON], wanted: Mapping[str, JSON] | None) -> bool:
    """True when every key of ``wanted`` is in ``metadata`` with an equal value."""
    return not wanted or all(key in metadata and metadata[key] == value for key, value in wanted.items())
