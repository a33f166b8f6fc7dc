"""Memory tiers: a conversation that folds instead of overflowing, and long-term memory."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import Any

import pytest

from ringzero import Kernel
from ringzero.checkpointers import MemoryCheckpointer, SqliteCheckpointer
from ringzero.core.context import SUMMARIZE
from ringzero.core.contract.errors import InvalidArgument
from ringzero.core.contract.types import LLMRequest
from ringzero.core.support.memory import MemoryStore
from ringzero.providers.llm import AnthropicProvider, OpenAIProvider
from ringzero.testing import ScriptedProvider, count_tokens
from tests.programs import long_chat, recall_from, remember_in

BUDGET = 600
ORDER: list[str] = []


def chat_model(request: LLMRequest) -> Any:
    """Summarizes (keeping every stated fact) when asked to; otherwise chats, calling the lookup
    tool on every third turn."""
    if request.messages[0].content == SUMMARIZE:
        ORDER.append("summary")
        transcript = request.messages[-1].content
        facts = re.findall(r"fact: ([^.]*)\.", transcript)
        turns = re.findall(r"turn (\d+)", transcript)
        return f"Turns {turns[0]}-{turns[-1]} were chat." + "".join(f" Fact: {f}." for f in facts)
    last = request.messages[-1]
    if last.role == "tool":
        return f"Noted: {last.content}"
    turn = int(re.findall(r"turn (\d+)", last.content)[0])
    if turn % 3 == 0:
        return {"content": "", "tool_calls": [{"id": f"call-{turn}", "name": "lookup", "arguments": {"n": turn}}]}
    return f"ok, turn {turn}"


def chat_requests(provider: ScriptedProvider) -> list[LLMRequest]:
    return [r for r in provider.requests if r.messages[0].content != SUMMARIZE]


async def test_a_200_turn_conversation_stays_under_budget_with_tool_pairs_intact_and_a_recap() -> None:
    provider = ScriptedProvider(chat_model)
    ORDER.clear()
    async with Kernel(checkpointer=MemoryCheckpointer(), llm=provider) as kernel:
        kernel.subscribe(lambda e: ORDER.append("warning") if e.kind == "context_fold_warning" else None)
        result = await (await kernel.spawn(long_chat, 200, BUDGET, name="chatter")).wait()
    requests = chat_requests(provider)
    sizes = [sum(count_tokens(m.content) for m in r.messages) for r in requests]
    assert max(sizes) <= BUDGET, "a request went over the budget"
    told = sum(count_tokens(f"turn {i}: " + "some filler words here " * 8) for i in range(200))
    assert told > 10 * BUDGET  # what was said would not have fit ten times over
    for request in requests:  # every tool result follows its call, every call has its result
        open_calls: set[str] = set()
        for message in request.messages:
            if message.role == "tool":
                assert message.tool_call_id in open_calls, "a tool result lost its call"
                open_calls.discard(message.tool_call_id)
            elif open_calls:
                pytest.fail("a tool call lost its result")
            open_calls |= {c.id for c in message.tool_calls}
    folded = [r for r in requests if r.messages[1].content.startswith("Recap of the earlier conversation")]
    assert folded and requests[-1] in folded and requests[-1].messages[0].role == "system"
    assert len(result["notes"]) >= 10
    assert ORDER[:2] == ["warning", "summary"] and ORDER.count("warning") == ORDER.count("summary")
    assert all(pair == ("warning", "summary") for pair in zip(ORDER[::2], ORDER[1::2], strict=True))
    # the fact told at turn 20 was folded away long ago, and long-term memory still finds it
    assert any("the vault code is 4471" in note for note in result["found"])


async def test_a_resumed_conversation_folds_exactly_as_before_without_repeating_calls(tmp_path: Path) -> None:
    clean = ScriptedProvider(chat_model)
    async with Kernel(checkpointer=MemoryCheckpointer(), llm=clean) as kernel:
        expected = await (await kernel.spawn(long_chat, 60, BUDGET, name="chatter")).wait()

    async def dies_later(request: LLMRequest) -> Any:
        if len(first.requests) >= 70:
            await asyncio.sleep(60)  # the host goes down here, after several folds
        return chat_model(request)

    first = ScriptedProvider(dies_later)
    db = tmp_path / "k.db"
    host = Kernel(checkpointer=SqliteCheckpointer(db), llm=first)
    await host.spawn(long_chat, 60, BUDGET, name="chatter")
    while first.calls < 70:
        await asyncio.sleep(0.01)
    await host.aclose()
    second = ScriptedProvider(chat_model)
    async with Kernel(checkpointer=SqliteCheckpointer(db), llm=second) as kernel:
        [handle] = await kernel.recover()
        resumed = await asyncio.wait_for(handle.wait(), 30)
    assert resumed == expected
    assert second.calls == clean.calls - 69, "a recorded model call was made again"


async def test_two_processes_share_a_namespace_and_each_has_its_own() -> None:
    async with Kernel(checkpointer=MemoryCheckpointer()) as kernel:
        await (await kernel.spawn(remember_in, "team", "deadline", "ship on Friday", name="planner")).wait()
        await (await kernel.spawn(remember_in, "team", "colour", "the logo is teal", name="designer")).wait()
        seen = await (await kernel.spawn(recall_from, "team", "when do we ship", name="writer")).wait()
    assert seen == {"search": ["deadline"], "own": [], "recall": "ship on Friday"}


async def test_memory_store_remember_recall_search_forget_and_its_errors(tmp_path: Path) -> None:
    store = MemoryStore(SqliteCheckpointer(tmp_path / "m.db"))
    first = await store.put("agent", "favourite", {"food": "ramen", "drink": "tea"})
    again = await store.put("agent", "favourite", {"food": "udon", "drink": "tea"})
    assert again.created_at == first.created_at and again.updated_at >= first.updated_at
    await store.put("agent", "pet", "a cat called Miso")
    assert (await store.get("agent", "favourite")).value == {"food": "udon", "drink": "tea"}  # type: ignore[union-attr]
    assert [m.key for m in await store.search("agent", "what food do I like")] == ["favourite"]
    assert await store.namespaces() == ["agent"]
    assert await store.delete("agent", "pet") is True and await store.delete("agent", "pet") is False
    assert await store.get("agent", "pet") is None and [m.key for m in await store.items("agent")] == ["favourite"]
    with pytest.raises(InvalidArgument, match="must be JSON-compatible"):
        await store.put("agent", "bad", {1, 2})  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match="non-empty string"):
        await store.put("", "k", 1)
    assert (await store.get("agent", "favourite")) is not None  # nothing was lost
    await store.checkpointer.aclose()


async def test_memory_search_can_rank_by_embeddings() -> None:
    def embed(texts: Any) -> list[list[float]]:
        topics = ("food", "pet", "travel")
        return [[float(topic in text.lower()) for topic in topics] for text in texts]

    store = MemoryStore(MemoryCheckpointer(), embed=embed)
    await store.put("a", "k1", "travel plans for May")
    await store.put("a", "k2", "pet food brands")
    assert [m.key for m in await store.search("a", "travel", 1)] == ["k1"]


async def count_both(ctx: Any) -> list[Any]:
    conversation = ctx.conversation("system", budget=200)
    conversation.add({"role": "user", "content": "hello world"})
    return list(conversation.tokens())


@pytest.mark.parametrize(("provider", "expected"), [
    (ScriptedProvider(["x"]), [3, False]),  # the scripted model's own tokenizer: "system", "hello", "world"
    (OpenAIProvider("gpt-4o", base_url="http://127.0.0.1:9/v1"), [1 + 4 + 2 + 4, False]),  # o200k_base, framed
    (AnthropicProvider("claude-test", api_key="k", base_url="http://127.0.0.1:9"), [(17 + 3) // 4 + 8, True]),
])
async def test_token_counts_come_from_the_providers_tokenizer_or_are_marked_estimated(
        provider: Any, expected: list[Any]) -> None:
    async with Kernel(checkpointer=MemoryCheckpointer(), llm=provider) as kernel:
        assert await (await kernel.spawn(count_both)).wait() == expected


async def keeps_what_folds(ctx: Any) -> list[str]:
    saved: list[str] = []
    conversation = ctx.conversation("", budget=100, keep_recent=30, before_fold=lambda ms: saved.extend(
        m.content for m in ms))
    for turn in range(12):
        await conversation.ask(f"turn {turn}: " + "word " * 10)
    return saved


async def test_before_fold_sees_the_messages_about_to_be_folded() -> None:
    async with Kernel(checkpointer=MemoryCheckpointer(), llm=ScriptedProvider(chat_model)) as kernel:
        saved = await (await kernel.spawn(keeps_what_folds)).wait()
    assert saved[0].startswith("turn 0: ") and any(s.startswith("ok, turn") for s in saved)


async def over_budget(ctx: Any) -> str:
    conversation = ctx.conversation("rules " * 150, budget=100)  # the system prompt alone is over budget
    return (await conversation.ask("hello")).content


async def test_what_cannot_fit_is_sent_with_an_event_never_silently() -> None:
    events: list[Any] = []
    async with Kernel(checkpointer=MemoryCheckpointer(), llm=ScriptedProvider(["hi"])) as kernel:
        kernel.subscribe(lambda e: events.append(e) if e.kind == "context_over_budget" else None)
        assert await (await kernel.spawn(over_budget)).wait() == "hi"
    [event] = events
    assert event.data["tokens"] > event.data["budget"] == 100 and event.data["estimated"] is False


class RecordsOnly:
    """Someone else's Checkpointer: the protocol and nothing more (no ``memory_index``)."""

    def __init__(self) -> None:
        self._inner = MemoryCheckpointer()
        self.capabilities = self._inner.capabilities

    def __getattr__(self, name: str) -> Any:
        if name == "memory_index":
            raise AttributeError(name)
        return getattr(self._inner, name)


async def test_memory_on_a_store_without_an_index_of_its_own_is_kept_as_records() -> None:
    store = MemoryStore(RecordsOnly())  # type: ignore[arg-type]
    await store.put("agent", "favourite", {"food": "ramen"})
    await store.put("agent", "favourite", {"food": "udon"})
    await store.put("agent.team", "pet", "a cat called Miso")
    assert [m.value for m in await store.search("agent", "food")] == [{"food": "udon"}]
    assert await store.namespaces() == ["agent", "agent.team"]
    assert [m.key for m in await store.items("agent", prefix=True)] == ["pet", "favourite"]
    assert await store.delete("agent.team", "pet") and await store.namespaces() == ["agent"]
    assert all(t.startswith("ringzero-memory:") for t in [r.thread_id async for r in store.checkpointer.list()])
