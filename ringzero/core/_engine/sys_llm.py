"""The LLM syscalls (``ctx.llm``, ``ctx.nested_llm``): a call through the provider's gate, charged
to the process's budget and journaled, so a resumed program gets the recorded answer."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ringzero.core._engine.syscall import syscall
from ringzero.core.contract import errors
from ringzero.core.contract.errors import NonDeterminismError, NoProvider, ProviderError
from ringzero.core.contract.fingerprints import llm_fingerprint, trimmed
from ringzero.core.contract.outcomes import Failure, Outcome, Value, exception_of, failure, number
from ringzero.core.contract.protocols import TextSink
from ringzero.core.contract.types import LLMRequest, LLMResponse, Message, ToolSchema, coerce_messages
from ringzero.core.support.live import NESTED_COST

if TYPE_CHECKING:
    from ringzero.core._engine.process import Process
    from ringzero.core.support.gate import LLMGate

__all__ = ["gate_of", "llm", "nested_llm"]

_LLM_NEEDS = (("llm_calls", 1.0), ("tokens", 1.0), ("cost", 1e-12))


async def llm(
    process: Process,
    messages: Sequence[Message | Mapping[str, Any]] | str,
    *,
    tools: Sequence[ToolSchema | Mapping[str, Any]] = (),
    model: str | None = None,
    max_tokens: int | None = None,
    temperature: float | None = None,
    stop: Sequence[str] = (),
    provider: str = "default",
    on_text: TextSink | None = None,
) -> LLMResponse:
    """``Context.llm`` (see there), for ``process``."""
    request = LLMRequest(
        messages=coerce_messages(messages),
        tools=tuple(t if isinstance(t, ToolSchema) else ToolSchema(**t) for t in tools) if tools else (),
        model=model,
        max_tokens=max_tokens,
        temperature=temperature,
        stop=tuple(stop) if stop else (),
    )
    fresh: list[tuple[LLMResponse, Outcome]] = []  # to skip decoding what we just encoded

    async def live() -> Outcome:
        gate = gate_of(process, provider)  # only a live call needs the provider: a replay does not
        try:
            response = await gate.complete(request, pid=process.pid, priority=process.record.priority,
                                           on_text=on_text, program=process.program_root)
        except ProviderError as exc:
            return failure(exc, retry_after=getattr(exc, "retry_after", None))
        recorded = Value(response.to_dict())
        fresh.append((response, recorded))
        return recorded

    last = request.messages[-1] if request.messages else None
    summary = f"{len(request.messages)} messages to {provider}" if last is None else \
        f"{len(request.messages)} messages to {provider}, last {last.role} {trimmed(last.content, 50)}"
    telemetry = process.runtime.telemetry
    about = None if not telemetry.enabled else (
        lambda: telemetry.llm_about(process.runtime.gates.get(provider), provider, request))
    outcome = await syscall(process, "llm", None, summary, live, needs=_LLM_NEEDS,
                            fp=llm_fingerprint(provider, request), about=about)
    if isinstance(outcome, Failure):
        raise _provider_error(outcome)
    # Decoded when replayed, or when (a cluster's takeover) the slot holds another node's answer.
    live_answer = fresh[0][0] if fresh and fresh[0][1] is outcome else None
    if live_answer is not None:
        response = live_answer
    elif isinstance(outcome, Value) and isinstance(outcome.value, dict):
        response = LLMResponse.from_dict(outcome.value)
    else:
        raise NonDeterminismError(f"pid {process.pid}: the model call recorded here holds no answer: {outcome!r:.200}")
    usage = response.usage
    process.meter.charge_llm(usage.input_tokens + usage.output_tokens, usage.cost or 0.0)
    process.check_budget()
    return response


async def nested_llm(process: Process, messages: Sequence[Message | Mapping[str, Any]] | str, *,
                     provider: str = "default", max_tokens: int | None = None) -> LLMResponse:
    """``Context.nested_llm`` (see there), for ``process``."""
    request = LLMRequest(messages=coerce_messages(messages), max_tokens=max_tokens)
    response = await gate_of(process, provider).complete(request, pid=process.pid, priority=process.record.priority,
                                                         program=process.program_root)
    charge = {"tokens": float(response.usage.total_tokens), "llm_calls": 1.0, "cost": response.usage.cost or 0.0}
    process.meter.charge(**charge)
    nested = NESTED_COST.get()
    if nested is not None:  # the enclosing exec's record carries it, for a resumed program's budget
        for resource, amount in charge.items():
            nested[resource] = nested.get(resource, 0.0) + amount
    return response


def gate_of(process: Process, provider: str) -> LLMGate:
    """The kernel's gate for ``provider``; where it has none, see ``Process.needs``."""
    try:
        return process.runtime.gate(provider)
    except NoProvider as exc:
        process.needs(exc)


def _provider_error(failed: Failure) -> ProviderError:
    """The provider's error a recorded failure stands for (``ringzero.core.contract.outcomes``)."""
    if failed.type == "RateLimited":
        retry_after = failed.details.get("retry_after")
        return errors.RateLimited(failed.message, None if retry_after is None else number(retry_after))
    exc = exception_of(failed)
    return exc if isinstance(exc, ProviderError) else ProviderError(failed.message)
