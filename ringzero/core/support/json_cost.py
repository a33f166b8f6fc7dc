"""What a value from a sandbox costs the host, counted before anything converts it.

A value crossing the boundary (a tool call's arguments, a result, the code's final value) is
made JSON before the host keeps it: the journal stores it, the run's byte budget counts it.
Making JSON is one C call that holds the GIL until it is done, so it stalls every thread of the
host, the event loop's included, for as long as the value is large: half a million floats take
0.4 s. So the value is first walked (``_walk``): its JSON size counted item by item, exactly for
numbers (a float is as long as its ``repr``, not one byte), at least for strings (one byte a
character), its nesting depth and its kinds checked, stopping as soon as it is over the limit.
Only a value within the limit is made JSON, and that costs at most about 50 ms a megabyte.

The walk is Python, so a thread running it gives the GIL up every few milliseconds;
``measure_async`` also hands the event loop a turn every ``CHUNK`` items, so a walk on the loop
itself stalls it no more than a few milliseconds at a time.
"""

from __future__ import annotations

import asyncio
import itertools
import math
from collections.abc import Generator, Iterator
from typing import Any

from ringzero.core.contract.json_data import strict_json

__all__ = ["CHUNK", "MAX_DEPTH", "NOT_JSON", "cheap", "check_value", "measure", "measure_async", "too_large"]

MAX_DEPTH = 100
"""How deeply lists and dicts may nest in anything that crosses the sandbox boundary (the
process sandbox's runner, which ships alone, keeps the same number: ``_runner.MAX_DEPTH``)."""

NOT_JSON = "is not JSON-compatible"
"""What ``check_value`` says of a value that JSON cannot hold (a set, NaN, an infinity)."""
CHUNK = 4096
"""Items walked between two turns of the event loop (a few milliseconds)."""
_END = object()
_MAX_INT_BITS = 14_000
"""Past about 4,300 digits an int has no decimal text (``sys.get_int_max_str_digits``): not JSON."""


def _walk(value: Any, what: str, max_bytes: int | None,
          lenient: bool = False) -> Generator[None, None, tuple[int, str | None]]:
    """Walk ``value`` without recursion; yield every ``CHUNK`` items; return a lower bound on
    the bytes of its JSON (exact but for strings' escapes and keys' quotes) and why it may not
    cross, or None. ``lenient``: what is not JSON (an object that will be shown as its text,
    NaN) counts as two bytes and is not refused; only the size and the depth are judged.

    The stack holds one iterator per open container, never the items themselves: each item
    costs the same few steps whatever its container's size, and nothing is allocated for it."""
    total, seen = 0, 0
    stack: list[Iterator[Any]] = [iter((value,))]
    while stack:
        item = next(stack[-1], _END)
        if item is _END:
            stack.pop()
            continue
        seen += 1
        if seen % CHUNK == 0:
            yield
        if isinstance(item, str):
            total += len(item) + 2
        elif item is None or isinstance(item, bool):
            total += 4 if item is not False else 5
        elif isinstance(item, int):
            if item.bit_length() > _MAX_INT_BITS:
                return 0, f"{what} {NOT_JSON}: an int of more than 4,300 digits"
            total += len(int.__repr__(item))
        elif isinstance(item, float):
            if not math.isfinite(item) and not lenient:
                return 0, f"{what} {NOT_JSON}: {item!r} is not JSON"
            total += len(float.__repr__(item))
        elif isinstance(item, (list, tuple, dict)):
            if len(stack) > MAX_DEPTH:
                return 0, f"{what} nests lists or dicts more than {MAX_DEPTH} levels deep"
            total += 2 + max(len(item) - 1, 0)  # brackets and commas
            if isinstance(item, dict):  # its keys, then its values, walked as items (a key's quotes not counted)
                total += len(item)  # colons
                stack.append(itertools.chain.from_iterable(item.items()))
            else:
                stack.append(iter(item))
        elif lenient:
            total += 2
        else:
            return 0, f"{what} {NOT_JSON}: a {type(item).__name__} is not JSON"
        if max_bytes is not None and total > max_bytes:
            return total, f"{what} is more than {max_bytes} bytes of JSON, the limit"
    return total, None


