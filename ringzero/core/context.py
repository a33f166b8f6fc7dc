"""``Context``, what a program receives as its first argument: every method a syscall; and the
``Conversation`` that ``ctx.conversation()`` returns, with ``SUMMARIZE``, the system prompt of
the LLM call that folds one (a scripted provider in a test knows a fold by it).

The public face of ``ringzero.core._engine.context`` and ``.conversation`` (the engine's
modules are private)."""

from ringzero.core._engine.context import Context
from ringzero.core._engine.conversation import SUMMARIZE, Conversation

__all__ = ["SUMMARIZE", "Context", "Conversation"]
