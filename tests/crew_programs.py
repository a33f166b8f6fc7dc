"""CrewAI crews and flows the tests run (module level, so that a second Python process can import them)."""

from __future__ import annotations

import asyncio
import os
import re
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager

os.environ.setdefault("CREWAI_DISABLE_TELEMETRY", "true")
os.environ.setdefault("OTEL_SDK_DISABLED", "true")

from crewai import Agent, Crew, Task  # after the environment CrewAI reads
from crewai.flow.flow import Flow, listen, start
from crewai.flow.persistence import persist
from crewai.tools import tool as crewai_tool
from pydantic import BaseModel

from ringzero import Context, ToolInDoubt
from ringzero.adapters.crewai import KernelFlowPersistence, KernelLLM, kickoff, sandboxed
from ringzero.checkpointers import SqliteCheckpointer
from ringzero.core.contract.types import LLMRequest
from tests.tool_bodies import crew_read_file, crew_word_count


def react_script(request: LLMRequest) -> str:
    """A model for CrewAI's text ReAct loop: call the tool the task names once, then answer.

    The task says which tool and which input (``use TOOL on INPUT``); once an observation is
    in the conversation, the final answer repeats it.
    """
    text = "\n".join(m.content for m in request.messages)
    observations = [m.content.split("Observation:", 1)[1].strip().splitlines()[0]
                    for m in request.messages if m.role == "assistant" and "Observation:" in m.content]
    if observations:
        return f"Thought: I now know the final answer\nFinal Answer: {observations[-1]}"
    tool, argument, value = re.search(r"use (\w+) with (\w+)=<<(.*?)>>", text, re.S).groups()  # type: ignore[union-attr]
    return f'Thought: I will use the tool.\nAction: {tool}\nAction Input: {{"{argument}": "{value}"}}'


def counting_crew(llm: KernelLLM, text: str) -> Crew:
    """Two agents: a counter with a sandboxed tool, and a reporter that passes the count on."""
    counter = Agent(role="counter", goal="count words", backstory="You count words with your tool.", llm=llm,
                    tools=[sandboxed(crew_word_count)], max_iter=3)
    reader = Agent(role="reader", goal="read files", backstory="You read files with your tool.", llm=llm,
                   tools=[sandboxed(crew_read_file)], max_iter=3)
    count = Task(description=f"use crew_word_count with text=<<{text}>>", expected_output="a number", agent=counter)
    read = Task(description="use crew_read_file with path=<<{secret}>>", expected_output="the file", agent=reader)
    return Crew(agents=[counter, reader], tasks=[count, read])


async def crew_program(ctx: Context, text: str, secret: str) -> list[str]:
    """A crew run as a kernel process: its model calls and tool runs are the process's syscalls."""
    result = await kickoff(counting_crew(KernelLLM(), text), inputs={"secret": secret})
    return [task.raw for task in result.tasks_output]


PUBLISHED: list[str] = []
"""Every real run of the plain ``publish`` tool, in this Python process."""
HOLD: set[str] = set()
"""Texts whose publishing hangs after it is done (until ``RELEASE``): the host dies there."""
RELEASE = threading.Event()


@crewai_tool("publish")
def publish(text: str) -> str:
    """Publish the text."""
    PUBLISHED.append(text)
    if text in HOLD:
        RELEASE.wait(30)
    return f"published: {text}"


def publishing_crew(llm: KernelLLM) -> Crew:
    """One agent with a plain ``@tool`` (no sandbox): it publishes, then answers."""
    writer = Agent(role="writer", goal="publish posts", backstory="You publish with your tool.", llm=llm,
                   tools=[publish], max_iter=3)
    post = Task(description="use publish with text=<<hello world>>", expected_output="a receipt", agent=writer)
    return Crew(agents=[writer], tasks=[post])


async def publishing_program(ctx: Context) -> str:
    result = await kickoff(publishing_crew(KernelLLM()))
    return str(result.raw)


async def careful_publishing_program(ctx: Context) -> str:
    """The crew, with the program deciding about a publish that was in flight at a crash."""
    try:
        return await publishing_program(ctx)
    except ToolInDoubt as exc:
        return f"in doubt: {exc.tool}"


async def reporting_publishing_program(ctx: Context) -> str:
    """The crew, whose agent is told about a publish in doubt (``in_doubt="report"``)."""
    result = await kickoff(publishing_crew(KernelLLM()), in_doubt="report")
    return str(result.raw)


CHARGE_KEYS: list[str] = []
"""The idempotency key of every real run of ``charge``, in this Python process."""


@crewai_tool("charge")
def charge(amount: str, idempotency_key: str = "") -> str:
    """Charge the card; the payment API charges once per idempotency key."""
    CHARGE_KEYS.append(idempotency_key)
    if amount in HOLD:
        RELEASE.wait(30)
    return f"charged {amount} under {idempotency_key}"


async def charging_program(ctx: Context) -> str:
    payer = Agent(role="payer", goal="pay bills", backstory="You pay with your tool.", llm=KernelLLM(),
                  tools=[charge], max_iter=3)
    bill = Task(description="use charge with amount=<<12>>", expected_output="a receipt", agent=payer)
    result = await kickoff(Crew(agents=[payer], tasks=[bill]))
    return str(result.raw)


class Counter(BaseModel):
    id: str = ""
    steps: list[str] = []
    pid: list[int] = []


def counter_flow(persistence: KernelFlowPersistence) -> type[Flow[Counter]]:
    """A two-step flow persisted (class-level ``@persist``) through ``persistence``."""

    @persist(persistence)
    class CounterFlow(Flow[Counter]):
        @start()
        def begin(self) -> None:
            self.state.steps.append("begin")
            self.state.pid.append(os.getpid())

        @listen(begin)
        def finish(self) -> None:
            self.state.steps.append("finish")
            self.state.pid.append(os.getpid())

    return CounterFlow


@contextmanager
def flow_persistence(db: str) -> Iterator[KernelFlowPersistence]:
    """A flow persistence over a SQLite checkpointer on ``db``; both are closed afterwards, as a
    user closes what they open. Not from a running event loop (the close makes its own)."""
    checkpointer = SqliteCheckpointer(db)
    persistence = KernelFlowPersistence(checkpointer)
    try:
        yield persistence
    finally:
        persistence.close()
        asyncio.run(checkpointer.aclose())


def run_counter_flow(db: str, flow_id: str | None = None) -> dict[str, object]:
    """Run the counter flow persisted in ``db`` (reloading ``flow_id``) and return its state."""
    with flow_persistence(db) as persistence:
        flow = counter_flow(persistence)()
        flow.kickoff(inputs={"id": flow_id} if flow_id else None)
        return flow.state.model_dump()


async def flow_program(ctx: Context, db: str) -> dict[str, object]:
    """A persisted flow run as a kernel process."""
    checkpointer = SqliteCheckpointer(db)
    persistence = KernelFlowPersistence(checkpointer)
    try:
        flow = counter_flow(persistence)()
        await kickoff(flow)
        return flow.state.model_dump()
    finally:
        await asyncio.to_thread(persistence.close)  # its loop thread, where the checkpointer was opened
        await checkpointer.aclose()


def main(argv: list[str]) -> None:
    """``python -m tests.crew_programs flow DB [ID]``: run the flow (reloading ID) and print its state."""
    import json

    _, db, *rest = argv
    print(json.dumps(run_counter_flow(db, *rest)), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
