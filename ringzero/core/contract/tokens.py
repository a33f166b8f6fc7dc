"""The one token estimate: four characters a token, plus four a message for its framing.

Used wherever no tokenizer is at hand: pacing the LLM gate's tokens bucket before the
provider reports real usage, a conversation's budget when the provider has no
``count_tokens``, CrewAI's input count. A provider's own tokenizer always wins where it exists.
"""

from __future__ import annotations

from collections.abc import Sequence

from ringzero.core.contract.types import Message

__all__ = ["estimate_message_tokens", "estimate_text_tokens"]

MESSAGE_FRAMING = 4
"""Tokens a chat format spends around each message (role, separators)."""


def estimate_text_tokens(text: str) -> int:
    return (len(text) + 3) // 4


def estimate_message_tokens(messages: Sequence[Message]) -> int:
    """Content and tool calls (name and arguments) at four characters a token, plus framing."""
    characters = sum(len(m.content) + sum(len(c.name) + len(str(c.arguments)) for c in m.tool_calls)
                     for m in messages)
    return (characters + 3) // 4 + MESSAGE_FRAMING * len(messages)
