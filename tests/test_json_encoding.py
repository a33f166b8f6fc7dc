"""The kernel's JSON encoder (``json_encoder``, the C encoder called directly) writes exactly
what ``json.JSONEncoder`` with the same options writes, and fails where it fails with the same
error: records and fingerprints written before it replay unchanged."""

from __future__ import annotations

import enum
import hashlib
import json
from typing import Any

import pytest

from ringzero.core.contract.fingerprints import fingerprint
from ringzero.core.contract.store import dumps
from ringzero.core.contract.types import json_encoder


class Colour(enum.Enum):
    RED = 1


class Size(int, enum.Enum):
    LARGE = 3


class Ratio(float):
    pass


class Name(str):
    pass


def _contains_itself() -> list[Any]:
    loop: list[Any] = []
    loop.append(loop)
    return loop


def _nested(depth: int) -> list[Any]:
    value: list[Any] = []
    for _ in range(depth):
        value = [value]
    return value


VALUES: list[Any] = [
    None, True, False, 0, -5, 10**30, 1.5, 1e300, -0.0, float("nan"), float("inf"), float("-inf"),
    "plain", "Ünïcødé ☃ \"quoted\" \\ \n\t\u2028 😀", Name("a str subclass"), [], {}, (1, "tuple"),
    {"b": 1, "a": [1, 2.5, None, {"z": "é", "y": []}]}, {2: "int key", 2.5: "float key", True: "bool key"},
    {None: "none key", "z": 0},
    {"ratio": Ratio(2.0)}, Size.LARGE, {"colour": Colour.RED}, {(1,): "tuple key"}, _contains_itself(), object(),
    {"a set": {1, 2}}, b"bytes", _nested(50), _nested(100_000), {"deep": _nested(100_000)},
]
OPTIONS: list[dict[str, Any]] = [{}, {"allow_nan": False}, {"sort_keys": True, "default": repr}, {"sort_keys": True}]


def _outcome(encode: Any, value: Any) -> tuple[str, str]:
    try:
        return "text", encode(value)
    except Exception as exc:  # the error's kind and words must match too
        return type(exc).__name__, str(exc)


@pytest.mark.parametrize("options", OPTIONS, ids=lambda o: ",".join(o) or "defaults")
def test_json_encoder_writes_and_refuses_what_the_standard_encoder_does(options: dict[str, Any]) -> None:
    ours = json_encoder(**options)
    theirs = json.JSONEncoder(separators=(",", ":"), **options).encode
    for value in VALUES:
        assert _outcome(ours, value) == _outcome(theirs, value), repr(value)[:60]


def test_a_failed_encoding_leaves_nothing_behind_for_the_next() -> None:
    """A value that failed half way through (or contained itself) is not taken for a cycle
    the next time it is encoded."""
    encode = json_encoder(allow_nan=False)
    record: dict[str, Any] = {"x": float("nan")}
    with pytest.raises(ValueError, match="Out of range float"):
        encode(record)
    record["x"] = 1
    assert encode([record, record]) == '[{"x":1},{"x":1}]'
    record["x"] = record
    with pytest.raises(ValueError, match="Circular reference detected"):
        encode(record)
    record["x"] = [1]
    assert encode([record, record]) == '[{"x":[1]},{"x":[1]}]'


def test_records_and_fingerprints_are_the_standard_library_s_json() -> None:
    value = {"b": [1, 2.5, "é"], "a": None, "c": {"z": True, "y": "x"}}
    assert dumps(value) == json.dumps(value, separators=(",", ":"), allow_nan=False).encode()
    canonical = json.dumps(value, sort_keys=True, separators=(",", ":"), default=repr)
    assert fingerprint(value) == hashlib.sha256(canonical.encode()).hexdigest()[:16]
