"""The context window as RAM: a conversation that folds its oldest part instead of overflowing.

``ctx.conversation(system, budget=...)`` keeps the messages a process sends to the model. When
they pass ``budget`` tokens (counted by the provider's tokenizer where it has one, else
estimated, and ``tokens()`` says which), the oldest part is folded: a ``context_fold_warning``
event goes out and ``before_fold`` (if given) sees the messages about to go, one summarizing
LLM call (through the gate, charged to the process) turns them into an episode note, the note
is remembered in long-term memory (so it stays searchable), and the conversation becomes
``system``, a recap of the latest notes, then the recent tail verbatim. The recap sits after
the system prompt, never in it, so the stable prefix stays cacheable. A fold never separates a
tool call from its results. Every step is a syscall or a pure function of syscall results, so
a resumed process folds exactly as it did before its crash.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from ringzero.core.contract.errors import InvalidArgument
from ringzero.core.contract.types import JSON, LLMResponse, Message, ToolSchema

if TYPE_CHECKING:
    from ringzero.core._engine.process_memory import ProcessMemory

__all__ = ["Conversation", "Owner"]

SUMMARIZE = """You keep the memory of a long conversation. Write an episode note of the part below:
every fact, decision, number, name and open question in it, as short plain sentences. The
note replaces that part of the conversation, so leave nothing out that may matter later."""

BeforeFold = Callable[[list[Message]], Awaitable[None] | None]


class Owner(Protocol):
    """What a conversation asks of the Context it belongs to (``Context`` is the one there is):
    its calls are that process's syscalls."""

    @property
    def memory(self) -> ProcessMemory:
        """Where episode notes are remembered."""

    def count_tokens(self, messages: Sequence[Message], provider: str = "default") -> tuple[int, bool]:
        """``(tokens, estimated)`` of ``messages``."""

    def emit(self, kind: str, data: Mapping[str, JSON]) -> None:
        """An event to the kernel's subscribers."""

    def llm(self, messages: Sequence[Message], *, tools: Sequence[ToolSchema | Mapping[str, Any]] = (),
            max_tokens: int | None = None, provider: str = "default") -> Awaitable[LLMResponse]:
        """Ask the model (a journaled syscall)."""


class Conversation:
    """Messages for the model that stay under a token budget by folding (see the module doc)."""

    def __init__(self, ctx: Owner, system: str = "", *, budget: int = 8000, keep_recent: int | None = None,
                 note_tokens: int = 500, recap_notes: int = 3, provider: str = "default", name: str = "conversation",
                 before_fold: BeforeFold | None = None) -> None:
        if budget < 100:
            raise InvalidArgument(f"a conversation's budget must be at least 100 tokens, not {budget}")
        keep = budget // 2 if keep_recent is None else keep_recent
        if not 0 < keep < budget:
            raise InvalidArgument(f"keep_recent must be between 0 and the budget ({budget}), not {keep}")
        self.ctx, self.system, self.budget, self.keep_recent = ctx, system, budget, keep
        self.note_tokens, self.recap_notes, self.provider, self.name = note_tokens, recap_notes, provider, name
        self.before_fold = before_fold
        self.notes: list[str] = []
        self._live: list[Message] = []
        self._recap = recap_notes  # fewer while a fit cannot make room otherwise

    # ------------------------------------------------------------------ what the model sees
    @property
    def messages(self) -> list[Message]:
        """System prompt, recap of the latest episode notes (once there are any), recent messages."""
        head = [Message("system", self.system)] if self.system else []
        if self.notes:
            latest = self.notes[-self._recap:]
            recap = "Recap of the earlier conversation, oldest first:\n" + "\n".join(f"- {n}" for n in latest)
            head.append(Message("user", recap))
        return head + self._live

    def tokens(self) -> tuple[int, bool]:
        """``(tokens, estimated)`` of ``messages``."""
        return self.ctx.count_tokens(self.messages, self.provider)

    # ------------------------------------------------------------------ use
    def add(self, *messages: Message | dict[str, Any]) -> None:
        """Append messages (a tool result must answer a call already in the conversation)."""
        for message in messages:
            self._live.append(Message.coerce(message))

    async def ask(self, content: str | None = None, *, tools: Sequence[ToolSchema | dict[str, Any]] = (),
                  max_tokens: int | None = None) -> LLMResponse:
        """Add ``content`` as the user's message (if given), fold if over budget, ask the model,
        and keep its reply."""
        if content is not None:
            self._live.append(Message("user", content))
        await self.fit()
        reply = await self.ctx.llm(self.messages, tools=tools, max_tokens=max_tokens, provider=self.provider)
        self._live.append(reply.message)
        return reply

    async def fit(self) -> None:
        """Make the conversation fit its budget: fold the oldest part (keeping ``keep_recent``
        tokens of the newest messages); if that is not enough, fold all but the newest message;
        then recap fewer notes. What still does not fit (a system prompt and last message over
        the budget by themselves) goes out with a ``context_over_budget`` event, never silently."""
        self._recap = self.recap_notes
        while (size := self.tokens())[0] > self.budget:
            if await self.fold() or await self.fold(keep_recent=0):
                continue
            if self._recap > 1 and len(self.notes) > 1:
                self._recap -= 1
                continue
            self.ctx.emit("context_over_budget", {"conversation": self.name, "tokens": size[0],
                                                  "estimated": size[1], "budget": self.budget})
            return

    async def fold(self, keep_recent: int | None = None) -> bool:
        """Fold the oldest part into an episode note, keeping ``keep_recent`` tokens of the newest
        messages (default: the conversation's; 0: all but the newest message and the results it
        needs). False if there is nothing to fold."""
        cut = self._cut(self.keep_recent if keep_recent is None else keep_recent)
        if cut == 0:
            return False
        folded, self._live = self._live[:cut], self._live[cut:]
        count, estimated = self.ctx.count_tokens(folded, self.provider)
        self.ctx.emit("context_fold_warning", {
            "conversation": self.name, "messages": len(folded), "tokens": count, "estimated": estimated,
            "budget": self.budget})
        if self.before_fold is not None:
            outcome = self.before_fold(list(folded))
            if inspect.isawaitable(outcome):
                await outcome
        transcript = "\n".join(_line(m) for m in folded)
        if self.notes:
            transcript = f"(Earlier notes: {' '.join(self.notes[-self.recap_notes:])})\n" + transcript
        summary = await self.ctx.llm([Message("system", SUMMARIZE), Message("user", transcript)],
                                     max_tokens=self.note_tokens, provider=self.provider)
        note = summary.content.strip()
        self.notes.append(note)
        await self.ctx.memory.remember(f"{self.name}/episode-{len(self.notes):04d}", note)
        return True

    def _cut(self, keep_recent: int) -> int:
        """Where the recent tail starts: it keeps up to ``keep_recent`` tokens of the newest
        messages, and never starts on a tool result (its call stays with it)."""
        kept, cut = 0, len(self._live)
        while cut > 0:
            size = self.ctx.count_tokens([self._live[cut - 1]], self.provider)[0]
            if kept + size > keep_recent:
                break
            kept += size
            cut -= 1
        while 0 < cut < len(self._live) and self._live[cut].role == "tool":
            cut -= 1  # the results move to the tail with the call that asked for them
        if cut == len(self._live):  # the newest message alone is over keep_recent: fold all before it
            cut = len(self._live) - 1
            while cut > 0 and self._live[cut].role == "tool":
                cut -= 1
        return cut


def _line(message: Message) -> str:
    calls = "".join(f" [calls {c.name}({c.arguments})]" for c in message.tool_calls)
    return f"{message.role}: {message.content}{calls}"
