"""Programs written the way users write them, for the kill -9 trials of ``test_natural_kills``.

Each is spawned by a host (``python -m tests.natural_programs DB PROGRAM``) that is killed
with SIGKILL at a random moment and resumed with ``ringzero resume --kernel
tests.natural_programs:make_kernel``. Every real model call and tool run appends a line to
``$RINGZERO_TEST_LOG`` (synced), so the trial counts what happened at the provider and at the
tools, not what the kernel says happened.

- ``notes_loop``: a loop that skips the work already in ``ctx.state``;
- ``log_loop``: a loop that appends to ``ctx.state`` and checkpoints each step;
- ``charges_from_code``: code that calls a payment tool 5 times; the tool takes an
  ``idempotency_key`` and, as payment APIs do, charges once per key;
- ``pays_from_code``: the same with a tool that takes no key: an in-doubt call must never run
  again, and the program says which one was in doubt;
- ``family``: a parent that spawns two children and waits for both;
- ``approval``: drafts with the model, then waits for a person's approval (``ctx.recv``),
  sent with ``ringzero send`` after the crash, then publishes;
- ``crew_publishes``: a CrewAI crew that charges with a keyed ``@tool`` and publishes with a
  plain one, run with ``kickoff(in_doubt="report")``: a publish in doubt is reported to the agent;
- ``graph_pays``: a LangGraph agent whose ``KernelToolNode(in_doubt="report")`` charges with a
  keyed tool and notifies with a plain one, in one turn;
- ``graph_approval``: a LangGraph agent with ``KernelToolNode`` that stops at an ``interrupt()``
  for approval, answered by a message sent with ``ringzero send`` after the crash.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from pathlib import Path
from typing import Any

from ringzero import Context, Kernel, ToolInDoubt
from ringzero.checkpointers import open_checkpointer
from ringzero.core.contract.fingerprints import llm_fingerprint
from ringzero.core.contract.types import LLMRequest
from ringzero.testing import ScriptedProvider

STEP = 0.03
"""Seconds a model call or a tool run takes: long enough for kills to land inside them."""


def log_line(line: str) -> None:
    with Path(os.environ["RINGZERO_TEST_LOG"]).open("a") as f:
        f.write(line + "\n")
        f.flush()
        os.fsync(f.fileno())


async def answer(request: LLMRequest) -> Any:
    """The model: logs the fingerprint of each request it gets (what the journal records it
    by), then answers. A CrewAI agent gets CrewAI's text format, the graph a tool call."""
    log_line(f"llm {llm_fingerprint('default', request)}")
    await asyncio.sleep(STEP)
    last = request.messages[-1]
    if "Current Task:" in "".join(m.content for m in request.messages):
        from tests.crew_programs import react_script

        return react_script(request)
    if last.role == "tool":
        return f"all done: {last.content}"
    if last.content == "write the post":
        return {"content": "", "tool_calls": [{"id": "call-1", "name": "post", "arguments": {"text": "hello"}}]}
    if last.content == "pay the bill":
        return {"content": "", "tool_calls": [{"id": "call-1", "name": "charge_bill", "arguments": {"amount": 30}},
                                              {"id": "call-2", "name": "notify", "arguments": {"text": "paid"}}]}
    return f"answer to {last.content}"


def charge(i: int, idempotency_key: str = "") -> dict[str, Any]:
    """A payment API: a charge is made once per idempotency key; a repeated key gets the first
    charge's receipt. Every attempt is logged, with its key."""
    log_line(f"charge {i} {idempotency_key}")
    time.sleep(STEP)
    return {"charged": i * 10}


def pay(i: int) -> int:
    """A payment with no key: each run is a payment."""
    log_line(f"pay {i}")
    time.sleep(STEP)
    return i * 10


# ---------------------------------------------------------------------- programs
async def notes_loop(ctx: Context) -> list[str]:
    notes = ctx.state.setdefault("notes", [])
    for step in range(len(notes), 6):
        reply = await ctx.llm(f"note {step}")
        notes.append(reply.content)
        await ctx.checkpoint()
    return notes


