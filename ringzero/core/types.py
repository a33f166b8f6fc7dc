"""Moved: ``ringzero.core.types`` is ``ringzero.protocols`` now (its names warn here for a release)."""

from ringzero.core._moved import forward

__getattr__ = forward(__name__, "ringzero.protocols")
