"""Query pieces shared by the checkpointers: metadata filtering and the list() selection."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ringzero.core.types import JSON


def matches(metadata: Mapping[str, JSON], wanted: Mapping[str, JSON] | None) -> bool:
    """True when every key of ``wanted`` is in ``metadata`` with an equal value."""
    return not wanted or all(key in metadata and metadata[key] == value for key, value in wanted.items())


def list_query(table: str, mark: str, thread_id: str | None, namespace: str | None, before: str | None,
               extra: list[tuple[str, Any]] | None = None) -> tuple[str, list[Any]]:
    """The SELECT behind ``list()``, newest first, with ``mark`` as the driver's placeholder.

    ``extra`` adds (condition, parameter) pairs, such as a database-side prefilter.
    """
    conditions = [(f"{column}={mark}", value) for column, value in
                  (("thread_id", thread_id), ("namespace", namespace)) if value is not None]
    if before is not None:
        conditions.append((f"id<{mark}", before))
    conditions += extra or []
    sql = f"SELECT * FROM {table}" + (" WHERE " + " AND ".join(c for c, _ in conditions) if conditions else "")
    return sql + " ORDER BY id DESC, thread_id DESC, namespace DESC", [v for _, v in conditions]


def selected(rows: list[Any], metadata_of: Any, wanted: Mapping[str, JSON] | None, limit: int | None) -> list[Any]:
    """The rows whose metadata matches ``wanted``, at most ``limit`` of them, in order."""
    kept = [row for row in rows if matches(metadata_of(row), wanted)] if wanted else list(rows)
    return kept if limit is None else kept[:limit]
