"""The second half of ``ringzero demo``: a programmatic-tool-calling agent and a recursive agent.

Offline: the "model" is a ScriptedProvider that writes the code a capable model would write.
What is real is everything around it: the code runs in the Monty sandbox with the tools as
functions inside, each model call and run is a journaled syscall of a kernel process, and the
data never enters the model's context.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

from rich.console import Console

from ringzero.agents import CodeAgent, RecursiveAgent
from ringzero.core.contract.types import LLMRequest
from ringzero.core.support.owner_only import owner_only_file, owner_only_folder
from ringzero.testing import ScriptedProvider, count_tokens

__all__ = ["run_agents_demo", "sales_table"]

REGIONS = ("north", "south", "east", "west")


def sales_table(rows: int) -> list[dict[str, object]]:
    """The sales table: one row per order with its region and amount in dollars."""
    return [{"order": i, "region": REGIONS[i % 4], "amount": (i * 7919) % 500} for i in range(rows)]


def _turn(request: LLMRequest) -> int:
    return 1 + sum(1 for m in request.messages if m.role == "assistant")


def ptc_model(request: LLMRequest) -> str:
    """Writes the summary code, then answers with what the code printed."""
    if _turn(request) == 1:
        return ("```python\nrows = sales_table(10000)\ntotals = {}\nfor row in rows:\n"
                "    totals[row['region']] = totals.get(row['region'], 0) + row['amount']\nprint(totals)\n```")
    printed = request.messages[-1].content.split("\n", 1)[1]
    return f"```python\nfinal_answer({printed})\n```"


def recursive_model(request: LLMRequest) -> str:
    """The root model splits the log into pieces; each ask_llm call counts errors in one piece."""
    prompt = request.messages[-1].content
    if prompt.startswith("Count the lines with ERROR"):
        return str(sum("ERROR" in line for line in prompt.splitlines()[1:]))
    if _turn(request) == 1:
        return ("```python\nlines = data.splitlines()\ncounts = []\nfor i in range(0, len(lines), 2500):\n"
                "    piece = '\\n'.join(lines[i:i + 2500])\n"
                "    counts.append(int(ask_llm('Count the lines with ERROR in:\\n' + piece)))\n"
                "print(len(counts), sum(counts))\n```")
    pieces, total = request.messages[-1].content.split("\n", 1)[1].split()
    return f"```python\nfinal_answer({{'pieces_asked': {pieces}, 'errors': {total}}})\n```"


def narrated(script: Callable[[LLMRequest], str], console: Console,
             describe: Callable[[LLMRequest], str]) -> Callable[[LLMRequest], str]:
    """``script``, saying what each model call is for as it is answered: the progress of a run
    whose work is otherwise out of sight (in the sandbox, on the kernel's own loop)."""
    calls = 0

    def answer(request: LLMRequest) -> str:
        nonlocal calls
        calls += 1
        console.print(f"  [dim]· model call {calls}: {describe(request)}[/]")
        return script(request)

    return answer


def _ptc_step(request: LLMRequest) -> str:
    if _turn(request) == 1:
        return "the model writes Python that calls sales_table() inside the Monty sandbox"
    return "the model reads what the code printed (not the rows) and answers"


def _recursive_step(request: LLMRequest) -> str:
    prompt = request.messages[-1].content
    if prompt.startswith("Count the lines with ERROR"):
        return f"ask_llm from the sandbox: count the errors in a piece of {len(prompt.splitlines()) - 1:,} lines"
    if _turn(request) == 1:
        return "the root model writes code that splits the log and asks about each piece"
    return "the root model reads the counts and answers"


async def run_agents_demo(state_dir: Path, console: Console) -> int:
    """Run both agents; returns how many of them failed."""
    failures = 0
    console.rule("[bold]Programmatic tool calling: CodeAgent")
    model = ScriptedProvider(narrated(ptc_model, console, _ptc_step))
    async with CodeAgent(["ringzero.demo_agents:sales_table"], llm=model, state_dir=state_dir) as agent:
        result = await agent.aexecute_task("Total sales amount by region?")
    rows_as_text = str(sales_table(10000))
    sent = sum(count_tokens(m.content) for r in model.requests for m in r.messages)
    console.print(f"  answer: {result.answer}")
    console.print(f"  {model.calls} model calls; words and symbols sent to the model: {sent:,} "
                  f"(the 10,000 rows, about {count_tokens(rows_as_text):,}, stayed in the sandbox)")
    failures += result.error is not None

    console.rule("[bold]Recursive agent: a log far larger than the context")
    log = owner_only_folder(state_dir) / "service.log"
    lines = [f"2026-11-{1 + i % 28:02d}T12:{i % 60:02d} {'ERROR disk full' if i % 13 == 0 else 'INFO ok'} req={i}"
             for i in range(20_000)]
    await asyncio.to_thread(owner_only_file, log)
    await asyncio.to_thread(log.write_text, "\n".join(lines))
    model = ScriptedProvider(narrated(recursive_model, console, _recursive_step))
    async with RecursiveAgent(llm=model, state_dir=state_dir) as recursive:
        found = await recursive.aanalyze(log, "How many errors are in the log?")
    expected = sum("ERROR" in line for line in lines)
    console.print(f"  answer: {found.answer} (the file has {expected} ERROR lines)")
    console.print(f"  {model.calls} model calls: 2 turns of the root agent and "
                  f"{model.calls - 2} ask_llm calls on pieces; the root's context never held the file")
    failures += found.error is not None or not isinstance(found.answer, dict) or found.answer.get("errors") != expected
    return failures
