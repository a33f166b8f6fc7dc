"""``Context``, what a program receives as its first argument: every method a syscall; the
``Conversation`` that ``ctx.conversation()`` returns, with ``SUMMARIZE``, the system prompt of
the LLM call that folds one (a scripted provider in a test knows a fold by it); and the
``Session`` that ``ctx.session()`` returns.

The public face of ``ringzero.core._engine.context``, ``.conversation`` and ``.session`` (the
engine's modules are private)."""

from ringzero.core._engine.context import Context
from ringzero.core._engine.conversation import SUMMARIZE, Conversation
from ringzero.core._engine.session import Session

__all__ = ["SUMMARIZE", "Context", "Conversation", "Session"]
