"""LLM providers: OpenAI-compatible servers, Anthropic, and the scripted provider for offline runs.

Each speaks its vendor's wire format over httpx (a core dependency: no SDK to install) and
maps the vendor's failures onto the kernel's typed errors.
"""

from ringzero.providers.llm.anthropic import AnthropicProvider
from ringzero.providers.llm.environment import provider_from_environment
from ringzero.providers.llm.openai import OpenAIProvider
from ringzero.testing import ScriptedProvider

__all__ = ["AnthropicProvider", "OpenAIProvider", "ScriptedProvider", "provider_from_environment"]
