"""A CrewAI LLM backed by a ringzero provider through an LLM gate (``KernelLLM``)."""

from __future__ import annotations

from typing import Any

from ringzero.adapters._asking import ask_in_process, gate_for, own_gate
from ringzero.core.context import Context
from ringzero.core.contract.errors import MissingExtra
from ringzero.core.contract.protocols import LLMProvider
from ringzero.core.contract.tokens import estimate_text_tokens
from ringzero.core.contract.types import LLMRequest, LLMResponse, Message
from ringzero.core.routing import route, route_sync
from ringzero.core.support.gate import LLMGate

try:
    from crewai.llms.base_llm import BaseLLM
    from pydantic import PrivateAttr
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise MissingExtra("ringzero.adapters.crewai", "crewai") from exc

__all__ = ["KernelLLM"]


class KernelLLM(BaseLLM):
    """A CrewAI LLM backed by a ringzero LLMProvider through an LLM gate.

    Inside a kernel process each call is ``ctx.llm`` (the process's gate, budget and journal;
    ``kernel_provider`` names which of the kernel's providers); elsewhere it goes through the
    gate given (a provider is wrapped in a gate of its own). Agents use CrewAI's text ReAct
    format, so any provider works, tool-calling or not.
    """

    llm_type: str = "ringzero"
    provider: str = "ringzero"
    kernel_provider: str = "default"
    priority: int = 10
    context_window: int = 128_000
    _gate: LLMGate | None = PrivateAttr(default=None)
    _owns_gate: bool = PrivateAttr(default=False)

    def __init__(self, provider: LLMProvider | LLMGate | None = None, **data: Any) -> None:
        inner = provider.provider if isinstance(provider, LLMGate) else provider
        data.setdefault("model", getattr(inner, "model", None) or "ringzero")
        super().__init__(**data)
        self._gate, self._owns_gate = gate_for(provider)

    def close(self) -> None:
        """Close the gate this LLM made for its provider (a gate given is the caller's)."""
        if self._owns_gate and self._gate is not None:
            self._gate.close()

    async def aclose(self) -> None:
        if self._owns_gate and self._gate is not None:
            await self._gate.aclose()

    def call(self, messages: Any, tools: Any = None, callbacks: Any = None, available_functions: Any = None,
             from_task: Any = None, from_agent: Any = None, response_model: Any = None) -> str:
        request = self._request(messages)
        response = route_sync(lambda ctx: self._ask_in_process(ctx, request), lambda: self._ask_gate(request),
                              lambda: self._own_gate().home, "KernelLLM.call")
        return self._answer(response)

    async def acall(self, messages: Any, tools: Any = None, callbacks: Any = None, available_functions: Any = None,
                    from_task: Any = None, from_agent: Any = None, response_model: Any = None) -> str:
        request = self._request(messages)
        # Outside a process the gate runs it on its own loop.
        response = await route(lambda ctx: self._ask_in_process(ctx, request), lambda: self._ask_gate(request))
        return self._answer(response)

    def get_context_window_size(self) -> int:
        return self.context_window

    def get_input_tokens_count(self, messages: Any, tools: Any = None, response_model: Any = None) -> int:
        """An estimate (four characters a token), as CrewAI's own fallback makes, without its
        warning on every call: the provider's real count arrives with each answer's usage."""
        text = messages if isinstance(messages, str) else "".join(_text(m.get("content")) for m in messages)
        return estimate_text_tokens(text)

    def _request(self, messages: Any) -> LLMRequest:
        if isinstance(messages, str):
            messages = [{"role": "user", "content": messages}]
        converted = []
        for message in messages:
            role = {"developer": "system"}.get(message.get("role"), message.get("role"))
            converted.append(Message(role if role in ("system", "user", "assistant") else "user",
                                     _text(message.get("content"))))
        return LLMRequest(messages=tuple(converted), model=self.model if self.model != "ringzero" else None,
                          max_tokens=int(self.max_tokens) if self.max_tokens else None,
                          temperature=self.temperature, stop=tuple(self.stop_sequences))

    async def _ask_in_process(self, ctx: Context, request: LLMRequest) -> LLMResponse:
        return await ask_in_process(ctx, request, self.kernel_provider)

    def _own_gate(self) -> LLMGate:
        return own_gate(self._gate, "KernelLLM has no provider and is not running inside a kernel process: "
                                    "pass KernelLLM(provider) or run the crew with kickoff() in a kernel process")

    async def _ask_gate(self, request: LLMRequest) -> LLMResponse:
        return await self._own_gate().complete(request, priority=self.priority)

    def _answer(self, response: LLMResponse) -> str:
        usage = response.usage
        self._track_token_usage_internal({"prompt_tokens": usage.input_tokens,
                                          "completion_tokens": usage.output_tokens,
                                          "total_tokens": usage.total_tokens})
        return self._apply_stop_words(response.content)


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(part.get("text", "") if isinstance(part, dict) else str(part) for part in content)
    return "" if content is None else str(content)
