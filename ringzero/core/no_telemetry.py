"""Telemetry off: ``NoTelemetry``'s methods do nothing, so the kernel's syscall path is one piece
of code whether OpenTelemetry is there or not (``ringzero.core.telemetry.Telemetry`` overrides
each method)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from ringzero.core.types import JSON

if TYPE_CHECKING:
    from ringzero.core.process import Process

__all__ = ["NO_TELEMETRY", "NoTelemetry"]


class NoTelemetry:
    """Telemetry off: every method does nothing (the syscall path calls them either way)."""

    enabled = False

    def process_started(self, process: Process, parent: Any) -> Any:
        return None

    def process_ended(self, span: Any, process: Process) -> None:
        return None

    def replayed(self, span: Any, kind: str, seq: int) -> None:
        return None

    def current_context(self) -> Any:
        return None

    def syscall_opened(self, process: Process, kind: str, seq: int, summary: str,
                       about: Callable[[], Mapping[str, Any]] | None) -> Any:
        """What ``syscall_closed`` needs of a live syscall's span (None: no span)."""
        return None

    def syscall_closed(self, opened: Any, process: Process, kind: str, outcome: Mapping[str, JSON] | None,
                       raised: BaseException | None) -> None:
        """The syscall ended with ``outcome``, or ``raised``."""
        return None

    def llm_about(self, gate: Any, name: str, request: Any) -> dict[str, Any]:
        """The attributes of an LLM call's span (none without telemetry)."""
        return {}


NO_TELEMETRY = NoTelemetry()
