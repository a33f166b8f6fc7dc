"""A warning, once per model or tool, for LangChain calls that a kernel process makes around
the kernel: a chat model that is not ``KernelChatModel``, a tool run outside any syscall (a
plain ``ToolNode``). Their calls are not journaled, so a resumed process makes them again, and
the kernel's gate and budgets do not see them. Installed by importing any ringzero LangChain
or LangGraph adapter: a LangChain callback (a configure hook) that is present only inside a
kernel process, and costs nothing elsewhere."""

from __future__ import annotations

import warnings
from typing import Any

from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.tracers.context import register_configure_hook

from ringzero.core.context import Context
from ringzero.core.process import running_live

__all__ = ["UnjournaledCallWarning"]


class UnjournaledCallWarning(RuntimeWarning):
    """A model or tool ran inside a kernel process without going through the kernel."""


class _Warner(BaseCallbackHandler):
    run_inline = True
    raise_error = False
    # Only model and tool starts matter: the rest is not dispatched to it at all. (LangChain sends
    # a tool's events unless ``ignore_agent``: that one stays False.)
    ignore_chain = ignore_retriever = ignore_retry = ignore_custom_event = True

    def __init__(self) -> None:
        self.warned: set[str] = set()

    def on_chat_model_start(self, serialized: dict[str, Any] | None, messages: Any, **kwargs: Any) -> None:
        self._model(serialized, kwargs)

    def on_llm_start(self, serialized: dict[str, Any] | None, prompts: Any, **kwargs: Any) -> None:
        self._model(serialized, kwargs)

    def on_tool_start(self, serialized: dict[str, Any] | None, input_str: str, **kwargs: Any) -> None:
        if running_live():  # inside a journaled syscall (KernelToolNode, ctx.tool): seen
            return
        name = str((serialized or {}).get("name") or kwargs.get("name") or "a tool")
        self._warn(f"tool {name}", f"the tool {name!r} ran inside kernel process pid {_pid()} outside the kernel's "
                   "journal: a resume after a crash runs it again. Run the graph's tools with "
                   "ringzero.adapters.langgraph.KernelToolNode(tools) in place of ToolNode")

    def _model(self, serialized: dict[str, Any] | None, kwargs: dict[str, Any]) -> None:
        ids = (serialized or {}).get("id") or []
        name = str(ids[-1] if ids else kwargs.get("name") or "a chat model")
        if name == "KernelChatModel" or running_live():
            return
        self._warn(f"model {name}", f"the chat model {name} ran inside kernel process pid {_pid()} around the kernel: "
                   "its calls are not journaled (a resume after a crash makes them again) and the kernel's rate "
                   "limits and budgets do not see them. Use ringzero.adapters.langchain.KernelChatModel(provider), "
                   "or KernelChatModel(ChatModelProvider(your_model)) to keep your model")

    def _warn(self, key: str, text: str) -> None:
        if key not in self.warned:
            self.warned.add(key)
            warnings.warn(text, UnjournaledCallWarning, stacklevel=2)


def _pid() -> int | None:
    ctx = Context.current()
    return None if ctx is None else ctx.pid


class _InKernelProcess:
    """What LangChain asks at every run for the handler to add: the warner inside a kernel
    process, nothing elsewhere (it reads ``.get()`` as it reads a ContextVar)."""

    warner = _Warner()

    def get(self) -> _Warner | None:
        return self.warner if Context.current() is not None else None


register_configure_hook(_InKernelProcess(), True)  # type: ignore[arg-type]
