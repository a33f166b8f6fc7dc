"""LLM providers: OpenAI-compatible servers and Anthropic. (The scripted test double, for
offline runs and tests, is ``ringzero.testing.ScriptedProvider``.)

Each speaks its vendor's wire format over httpx (a core dependency: no SDK to install) and
maps the vendor's failures onto the kernel's typed errors.
"""

from ringzero.providers.llm._http import error_of_exception
from ringzero.providers.llm.anthropic import AnthropicProvider
from ringzero.providers.llm.environment import provider_from_environment
from ringzero.providers.llm.openai import OpenAIProvider

__all__ = ["AnthropicProvider", "OpenAIProvider", "error_of_exception", "provider_from_environment"]
