"""A warning, once per model or tool, for LangChain calls that a kernel process makes around
the kernel: a chat model that is not ``KernelChatModel``, a tool run outside any syscall (a
plain ``ToolNode``, a tool invoked by hand). Their calls are not journaled, so a resumed
process makes them again, and the kernel's gate and budgets do not see them.

Installed by importing any ringzero LangChain or LangGraph adapter: the few methods every
chat model call and every tool run passes (``BaseChatModel._generate_with_cache`` and its
async twin, ``BaseTool.run`` and ``arun``) first ask whether they run inside a kernel process
and outside a syscall; elsewhere they cost one context-variable read. (A LangChain callback
handler did the same at 80 µs a tool call: with a handler present LangChain builds each run's
callback events.)
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable
from typing import Any

from langchain_core.language_models import BaseChatModel
from langchain_core.tools import BaseTool

from ringzero.core.context import Context
from ringzero.core.support.live import running_live

__all__ = ["JOURNALED", "UnjournaledCallWarning"]

JOURNALED = "_ringzero_journaled"
"""A class attribute of the kernel's own models (``KernelChatModel``): their calls are syscalls."""


class UnjournaledCallWarning(RuntimeWarning):
    """A model or tool ran inside a kernel process without going through the kernel."""


_WARNED: set[str] = set()


def _unseen(kind: str, name: str, text: str) -> None:
    """Warn once per model class or tool name, if called in a kernel process outside a syscall."""
    ctx = Context.current()
    if ctx is None or running_live() or f"{kind} {name}" in _WARNED:
        return
    _WARNED.add(f"{kind} {name}")
    warnings.warn(text.format(name=name, pid=ctx.pid), UnjournaledCallWarning, stacklevel=4)


_MODEL = ("the chat model {name} ran inside kernel process pid {pid} around the kernel: its calls are not "
          "journaled (a resume after a crash makes them again) and the kernel's rate limits and budgets do not see "
          "them. Use ringzero.adapters.langchain.KernelChatModel(provider), or "
          "KernelChatModel(ChatModelProvider(your_model)) to keep your model")
_TOOL = ("the tool {name!r} ran inside kernel process pid {pid} outside the kernel's journal: a resume after a crash "
         "runs it again. Run the graph's tools with ringzero.adapters.langgraph.KernelToolNode(tools) in place of "
         "ToolNode, or call the tool with ctx.tool")


def _model_call(method: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(method)
    def call(self: BaseChatModel, *args: Any, **kwargs: Any) -> Any:
        if not getattr(self, JOURNALED, False):
            _unseen("model", type(self).__name__, _MODEL)
        return method(self, *args, **kwargs)

    return call


def _tool_run(method: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(method)
    def run(self: BaseTool, *args: Any, **kwargs: Any) -> Any:
        _unseen("tool", self.name, _TOOL)
        return method(self, *args, **kwargs)

    return run


def _install() -> None:
    if getattr(BaseTool.run, JOURNALED, False):
        return
    # The async twins return their coroutine from the original: the check runs when called.
    for owner, names, wrap in ((BaseChatModel, ("_generate_with_cache", "_agenerate_with_cache"), _model_call),
                               (BaseTool, ("run", "arun"), _tool_run)):
        for name in names:
            wrapped = wrap(getattr(owner, name))
            setattr(wrapped, JOURNALED, True)
            setattr(owner, name, wrapped)


_install()