_SMALL_ITEMS = 16
_SMALL_TEXT = 1024
_SMALL_INT = 1 << 64


def _small(value: Any, depth: int) -> bool:
    """True for a value whose JSON costs next to nothing to make, so that the walk can be
    skipped: a short string, a finite float, an int of at most 64 bits, a bool or None, or a
    list, tuple or dict of at most ``_SMALL_ITEMS`` such items (string keys), ``depth`` deep."""
    kind = type(value)
    if kind is int:  # the commonest first
        return bool(-_SMALL_INT < value < _SMALL_INT)
    if kind is str:
        return len(value) <= _SMALL_TEXT
    if kind is float:
        return math.isfinite(value)
    if value is None or kind is bool:
        return True
    if depth == 0:
        return False
    if kind is list or kind is tuple:
        return len(value) <= _SMALL_ITEMS and all(_small(item, depth - 1) for item in value)
    if kind is dict:
        return len(value) <= _SMALL_ITEMS and all(type(k) is str and len(k) <= _SMALL_TEXT and _small(v, depth - 1)
                                                  for k, v in value.items())
    return False


def cheap(value: Any) -> bool:
    """True for a value whose JSON costs next to nothing to make (a few short plain items, two
    levels deep at most): it needs no walk, and may be made JSON on the event loop itself."""
    return _small(value, 2)


def _exact(value: Any, what: str, max_bytes: int | None) -> tuple[int, str | None]:
    """The size of ``value``'s JSON as the journal stores it (compact, ASCII), once the walk
    found it within the limit: this conversion now costs little."""
    try:
        size = len(strict_json(value))
    except (TypeError, ValueError, RecursionError) as exc:
        return 0, f"{what} {NOT_JSON}: {str(exc)[:200]}"
    if max_bytes is not None and size > max_bytes:
        return size, f"{what} is {size} bytes of JSON, over the limit of {max_bytes}"
    return size, None


def _finish(walk: Generator[None, None, tuple[int, str | None]]) -> tuple[int, str | None]:
    try:
        while True:
            next(walk)
    except StopIteration as stop:
        done: tuple[int, str | None] = stop.value
        return done


def too_large(value: Any, what: str, max_bytes: int | None) -> str | None:
    """Why ``value`` is too large or too deep to cross, judged before it is made JSON-ready
    (what is not JSON counts as two bytes: it will be shown as its text), or None."""
    return _finish(_walk(value, what, max_bytes, lenient=True))[1]


def measure(value: Any, what: str, max_bytes: int | None) -> tuple[int, str | None]:
    """The bytes of ``value``'s JSON as the journal stores it, and why it may not cross the
    boundary (too deep, too large, not JSON) or None. For a caller off the event loop (a thread
    gives the GIL up during the walk), or one whose value is the host's own."""
    if cheap(value):  # a few short plain items (a tool call's usual arguments): JSON at once
        return _exact(value, what, max_bytes)
    size, problem = _finish(_walk(value, what, max_bytes))
    return (size, problem) if problem is not None else _exact(value, what, max_bytes)


async def measure_async(value: Any, what: str, max_bytes: int | None) -> tuple[int, str | None]:
    """``measure`` on the event loop, giving it a turn every ``CHUNK`` items."""
    walk = _walk(value, what, max_bytes)
    try:
        while True:
            next(walk)
            await asyncio.sleep(0)
    except StopIteration as stop:
        size, problem = stop.value
    return (size, problem) if problem is not None else _exact(value, what, max_bytes)


def check_value(value: Any, what: str, max_bytes: int | None) -> str | None:
    """Why ``value`` may not cross the boundary (too deep, too large, not JSON), or None."""
    return measure(value, what, max_bytes)[1]
