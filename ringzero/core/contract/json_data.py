"""JSON values: the one form every record the kernel journals takes, and the checks on it."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import Any, Union

from ringzero.core.contract.errors import NotSerializable

JSON = Union[None, bool, int, float, str, list["JSON"], dict[str, "JSON"]]

__all__ = ["JSON", "ensure_json", "json_encoder", "json_form", "json_problem", "json_size", "strict_json"]


def _not_serializable(value: Any) -> Any:
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


def json_encoder(*, sort_keys: bool = False, allow_nan: bool = True,
                 default: Callable[[Any], Any] | None = None) -> Callable[[Any], str]:
    """Compact JSON text (``separators=(",", ":")``, ASCII), exactly as ``json.JSONEncoder``
    with these options writes it, a microsecond faster a call: the encoder's ``encode`` sets up
    its C encoder again at every call in Python (a closure, a call with nine arguments, the
    top-level checks), and the kernel encodes several records at every syscall and lifecycle
    step. This calls one C encoder made once, which keeps no table of the containers being
    encoded (making an encoder with a fresh table at every call cost 0.3 µs, and keeping the
    table a microsecond more for a status row). A value that contains itself then ends in a
    ``RecursionError`` instead; any error is answered by encoding the value again with a fresh
    table, so that what is raised is exactly what ``json.dumps`` raises (a value that contains
    itself is refused with its ValueError). Where the interpreter has no C encoder, it is
    ``json.JSONEncoder(...).encode``."""
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None:  # pragma: no cover - CPython always has it
        return json.JSONEncoder(separators=(",", ":"), sort_keys=sort_keys, allow_nan=allow_nan,
                                default=default).encode
    fallback = default or _not_serializable
    ascii_string = json.encoder.encode_basestring_ascii
    unchecked = make(None, fallback, ascii_string, None, ":", ",", sort_keys, False, allow_nan)

    def encode(value: Any) -> str:
        if type(value) is str:
            return ascii_string(value)
        try:
            return "".join(unchecked(value, 0))
        except Exception:  # again, checked, for the standard library's own error
            return "".join(make({}, fallback, ascii_string, None, ":", ",", sort_keys, False, allow_nan)(value, 0))

    return encode


canonical_json = json_encoder(sort_keys=True, default=repr)
"""Built once (``json.dumps`` with options builds an encoder at every call, and it runs at every
syscall): canonical JSON, keys sorted, ``repr`` for what JSON cannot hold. What a syscall's
fingerprint is made of (``ringzero.core.contract.fingerprints``)."""

strict_json = json_encoder(allow_nan=False)
"""Compact JSON text of a value, refusing NaN and infinities (not JSON), a value that contains
itself (ValueError) and anything that is not JSON (TypeError)."""


def ensure_json(value: Any, what: str) -> JSON:
    """Return ``value`` if it survives a JSON round trip unchanged in kind, else raise.

    ``what`` names the value in the error, e.g. ``"message to pid 3"``.
    """
    json_size(value, what)
    checked: JSON = value  # JSON now: it survived the encoding
    return checked


def json_size(value: Any, what: str) -> int:
    """The length of ``value``'s compact JSON text, as the store keeps it; NotSerializable,
    naming ``what``, if it has none. (``json.dumps(value, allow_nan=False)`` builds a new
    encoder at every call: 2 to 3 µs more, at every message sent and every value returned.)"""
    try:
        return len(strict_json(value))
    except (TypeError, ValueError) as exc:
        raise NotSerializable(
            f"{what} must be JSON-compatible (dict, list, str, int, float, bool, None): {exc}"
        ) from exc


def json_problem(value: Any, path: str) -> str | None:
    """Why ``value`` would not come back from the store as it is, naming where in it (``path``
    is its name, e.g. ``ctx.state``); None when it would. Stricter than ``ensure_json``: a tuple
    (read back as a list), a key that is not a string (read back as one) and NaN or infinity
    (not JSON) are refused too, since a resumed program would see something else."""
    if value is None or isinstance(value, (str, bool, int)):
        return None
    if isinstance(value, float):
        return None if math.isfinite(value) else f"{path} is {value!r}, which JSON cannot hold"
    if isinstance(value, list):
        for i, item in enumerate(value):
            problem = json_problem(item, f"{path}[{i}]")
            if problem is not None:
                return problem
        return None
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                return (f"{path} has the key {key!r}, a {type(key).__name__}, which would be read back as a string "
                        "(or not stored at all); use string keys")
            problem = json_problem(item, f"{path}[{key!r}]")
            if problem is not None:
                return problem
        return None
    if isinstance(value, tuple):
        return f"{path} is a tuple, which would be read back as a list; store a list"
    return (f"{path} is a {type(value).__name__} ({value!r:.60}), which is not JSON (dict, list, str, int, float, "
            "bool, None); store a JSON form of it")


def json_form(value: Any) -> JSON:
    """A JSON form of ``value`` to keep where the value itself cannot be stored: tuples as
    lists, keys as strings, and anything else that is not JSON (NaN included) as its repr."""
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)
    if value is None or isinstance(value, (str, bool, int, float)):
        return value
    if isinstance(value, (list, tuple)):
        return [json_form(item) for item in value]
    if isinstance(value, dict):
        return {str(key): json_form(item) for key, item in value.items()}
    return repr(value)