async def log_loop(ctx: Context) -> list[int]:
    for step in range(6):
        await ctx.llm(f"log {step}")
        ctx.state.setdefault("log", []).append(step)
        await ctx.checkpoint()
    return ctx.state["log"]  # type: ignore[return-value]


CHARGE_FIVE = "receipts = []\nfor i in range(5):\n    receipts.append(charge(i)['charged'])\nreceipts"
PAY_FIVE = "total = 0\nfor i in range(5):\n    total = total + pay(i)\ntotal"


async def charges_from_code(ctx: Context) -> Any:
    plan = await ctx.llm("plan the charges")
    out = await ctx.exec(CHARGE_FIVE, tools={"charge": charge})
    return {"plan": plan.content, "receipts": out.value}


async def pays_from_code(ctx: Context) -> Any:
    plan = await ctx.llm("plan the payments")
    try:
        out = await ctx.exec(PAY_FIVE, tools={"pay": pay})
    except ToolInDoubt as exc:
        return {"plan": plan.content, "in doubt": exc.slot}
    return {"plan": plan.content, "total": out.value}


async def child(ctx: Context, i: int) -> str:
    first = await ctx.llm(f"child {i} first")
    second = await ctx.llm(f"child {i} second")
    return f"{first.content} / {second.content}"


async def family(ctx: Context) -> list[Any]:
    kids = [await ctx.spawn(child, i, name=f"child-{i}") for i in range(2)]
    await ctx.llm("parent while the children work")
    return [await ctx.wait(kid) for kid in kids]


async def approval(ctx: Context) -> dict[str, Any]:
    draft = await ctx.llm("draft the announcement")
    ctx.state["draft"] = draft.content
    await ctx.checkpoint()
    verdict = await ctx.recv()
    if verdict != {"approved": True}:
        return {"draft": draft.content, "published": False}
    receipt = await ctx.tool("publish", draft.content)
    return {"draft": draft.content, "published": receipt}


def publish(text: str, idempotency_key: str = "") -> str:
    log_line(f"publish {idempotency_key}")
    time.sleep(STEP)
    return f"published {len(text)} chars"


async def crew_publishes(ctx: Context) -> list[str]:
    """A CrewAI crew that charges with a keyed ``@tool`` and publishes with a plain one, run with
    ``await kickoff(crew, in_doubt="report")``: a publish in doubt is the agent's to hear of."""
    from crewai import Agent, Crew, Task
    from crewai.tools import tool

    from ringzero.adapters.crewai import KernelLLM, kickoff

    @tool("charge")
    def charge_card(amount: str, idempotency_key: str = "") -> str:
        """Charge the card (once per idempotency key)."""
        log_line(f"crew-charge {amount} {idempotency_key}")
        time.sleep(STEP)
        return f"charged {amount}"

    @tool("publish")
    def publish_post(text: str) -> str:
        """Publish the text."""
        log_line(f"crew-publish {text}")
        time.sleep(STEP)
        return f"published: {text}"

    writer = Agent(role="writer", goal="bill and publish", backstory="You use your tools.", llm=KernelLLM(),
                   tools=[charge_card, publish_post], max_iter=3)
    bill = Task(description="use charge with amount=<<30>>", expected_output="a receipt", agent=writer)
    post = Task(description="use publish with text=<<hello world>>", expected_output="a receipt", agent=writer)
    result = await kickoff(Crew(agents=[writer], tasks=[bill, post]), in_doubt="report")
    return [task.raw for task in result.tasks_output]


