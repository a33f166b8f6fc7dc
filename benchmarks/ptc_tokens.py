"""Tokens sent to the model: JSON tool calling against programmatic tool calling, same task.

The task: summarize a 10,000-row sales CSV by region (total and mean amount). Both agents use
the same tool, ``read_csv(path)``, and a scripted model replaying a fixed script:

- the JSON tool-calling agent asks for ``read_csv``; the tool's result (every row, as JSON)
  goes back into the model's context, and the model answers from it;
- ``CodeAgent`` writes Python that calls ``read_csv`` inside the sandbox and prints only the
  summary; the model answers from that.

Every token sent to the model (system prompt, messages, tool schemas) is counted with a real
tokenizer: OpenAI's o200k_base, through bpe-openai (bundled tables, no network).

    .venv/bin/python benchmarks/ptc_tokens.py [--rows 10000]     # needs: uv sync --extra bench
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import bpe_openai
from _progress import step
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).parent))  # for _ptc_tools, registered by reference

from ringzero import Context, Kernel
from ringzero.agents import CodeAgent
from ringzero.checkpointers import MemoryCheckpointer
from ringzero.core.contract.types import LLMRequest, Message, ToolSchema
from ringzero.testing import ScriptedProvider

ENCODING = bpe_openai.get_encoding("o200k_base")
REGIONS = ("north", "south", "east", "west", "central")
SUMMARY_CODE = """rows = read_csv(path)
totals, counts = {}, {}
for row in rows:
    totals[row['region']] = totals.get(row['region'], 0) + row['amount']
    counts[row['region']] = counts.get(row['region'], 0) + 1
summary = {r: {'total': round(totals[r], 2), 'mean': round(totals[r] / counts[r], 2)} for r in totals}
print(summary)"""
READ_CSV = ToolSchema("read_csv", "Read a CSV file; returns every row as a dict of its columns.",
                      {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]})


def write_csv(path: Path, rows: int) -> None:
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["order_id", "region", "product", "amount"])
        for i in range(rows):
            writer.writerow([i, REGIONS[i % 5], f"sku-{i % 37}", f"{(i * 7919) % 1000 / 10:.2f}"])


def count(text: str, chunk: int = 100_000) -> int:
    """Tokens in ``text``, encoded in pieces cut at spaces (the tokenizer refuses more than
    200,000 tokens at once; a cut at a space moves the count by at most a token a piece)."""
    total, start = 0, 0
    while start < len(text):
        end = len(text)
        if end - start > chunk:
            end = text.rfind(" ", start + 1, start + chunk) + 1 or start + chunk
        total += len(ENCODING.encode(text[start:end]))
        start = end
    return total


def tokens_sent(requests: list[LLMRequest]) -> int:
    """Every token the model was sent: each request's messages (and tool calls) and tool schemas."""
    total = 0
    for request in requests:
        for message in request.messages:
            total += count(message.content) + 4  # plus the per-message framing
            for call in message.tool_calls:
                total += count(call.name + json.dumps(call.arguments))
        for tool in request.tools:
            total += count(json.dumps(tool.to_dict()))
    return total


def final_from_rows(rows: list[dict[str, Any]]) -> str:
    totals: dict[str, float] = {}
    counts: dict[str, int] = {}
    for row in rows:
        totals[row["region"]] = totals.get(row["region"], 0) + row["amount"]
        counts[row["region"]] = counts.get(row["region"], 0) + 1
    return json.dumps({r: {"total": round(totals[r], 2), "mean": round(totals[r] / counts[r], 2)} for r in totals})


def json_script(request: LLMRequest) -> Any:
    """The JSON tool-calling model: ask for the data, then answer from the rows in its context."""
    last = request.messages[-1]
    if last.role == "user":
        return {"content": "", "tool_calls": [{"id": "c1", "name": "read_csv",
                                               "arguments": {"path": last.content.split("file ")[1]}}]}
    return final_from_rows(json.loads(last.content))


async def json_agent(ctx: Context, task: str) -> str:
    """A plain JSON tool-calling loop: every tool result goes back into the model's context."""
    from _ptc_tools import read_csv

    messages: list[Message] = [Message("system", "You are a data analyst. Use the tools to answer."),
                               Message("user", task)]
    while True:
        reply = await ctx.llm(messages, tools=[READ_CSV])
        messages.append(reply.message)
        if not reply.tool_calls:
            return reply.content
        for call in reply.tool_calls:
            result = await ctx.tool(read_csv, **call.arguments)
            messages.append(Message("tool", json.dumps(result), tool_call_id=call.id, name=call.name))


def code_script(request: LLMRequest) -> str:
    """The programmatic model: write the summary code, then answer from what it printed."""
    if request.messages[-1].role == "user" and request.messages[-1].content.startswith("Observation:"):
        printed = request.messages[-1].content.split("\n", 1)[1]
        return f"```python\nfinal_answer({printed})\n```"
    path = request.messages[-1].content.split("file ")[1]
    return f"```python\npath = {path!r}\n{SUMMARY_CODE}\n```"


async def measure(rows: int) -> tuple[int, int, int, int]:
    """(model calls, tokens sent) for the JSON agent, then for CodeAgent, on a ``rows``-row CSV."""
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "sales.csv"
        write_csv(data, rows)
        task = f"Summarize total and mean amount by region in the file {data}"

        json_model = ScriptedProvider(json_script)
        async with Kernel(llm=json_model, checkpointer=MemoryCheckpointer()) as kernel:
            json_answer = await (await kernel.spawn(json_agent, task)).wait()

        code_model = ScriptedProvider(code_script)
        with CodeAgent(["_ptc_tools:read_csv"], llm=code_model, checkpointer=MemoryCheckpointer()) as agent:
            result = await agent.aexecute_task(task)
    assert json.loads(json_answer) == result.answer, "the two agents disagree"
    return json_model.calls, tokens_sent(json_model.requests), code_model.calls, tokens_sent(code_model.requests)


async def main(sizes: list[int]) -> None:
    table = Table(title="Tokens sent to the model: summarize a sales CSV by region (o200k_base)")
    for column in ("rows", "agent", "model calls", "tokens sent", "vs JSON tool calling"):
        table.add_column(column, justify="left" if column == "agent" else "right")
    for rows in sizes:
        step(f"{rows:,} rows")
        json_calls, json_tokens, code_calls, code_tokens = await measure(rows)
        table.add_row(f"{rows:,}", "JSON tool calling (the peer)", str(json_calls), f"{json_tokens:,}", "-")
        table.add_row(f"{rows:,}", "ringzero CodeAgent (programmatic)", str(code_calls), f"{code_tokens:,}",
                      f"{100 * (1 - code_tokens / json_tokens):.1f}% fewer")
    Console(width=120).print(table)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, nargs="+", default=[1_000, 10_000])
    asyncio.run(main(parser.parse_args().rows))
