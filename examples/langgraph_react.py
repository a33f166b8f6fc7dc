"""A LangGraph ReAct agent on ringzero: model calls through the kernel's LLM gate, tool code in
the Monty sandbox, every call journaled, state in SQLite.

    .venv/bin/python examples/langgraph_react.py          # offline: a scripted model
    OPENAI_API_KEY=... .venv/bin/python examples/langgraph_react.py             # OpenAI (OPENAI_MODEL)
    OPENAI_BASE_URL=http://127.0.0.1:11434/v1 OPENAI_MODEL=qwen2.5 ...          # any OpenAI-compatible server
    ANTHROPIC_API_KEY=... .venv/bin/python examples/langgraph_react.py          # Anthropic (ANTHROPIC_MODEL)

Any LangChain chat model works too: pass ChatModelProvider(your_chat_model) as the provider.
"""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path
from typing import Any

from langchain_core.messages import HumanMessage
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import tools_condition

from ringzero import Context, Kernel, LLMGate, RateLimit
from ringzero.adapters.langchain import KernelChatModel
from ringzero.adapters.langgraph import KernelToolNode, sandboxed
from ringzero.checkpointers import SqliteCheckpointer
from ringzero.core.contract.types import LLMRequest
from ringzero.providers.llm import provider_from_environment
from ringzero.testing import ScriptedProvider

QUESTION = "Which words repeat most in 'the cat and the hat and the bat'? Use the word_stats tool."


def word_stats(text: str, top: int = 3) -> dict[str, Any]:
    """Count the words of a text and list the most common ones."""
    counts: dict[str, int] = {}
    for word in text.lower().split():
        counts[word] = counts.get(word, 0) + 1
    return {"words": len(text.split()), "top": sorted(counts, key=lambda w: (-counts[w], w))[:top]}


def scripted_model(request: LLMRequest) -> Any:
    """Stands in for a model: asks for the tool once, then answers from its result."""
    if request.messages[-1].role == "tool":
        return f"Here is what the tool found: {request.messages[-1].content}"
    return {"content": "", "tool_calls": [{"id": "call-1", "name": "word_stats",
                                           "arguments": {"text": "the cat and the hat and the bat"}}]}


async def react_agent(ctx: Context, question: str) -> str:
    """The agent as a kernel process: pause, kill, budgets and `ringzero ps` apply to it."""
    tools = [sandboxed(word_stats)]
    model = KernelChatModel().bind_tools(tools)

    async def agent(state: MessagesState) -> dict[str, Any]:
        return {"messages": [await model.ainvoke(state["messages"])]}

    graph = StateGraph(MessagesState)
    graph.add_node("agent", agent)
    graph.add_node("tools", KernelToolNode(tools, handle_tool_errors=True))  # errors go back to the model
    graph.add_edge(START, "agent")
    graph.add_conditional_edges("agent", tools_condition)
    graph.add_edge("tools", "agent")
    graph.add_edge("agent", END)
    result = await graph.compile().ainvoke({"messages": [HumanMessage(question)]})
    return str(result["messages"][-1].content)


async def main() -> None:
    provider = provider_from_environment(fallback=ScriptedProvider(scripted_model))
    print("model:", type(provider).__name__, getattr(provider, "model", ""))
    gate = LLMGate(provider, RateLimit(requests_per_minute=600))
    with tempfile.TemporaryDirectory() as tmp:
        async with Kernel(llm=gate, checkpointer=SqliteCheckpointer(Path(tmp) / "state.db")) as kernel:
            process = await kernel.spawn(react_agent, QUESTION, name="react-agent")
            print(await process.wait())
            journal = await kernel.store.journal(process.pid)
            print("syscalls journaled:", ", ".join(entry.kind for entry in journal))
            print("tokens through the gate:", gate.total_usage.total_tokens)


if __name__ == "__main__":
    asyncio.run(main())
