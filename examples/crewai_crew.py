"""A two-agent CrewAI crew on ringzero: model calls through the kernel's LLM gate, tool code in
the Monty sandbox, the crew run as a kernel process (budgets, pause, kill, `ringzero ps`).

    .venv/bin/python examples/crewai_crew.py          # offline: a scripted model
    OPENAI_API_KEY=... .venv/bin/python examples/crewai_crew.py      # OpenAI (OPENAI_MODEL)
    OPENAI_BASE_URL=http://127.0.0.1:11434/v1 OPENAI_MODEL=qwen2.5 ...  # any OpenAI-compatible server
    ANTHROPIC_API_KEY=... .venv/bin/python examples/crewai_crew.py   # Anthropic (ANTHROPIC_MODEL)

Needs `pip install 'ringzero[crewai]'`. CrewAI's telemetry is switched off below, through
CrewAI's own environment switches, before CrewAI is imported.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
from pathlib import Path
from typing import Any

os.environ.setdefault("CREWAI_DISABLE_TELEMETRY", "true")
os.environ.setdefault("OTEL_SDK_DISABLED", "true")

from crewai import Agent, Crew, Task  # after the environment CrewAI reads
from crewai.tools import tool

from ringzero import Context, Kernel, Limits, LLMGate, RateLimit
from ringzero.adapters.crewai import KernelLLM, kickoff, sandboxed
from ringzero.checkpointers import SqliteCheckpointer
from ringzero.core.contract.types import LLMRequest
from ringzero.providers.llm import provider_from_environment
from ringzero.testing import ScriptedProvider

TEXT = "the cat and the hat and the bat sat on the mat"


@tool("word_stats")
def word_stats(text: str) -> str:
    """Count the words of a text and list the three most common ones."""
    counts: dict[str, int] = {}
    for word in text.lower().split():
        counts[word] = counts.get(word, 0) + 1
    top = sorted(counts, key=lambda w: (-counts[w], w))[:3]
    return f"{len(text.split())} words; most common: {', '.join(top)}"


def scripted_model(request: LLMRequest) -> str:
    """Stands in for a model in CrewAI's ReAct format: the analyst uses its tool, the writer writes."""
    analyst = request.messages[0].content.startswith("You are analyst")  # CrewAI opens with the role
    observed = [m.content.split("Observation:", 1)[1].strip().splitlines()[0]
                for m in request.messages if m.role == "assistant" and "Observation:" in m.content]
    if analyst and not observed:
        return f'Thought: I will measure the text.\nAction: word_stats\nAction Input: {{"text": "{TEXT}"}}'
    if analyst:
        return f"Thought: I now know the final answer\nFinal Answer: {observed[-1]}"
    facts = request.messages[-1].content.split("This is the context you're working with:", 1)[-1].strip()
    return f"Thought: I now know the final answer\nFinal Answer: Report: {facts.splitlines()[0]}"


def build_crew() -> Crew:
    llm = KernelLLM()  # inside a kernel process: the process's gate, budget and journal
    analyst = Agent(role="analyst", goal="Measure texts precisely", llm=llm, tools=[sandboxed(word_stats)],
                    backstory="You measure texts with your tool and never guess.", max_iter=3)
    writer = Agent(role="writer", goal="Report findings in one sentence", llm=llm,
                   backstory="You turn an analyst's findings into one clear sentence.", max_iter=3)
    measure = Task(description=f"Measure this text with your tool: {TEXT}", expected_output="word statistics",
                   agent=analyst)
    report = Task(description="Write a one-sentence report of the analyst's findings.", expected_output="a sentence",
                  agent=writer, context=[measure])
    return Crew(agents=[analyst, writer], tasks=[measure, report])


async def run_crew(ctx: Context) -> str:
    """The crew as a kernel process: its model calls and tool runs are this process's syscalls."""
    result: Any = await kickoff(build_crew())
    return str(result.raw)


async def main() -> None:
    provider = provider_from_environment(fallback=ScriptedProvider(scripted_model))
    print("model:", type(provider).__name__, getattr(provider, "model", ""))
    gate = LLMGate(provider, RateLimit(requests_per_minute=600))
    with tempfile.TemporaryDirectory() as tmp:
        async with Kernel(llm=gate, checkpointer=SqliteCheckpointer(Path(tmp) / "state.db")) as kernel:
            process = await kernel.spawn(run_crew, name="crew", limits=Limits(llm_calls=20))
            print(await process.wait())
            journal = await kernel.store.journal(process.pid)
            print("syscalls journaled:", ", ".join(entry.kind for entry in journal))
            [row] = [p for p in await kernel.ps() if p.pid == process.pid]
            print(f"process {row.pid} {row.name!r}: {row.status.value}, {row.llm_calls} model calls, "
                  f"{row.tokens} tokens")


if __name__ == "__main__":
    asyncio.run(main())
