"""CrewAI Flow persistence (what ``@persist`` uses) over any ringzero Checkpointer."""

from __future__ import annotations

import datetime
import json
from typing import Any

from ringzero.core.contract.errors import InvalidArgument, MissingExtra
from ringzero.core.contract.ids import time_ordered_id
from ringzero.core.contract.protocols import Checkpointer
from ringzero.core.contract.types import Checkpoint
from ringzero.core.support.loops import LoopHome

try:
    from crewai.flow.persistence.base import FlowPersistence
    from pydantic import BaseModel, ConfigDict, PrivateAttr
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise MissingExtra("ringzero.adapters.crewai", "crewai") from exc

__all__ = ["KernelFlowPersistence"]


class KernelFlowPersistence(FlowPersistence):
    """CrewAI Flow persistence (what ``@persist`` uses) over any ringzero Checkpointer.

    Each save is one checkpoint on thread ``crewai-flow:<flow id>``, so the newest one is what
    a restarted flow loads (``flow.kickoff(inputs={"id": ...})``). Pending human feedback is
    kept in the same thread's ``pending`` namespace. CrewAI calls it synchronously: the
    checkpointer lives on one loop (``ringzero.core.support.loops``), a private thread unless a loop
    already uses it, which ``close()`` stops (the checkpointer itself stays the caller's).
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)
    persistence_type: str = "KernelFlowPersistence"
    _store: Checkpointer = PrivateAttr()
    _home: LoopHome = PrivateAttr()

    def __init__(self, checkpointer: Checkpointer, **data: Any) -> None:
        if not callable(getattr(checkpointer, "put", None)):
            raise InvalidArgument(f"KernelFlowPersistence needs a ringzero Checkpointer, not {checkpointer!r}")
        super().__init__(**data)
        self._store = checkpointer
        self._home = LoopHome("KernelFlowPersistence")

    def close(self) -> None:
        """Stop the private loop thread, if one was started."""
        self._home.close()

    def init_db(self) -> None:
        """Nothing to create: the checkpointer makes its schema when first used."""

    def save_state(self, flow_uuid: str, method_name: str, state_data: dict[str, Any] | BaseModel) -> None:
        self._put(flow_uuid, "", _state_dict(state_data), {"method": method_name})

    def load_state(self, flow_uuid: str) -> dict[str, Any] | None:
        record = self._home.run_sync(self._store.get(_thread(flow_uuid), ""), "KernelFlowPersistence.load_state")
        return None if record is None else dict(json.loads(record.payload))

    def save_pending_feedback(self, flow_uuid: str, context: Any, state_data: dict[str, Any] | BaseModel) -> None:
        state = _state_dict(state_data)
        self._put(flow_uuid, "", state, {"method": context.method_name})
        self._put(flow_uuid, "pending", {"context": context.to_dict(), "state": state}, {"pending": True})

    def load_pending_feedback(self, flow_uuid: str) -> tuple[dict[str, Any], Any] | None:
        from crewai.flow.async_feedback.types import PendingFeedbackContext

        record = self._home.run_sync(self._store.get(_thread(flow_uuid), "pending"), "KernelFlowPersistence")
        if record is None or not record.metadata.get("pending"):
            return None
        body = json.loads(record.payload)
        return body["state"], PendingFeedbackContext.from_dict(body["context"])

    def clear_pending_feedback(self, flow_uuid: str) -> None:
        self._put(flow_uuid, "pending", {}, {"pending": False})

    def _put(self, flow_uuid: str, namespace: str, body: dict[str, Any], metadata: dict[str, Any]) -> None:
        checkpoint_id = time_ordered_id()  # newest sorts last, across processes
        payload = json.dumps(body, default=_json_default).encode()
        record = Checkpoint(_thread(flow_uuid), namespace, checkpoint_id, payload, metadata=metadata)
        self._home.run_sync(self._store.put(record), "KernelFlowPersistence")


def _thread(flow_uuid: str) -> str:
    return f"crewai-flow:{flow_uuid}"


def _state_dict(state: dict[str, Any] | BaseModel) -> dict[str, Any]:
    """The state as CrewAI's own SQLite persistence turns it into a dict: a model's JSON dump,
    or its Python dump where a field has no JSON form (``_json_default`` takes it from there)."""
    if isinstance(state, BaseModel):
        try:
            return state.model_dump(mode="json")
        except Exception:  # pydantic's error for a field it cannot put in JSON: as CrewAI does
            return state.model_dump(mode="python")
    if isinstance(state, dict):
        return state
    raise InvalidArgument(f"flow state must be a dict or a pydantic model, not {type(state).__name__}")


def _json_default(value: Any) -> Any:
    """What JSON cannot hold, as CrewAI's persistence writes it: models dumped, sets and tuples
    as lists, dates in ISO 8601, anything else as its ``str``."""
    if isinstance(value, BaseModel):
        try:
            return value.model_dump(mode="json")
        except Exception:  # as above
            return value.model_dump(mode="python")
    if isinstance(value, (set, tuple)):
        return list(value)
    if isinstance(value, (datetime.date, datetime.datetime)):
        return value.isoformat()
    return str(value)
