"""How a framework's model object (CrewAI's ``KernelLLM``, smolagents' ``KernelModel``) asks the
LLM: inside a kernel process it is the process's ``ctx.llm`` (its gate, budget and journal);
elsewhere it goes through the gate of the provider the object was given."""

from __future__ import annotations

from ringzero.core.context import Context
from ringzero.core.contract.errors import NoProvider
from ringzero.core.contract.protocols import LLMProvider
from ringzero.core.contract.types import LLMRequest, LLMResponse
from ringzero.core.support.gate import LLMGate

__all__ = ["ask_in_process", "gate_for", "own_gate"]


def gate_for(provider: LLMProvider | LLMGate | None) -> tuple[LLMGate | None, bool]:
    """The gate a model object asks through outside a process, and whether it made it (a
    provider is wrapped in a gate of its own; a gate given stays the caller's)."""
    if provider is None:
        return None, False
    gate = provider if isinstance(provider, LLMGate) else LLMGate(provider)
    return gate, gate is not provider


def own_gate(gate: LLMGate | None, missing: str) -> LLMGate:
    """``gate``, or ``NoProvider`` saying ``missing`` (how to give one) where there is none."""
    if gate is None:
        raise NoProvider(missing)
    return gate


async def ask_in_process(ctx: Context, request: LLMRequest, provider: str) -> LLMResponse:
    """``request`` as the process's ``ctx.llm`` syscall, to the kernel's provider ``provider``."""
    return await ctx.llm(list(request.messages), model=request.model, max_tokens=request.max_tokens,
                         temperature=request.temperature, stop=request.stop, provider=provider)
