"""Query pieces shared by the checkpointers: metadata filtering and the list() selection."""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from ringzero.core.contract.types import JSON


def matches(metadata: Mapping[str, JSON], wanted: Mapping[str, JSON] | None) -> bool:
    """True when every key of ``wanted`` is in ``metadata`` with an equal value."""
    return not wanted or all(key in metadata and metadata[key] == value for key, value in wanted.items())


_SIMPLE_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")


def pushable(wanted: Mapping[str, JSON] | None) -> Iterator[tuple[str, str | int | float]]:
    """The (key, value) pairs of a metadata filter a database can compare itself: a plain
    identifier as key (it is written into the SQL, where an index on that key can serve it)
    and a string or number as value. The exact test still runs on what the database returns."""
    for key, value in (wanted or {}).items():
        if _SIMPLE_KEY.fullmatch(key) and isinstance(value, (str, int, float)) and not isinstance(value, bool):
            yield key, value


def list_query(select: str, mark: str, thread_id: str | None, namespace: str | None, before: str | None,
               extra: list[tuple[str, Any]] | None = None) -> tuple[str, list[Any]]:
    """``select`` with the conditions of ``list()``, newest first, with ``mark`` as the driver's
    placeholder. ``extra`` adds (condition, parameter) pairs, such as a database-side prefilter.
    """
    conditions = [(f"{column}={mark}", value) for column, value in
                  (("thread_id", thread_id), ("namespace", namespace)) if value is not None]
    if before is not None:
        conditions.append((f"id<{mark}", before))
    conditions += extra or []
    sql = select + (" WHERE " + " AND ".join(c for c, _ in conditions) if conditions else "")
    return sql + " ORDER BY id DESC, thread_id DESC, namespace DESC", [v for _, v in conditions]


def selected(rows: Sequence[Any], metadata_of: Any, wanted: Mapping[str, JSON] | None, limit: int | None) -> list[Any]:
    """The rows whose metadata matches ``wanted``, at most ``limit`` of them, in order."""
    kept = [row for row in rows if matches(metadata_of(row), wanted)] if wanted else list(rows)
    return kept if limit is None else kept[:limit]
