"""Choosing a provider from the environment, the way the examples and the demo do."""

from __future__ import annotations

import os
from typing import overload

from ringzero.core.contract.protocols import LLMProvider
from ringzero.providers.llm.anthropic import AnthropicProvider
from ringzero.providers.llm.openai import OpenAIProvider

__all__ = ["provider_from_environment"]


@overload
def provider_from_environment(fallback: LLMProvider) -> LLMProvider: ...
@overload
def provider_from_environment(fallback: None = None) -> LLMProvider | None: ...


def provider_from_environment(fallback: LLMProvider | None = None) -> LLMProvider | None:
    """A real model when the environment names one, else ``fallback`` (e.g. a ScriptedProvider).

    ``OPENAI_API_KEY`` or ``OPENAI_BASE_URL`` selects ``OpenAIProvider`` (model ``OPENAI_MODEL``,
    default gpt-4o-mini); else ``ANTHROPIC_API_KEY`` selects ``AnthropicProvider`` (model
    ``ANTHROPIC_MODEL``, default claude-sonnet-4-5).
    """
    if os.environ.get("OPENAI_API_KEY") or os.environ.get("OPENAI_BASE_URL"):
        return OpenAIProvider(os.environ.get("OPENAI_MODEL") or "gpt-4o-mini")
    if os.environ.get("ANTHROPIC_API_KEY"):
        return AnthropicProvider(os.environ.get("ANTHROPIC_MODEL") or "claude-sonnet-4-5")
    return fallback
