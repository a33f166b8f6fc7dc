"""What a syscall is recognised by on replay: its fingerprint (a short hash of its arguments'
canonical JSON) and its summary (a short line of them), as the journal records both."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from ringzero.core.contract.json_data import canonical_json
from ringzero.core.contract.llm_types import LLMRequest

__all__ = ["canonical_json", "fingerprint", "llm_fingerprint", "trimmed"]


def trimmed(value: Any, width: int = 60) -> str:
    """``value`` as a short one-line text for a syscall's summary: a string's repr, anything
    else's canonical JSON, cut to ``width`` characters with an ellipsis."""
    # Cut before quoting: a prompt may be megabytes, and this runs at every call.
    text = repr(value[: width + 1]) if isinstance(value, str) else canonical_json(value)[: 4 * width]
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"


def fingerprint(args: Any) -> str:
    """A short stable hash of a syscall's arguments (canonical JSON, repr for the rest)."""
    return hashlib.sha256(canonical_json(args).encode()).hexdigest()[:16]


def llm_fingerprint(provider: str, request: LLMRequest) -> str:
    """``fingerprint({"provider": provider, "request": request.to_dict()})``, the same value,
    built faster: the canonical JSON is assembled by hand, and each message's part is kept on
    the message (a conversation sends the same messages again at every call). Encoding the
    whole request at every ``ctx.llm`` was a quarter of the syscall's own cost."""
    parts = ['{"provider":', _scalar(provider), ',"request":{"max_tokens":', _scalar(request.max_tokens),
             ',"messages":[', ",".join([m.canonical() for m in request.messages]), '],"model":', _scalar(request.model),
             ',"stop":[', ",".join(map(_string, request.stop)), '],"temperature":', _scalar(request.temperature),
             ',"tools":', canonical_json([t.to_dict() for t in request.tools]) if request.tools else "[]", "}}"]
    return hashlib.sha256("".join(parts).encode()).hexdigest()[:16]


_string = json.encoder.encode_basestring_ascii


def _scalar(value: Any) -> str:
    if value is None:
        return "null"
    if type(value) is str:
        return _string(value)
    return canonical_json(value)
