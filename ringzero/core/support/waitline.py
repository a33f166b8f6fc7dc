"""The one priority wait line: lower priority numbers first, then a lower rank (the LLM gate's
scheduling policy: the service a program has had), then arrival order.

The LLM gate's callers, the scheduler's ready processes and a process's mailbox all wait in
one of these. Leaving the line (a cancelled waiter, or one served out of turn) is O(1): the
entry is marked and skipped when it reaches the head.
"""

from __future__ import annotations

import heapq
import itertools
from typing import Any, Generic, TypeVar

__all__ = ["Entry", "PriorityLine"]

T = TypeVar("T")


class Entry(Generic[T]):
    __slots__ = ("arrival", "item", "live", "priority", "rank")

    def __init__(self, priority: int, arrival: int, item: T, rank: float = 0.0) -> None:
        self.priority, self.arrival, self.item, self.live, self.rank = priority, arrival, item, True, rank

    def __lt__(self, other: Entry[Any]) -> bool:
        return (self.priority, self.rank, self.arrival) < (other.priority, other.rank, other.arrival)


class PriorityLine(Generic[T]):
    """A heap of items by (priority, rank, arrival) with O(1) leaving."""

    def __init__(self) -> None:
        self._heap: list[Entry[T]] = []
        self._arrival = itertools.count()
        self._live = 0

    def __len__(self) -> int:
        """How many items are in line (those that left are not counted)."""
        return self._live

    def push(self, priority: int, item: T, rank: float = 0.0) -> Entry[T]:
        """Join the line; the entry is what ``leave`` takes."""
        entry = Entry(priority, next(self._arrival), item, rank)
        heapq.heappush(self._heap, entry)
        self._live += 1
        return entry

    def leave(self, entry: Entry[T]) -> None:
        """Take ``entry`` out of the line (nothing happens if it already left or was popped)."""
        if entry.live:
            entry.live = False
            self._live -= 1

    def _trim(self) -> None:
        while self._heap and not self._heap[0].live:
            heapq.heappop(self._heap)

    def head(self) -> Entry[T] | None:
        """The entry first in line, or None when the line is empty."""
        self._trim()
        return self._heap[0] if self._heap else None

    def items(self) -> list[T]:
        """The items in line, in no particular order."""
        return [entry.item for entry in self._heap if entry.live]

    def pop(self) -> T:
        """Take the first item out of the line (IndexError when it is empty)."""
        self._trim()
        entry = heapq.heappop(self._heap)
        entry.live = False
        self._live -= 1
        return entry.item
