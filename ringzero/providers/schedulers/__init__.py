"""Schedulers: which ready process runs, and how many at once."""

from __future__ import annotations

from ringzero.providers.schedulers.local import LocalScheduler

__all__ = ["LocalScheduler"]
