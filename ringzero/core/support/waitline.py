"""The wait lines: lower priority numbers first, then a lower rank, then arrival order.

``PriorityLine``: the rank is fixed when an item joins. The scheduler's ready processes, a
process's mailbox and the LLM gate's callers in first-come-first-served order wait in one.
``ServiceLine``: the rank is the service the item's program has had at the moment the head is
asked for (the LLM gate's least-attained-service order), so calls queued early yield to a newer
program's once their own program has been served. Leaving either line (a cancelled waiter, or
one served out of turn) is O(1): the entry is marked and skipped when it reaches the head.
"""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from collections.abc import Callable
from typing import Any, Generic, TypeVar

__all__ = ["Entry", "PriorityLine", "ServiceLine"]

T = TypeVar("T")


class Entry(Generic[T]):
    __slots__ = ("arrival", "item", "live", "priority", "rank")

    def __init__(self, priority: int, arrival: int, item: T, rank: float = 0.0) -> None:
        self.priority, self.arrival, self.item, self.live, self.rank = priority, arrival, item, True, rank

    def __lt__(self, other: Entry[Any]) -> bool:
        return (self.priority, self.rank, self.arrival) < (other.priority, other.rank, other.arrival)


class _Line(Generic[T]):
    """What both lines share: a count of the items in line, and O(1) leaving."""

    def __init__(self) -> None:
        self._arrival = itertools.count()
        self._live = 0

    def __len__(self) -> int:
        """How many items are in line (those that left are not counted)."""
        return self._live

    def leave(self, entry: Entry[T]) -> None:
        """Take ``entry`` out of the line (nothing happens if it already left or was popped)."""
        if entry.live:
            entry.live = False
            self._live -= 1
            if not self._live:
                self._emptied()

    def _emptied(self) -> None:
        """The last item in line left: what is kept of the ones before goes."""


class PriorityLine(_Line[T]):
    """A heap of items by (priority, rank, arrival) with O(1) leaving."""

    def __init__(self) -> None:
        super().__init__()
        self._heap: list[Entry[T]] = []

    def push(self, priority: int, item: T, rank: float = 0.0) -> Entry[T]:
        """Join the line; the entry is what ``leave`` takes."""
        entry = Entry(priority, next(self._arrival), item, rank)
        heapq.heappush(self._heap, entry)
        self._live += 1
        return entry

    def _emptied(self) -> None:
        self._heap.clear()

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


class _Lane(Generic[T]):
    """One priority's programs in a ``ServiceLine``: each program's entries in arrival order, and
    a heap of ``(service, arrival of its first entry, program)``, one per program, whose keys
    are brought up to date as they reach the top (service only grows, so a key out of date is
    never above the truth: the top, once current, is the least)."""

    __slots__ = ("heap", "programs")

    def __init__(self) -> None:
        self.heap: list[tuple[float, int, int]] = []
        self.programs: dict[int, deque[Entry[T]]] = {}

    def head(self, service: Callable[[int], float]) -> Entry[T] | None:
        heap, programs = self.heap, self.programs
        while heap:
            key, arrival, program = heap[0]
            queue = programs[program]
            while queue and not queue[0].live:
                queue.popleft()
            if not queue:
                heapq.heappop(heap)
                del programs[program]
                continue
            now, first = service(program), queue[0].arrival
            if now != key or first != arrival:
                heapq.heapreplace(heap, (now, first, program))
                continue
            return queue[0]
        return None


class ServiceLine(_Line[T]):
    """A line of programs by the service each has had *now* (``service(program)``, asked when
    the head is), each program's items in arrival order: lower priority numbers first, then
    the least-served program, then the one whose first item came first.

    A program whose earlier calls were served while ten more of its calls waited ranks by what
    it has had since; its waiting calls yield to a program that has had less, however long they
    have been in line (the gate bounds that: ``starvation_after``). A service that goes down
    (``LLMGate.forget``) is seen when that program next reaches the top of its priority."""

    def __init__(self, service: Callable[[int], float]) -> None:
        super().__init__()
        self._service = service
        self._lanes: dict[int, _Lane[T]] = {}

    def push(self, priority: int, item: T, program: int) -> Entry[T]:
        """Join the line as one of ``program``'s items; the entry is what ``leave`` takes."""
        entry = Entry(priority, next(self._arrival), item)
        lane = self._lanes.get(priority)
        if lane is None:
            lane = self._lanes[priority] = _Lane()
        queue = lane.programs.get(program)
        if queue is None:
            lane.programs[program] = deque((entry,))
            heapq.heappush(lane.heap, (self._service(program), entry.arrival, program))
        else:
            queue.append(entry)
        self._live += 1
        return entry

    def _emptied(self) -> None:
        self._lanes.clear()

    def head(self) -> Entry[T] | None:
        """The entry first in line now, or None when the line is empty."""
        for priority in sorted(self._lanes):
            found = self._lanes[priority].head(self._service)
            if found is not None:
                return found
            del self._lanes[priority]
        return None

    def items(self) -> list[T]:
        """The items in line, in no particular order."""
        return [entry.item for lane in self._lanes.values() for queue in lane.programs.values()
                for entry in queue if entry.live]
