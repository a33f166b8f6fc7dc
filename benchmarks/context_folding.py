"""Tokens sent per turn over a long conversation, with folding and without.

A 200-turn chat (a tool call every third turn) replayed by a scripted model, run twice through
``ctx.conversation``: once with a 2,000-token budget (the oldest part folds into episode notes),
once with no effective budget (every message is sent again each turn, as a plain loop does).
Tokens are counted with OpenAI's o200k_base tokenizer (bpe-openai, offline), which is also the
scripted model's tokenizer that the budget is kept by; the summarizing calls that folding itself
costs are included.

    .venv/bin/python benchmarks/context_folding.py [--turns 200] [--budget 2000]   # uv sync --extra bench
"""

from __future__ import annotations

import argparse
import asyncio
import re
import statistics
from typing import Any

import bpe_openai
from rich.console import Console
from rich.table import Table

from ringzero import Context, Kernel
from ringzero.checkpointers import MemoryCheckpointer
from ringzero.core.context import SUMMARIZE
from ringzero.core.contract.types import LLMRequest, Message
from ringzero.testing import ScriptedProvider

ENCODING = bpe_openai.get_encoding("o200k_base")
LOOKUP = {"name": "lookup", "description": "Look up a record by number",
          "parameters": {"type": "object", "properties": {"n": {"type": "integer"}}}}


def model(request: LLMRequest) -> Any:
    if request.messages[0].content == SUMMARIZE:
        turns = re.findall(r"turn (\d+)", request.messages[-1].content)
        facts = re.findall(r"fact: ([^.]*)\.", request.messages[-1].content)
        return f"Turns {turns[0]}-{turns[-1]}: routine questions, answered." + "".join(f" Fact: {f}." for f in facts)
    last = request.messages[-1]
    if last.role == "tool":
        return f"The lookup says: {last.content}."
    turn = int(re.findall(r"turn (\d+)", last.content)[0])
    if turn % 3 == 0:
        return {"content": "", "tool_calls": [{"id": f"call-{turn}", "name": "lookup", "arguments": {"n": turn}}]}
    return f"Answer to turn {turn}: that is handled, nothing else to add right now."


def lookup(n: int) -> str:
    return f"record {n}: status green, owner team-{n % 5}, updated this week"


async def chat(ctx: Context, turns: int, budget: int) -> int:
    conversation = ctx.conversation("You are a careful support assistant. Answer briefly.", budget=budget)
    for turn in range(turns):
        fact = f"fact: ticket {turn} belongs to Dana. " if turn % 25 == 0 else ""
        reply = await conversation.ask(f"turn {turn}: {fact}Can you check on the request I made earlier today, "
                                       "and tell me whether anything else is needed from my side?", tools=[LOOKUP])
        for call in reply.tool_calls:
            conversation.add(Message("tool", str(await ctx.tool(lookup, **call.arguments)), tool_call_id=call.id))
        if reply.tool_calls:
            await conversation.ask()
    return len(conversation.notes)


def tokens(request: LLMRequest) -> int:
    return count(request.messages)


def count(messages: Any) -> int:
    return sum(len(ENCODING.encode(m.content)) + 4 for m in messages)


class O200kScriptedProvider(ScriptedProvider):
    """The scripted model, with o200k_base as its tokenizer (what the conversation budgets by)."""

    def count_tokens(self, messages: Any) -> int:
        return count(messages)


async def run(turns: int, budget: int) -> dict[str, float]:
    provider = O200kScriptedProvider(model)
    async with Kernel(checkpointer=MemoryCheckpointer(), llm=provider) as kernel:
        notes = await (await kernel.spawn(chat, turns, budget)).wait()
    chat_calls = [tokens(r) for r in provider.requests if r.messages[0].content != SUMMARIZE]
    folds = [tokens(r) for r in provider.requests if r.messages[0].content == SUMMARIZE]
    return {"calls": len(chat_calls), "mean": statistics.mean(chat_calls), "last": chat_calls[-1],
            "max": max(chat_calls), "folds": float(notes), "fold_tokens": float(sum(folds)),
            "total": float(sum(chat_calls) + sum(folds))}


async def main(turns: int, budget: int) -> None:
    unbounded = 10**9
    rows = {"without folding (every message, every turn)": await run(turns, unbounded),
            f"with folding, {budget:,}-token budget": await run(turns, budget)}
    table = Table(title=f"Tokens sent to the model over a {turns}-turn conversation (o200k_base)")
    for column in ("conversation", "model calls", "mean per call", "last call", "largest call", "folds",
                   "tokens in folds", "total sent"):
        table.add_column(column, justify="left" if column == "conversation" else "right")
    for name, r in rows.items():
        table.add_row(name, f"{r['calls']:.0f}", f"{r['mean']:,.0f}", f"{r['last']:,.0f}", f"{r['max']:,.0f}",
                      f"{r['folds']:.0f}", f"{r['fold_tokens']:,.0f}", f"{r['total']:,.0f}")
    Console(width=140).print(table)
    plain, folded = rows.values()
    print(f"total tokens sent: {100 * (1 - folded['total'] / plain['total']):.1f}% fewer with folding")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--turns", type=int, default=200)
    parser.add_argument("--budget", type=int, default=2000)
    args = parser.parse_args()
    asyncio.run(main(args.turns, args.budget))
