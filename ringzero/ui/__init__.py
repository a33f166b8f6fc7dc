"""``ringzero ui``: a local web app over any store the CLI opens, for operators.

Processes in a filterable, paginated table that follows the store; one process's journal as a
timeline (its tool calls from code under their slot), its children, state and result; and the
operator's actions, each the operation its CLI command runs: settle an in-doubt call, pause,
resume, kill, send a message, and, given ``--kernel``, retry and fork at a slot. Safe by default,
as the MCP server: loopback unless told, a token, Host and Origin checked, a CSRF token on every
action (``ringzero.ui.guard``); ``--read-only`` offers no action. Needs the ``ui`` extra
(Starlette, uvicorn and Jinja2).
"""

from __future__ import annotations

from ringzero.core.contract.errors import MissingExtra

try:
    import jinja2  # noqa: F401  (the templates' engine, checked here to name the extra)
    import starlette  # noqa: F401
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise MissingExtra("ringzero.ui", "ui") from exc

from ringzero.ui.app import create_app

__all__ = ["create_app"]