async def graph_pays(ctx: Context) -> list[str]:
    """A LangGraph agent: the model asks to charge (a keyed tool) and notify (a plain one) at once;
    ``KernelToolNode(in_doubt="report")`` runs both; the model sums up."""
    from langchain_core.messages import HumanMessage
    from langchain_core.tools import tool
    from langgraph.graph import END, START, MessagesState, StateGraph

    from ringzero.adapters.langchain import KernelChatModel
    from ringzero.adapters.langgraph import KernelToolNode

    @tool
    def charge_bill(amount: int, idempotency_key: str = "") -> str:
        """Charge the bill (once per idempotency key)."""
        log_line(f"bill-charge {amount} {idempotency_key}")
        time.sleep(STEP)
        return f"charged {amount}"

    @tool
    def notify(text: str) -> str:
        """Tell the customer."""
        log_line(f"notify {text}")
        time.sleep(STEP)
        return f"notified: {text}"

    tools = KernelToolNode([charge_bill, notify], in_doubt="report")
    model = KernelChatModel().bind_tools([charge_bill, notify])

    async def agent(state: MessagesState) -> dict[str, Any]:
        return {"messages": [await model.ainvoke(state["messages"])]}

    graph = StateGraph(MessagesState)
    graph.add_node("agent", agent)
    graph.add_node("tools", tools)
    graph.add_node("sum_up", agent)
    for a, b in ((START, "agent"), ("agent", "tools"), ("tools", "sum_up"), ("sum_up", END)):
        graph.add_edge(a, b)
    result = await graph.compile().ainvoke({"messages": [HumanMessage("pay the bill")]})
    return [str(m.content) for m in result["messages"]]


async def graph_approval(ctx: Context) -> list[str]:
    """A LangGraph agent: the model asks to post, a person approves (``interrupt()``, the answer
    read with ``ctx.recv()``), ``KernelToolNode`` posts, the model sums up."""
    from langchain_core.messages import HumanMessage
    from langchain_core.tools import tool
    from langgraph.checkpoint.memory import InMemorySaver
    from langgraph.graph import END, START, MessagesState, StateGraph
    from langgraph.types import Command, interrupt

    from ringzero import idempotent
    from ringzero.adapters.langchain import KernelChatModel
    from ringzero.adapters.langgraph import KernelToolNode

    @tool
    @idempotent  # the other side deduplicates posts by their text
    def post(text: str) -> str:
        """Post the text."""
        log_line(f"post {text}")
        time.sleep(STEP)
        return f"posted {len(text)} chars"

    model = KernelChatModel().bind_tools([post])

    async def write(state: MessagesState) -> dict[str, Any]:
        return {"messages": [await model.ainvoke(state["messages"])]}

    def approve(state: MessagesState) -> dict[str, Any]:
        if interrupt("post it?") != "yes":
            raise ValueError("not approved")
        return {}

    graph = StateGraph(MessagesState)
    graph.add_node("write", write)
    graph.add_node("approve", approve)
    graph.add_node("tools", KernelToolNode([post]))
    graph.add_node("sum_up", write)
    for a, b in ((START, "write"), ("write", "approve"), ("approve", "tools"), ("tools", "sum_up"), ("sum_up", END)):
        graph.add_edge(a, b)
    app = graph.compile(checkpointer=InMemorySaver())  # durable through the kernel's journal
    config: Any = {"configurable": {"thread_id": "post"}}
    result = await app.ainvoke({"messages": [HumanMessage("write the post")]}, config)
    while "__interrupt__" in result:
        verdict = await ctx.recv()  # hours later, after any number of crashes
        result = await app.ainvoke(Command(resume=verdict["answer"]), config)  # type: ignore[index,call-overload]
    return [str(m.content) for m in result["messages"]]


PROGRAMS = {p.__name__: p for p in (notes_loop, log_loop, charges_from_code, pays_from_code, family, approval,
                                    crew_publishes, graph_pays, graph_approval)}
WAITS_FOR_APPROVAL = {"approval": {"approved": True}, "graph_approval": {"answer": "yes"}}
"""The programs that wait for a person, and the message that approves."""


def make_kernel(db: Any) -> Kernel:
    """What ``ringzero resume --kernel tests.natural_programs:make_kernel`` builds."""
    return Kernel(checkpointer=open_checkpointer(str(db)), llm=ScriptedProvider(answer),
                  tools={"publish": publish, "charge": charge, "pay": pay})


async def host(db: str, program: str) -> None:
    async with make_kernel(db) as kernel:
        handle = await kernel.spawn(PROGRAMS[program], name=program)
        print("spawned", flush=True)
        if program in WAITS_FOR_APPROVAL:  # nobody approves here: the approval comes after the crash
            while handle.status.value != "waiting":
                await asyncio.sleep(0.01)
        else:
            await handle.wait()
        print("done", flush=True)
        await asyncio.sleep(3600)  # stay alive: the trial kills us


if __name__ == "__main__":
    asyncio.run(host(sys.argv[1], sys.argv[2]))
