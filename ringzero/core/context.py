"""``Context``, what a program receives as its first argument: every method a syscall.

The public face of ``ringzero.core._engine.context`` (the engine's modules are private)."""

from ringzero.core._engine.context import Context

__all__ = ["Context"]
