"""Telemetry off: ``NoTelemetry``'s methods do nothing, so the kernel's syscall path is one piece
of code whether OpenTelemetry is there or not (``ringzero.core.support.telemetry.Telemetry`` overrides
each method)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol

from ringzero.core.contract.outcomes import Outcome
from ringzero.core.contract.records import ProcessRecord

__all__ = ["NO_TELEMETRY", "NoTelemetry", "Traced"]


class Traced(Protocol):
    """What telemetry reads of a process (the engine's ``Process``)."""

    @property
    def pid(self) -> int: ...
    @property
    def record(self) -> ProcessRecord: ...
    @property
    def recovered(self) -> bool: ...
    @property
    def span(self) -> Any: ...
    @property
    def runtime(self) -> Any: ...
    @property
    def fenced(self) -> BaseException | None: ...
    @property
    def left_unfinished(self) -> BaseException | None: ...


class NoTelemetry:
    """Telemetry off: every method does nothing (the syscall path calls them either way)."""

    enabled = False

    def process_started(self, process: Traced, parent: Any) -> Any:
        return None

    def process_ended(self, span: Any, process: Traced) -> None:
        return None

    def replayed(self, span: Any, kind: str, seq: int) -> None:
        return None

    def timer_set(self, opened: Any, deadline: float) -> None:
        """A waiting syscall's timer fires at ``deadline`` (wall clock)."""
        return None

    def current_context(self) -> Any:
        return None

    def syscall_opened(self, process: Traced, kind: str, seq: int, summary: str,
                       about: Callable[[], Mapping[str, Any]] | None) -> Any:
        """What ``syscall_closed`` needs of a live syscall's span (None: no span)."""
        return None

    def syscall_closed(self, opened: Any, process: Traced, kind: str, outcome: Outcome | None,
                       raised: BaseException | None) -> None:
        """The syscall ended with ``outcome``, or ``raised``."""
        return None

    def llm_about(self, gate: Any, name: str, request: Any) -> dict[str, Any]:
        """The attributes of an LLM call's span (none without telemetry)."""
        return {}


NO_TELEMETRY = NoTelemetry()
