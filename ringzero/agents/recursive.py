"""``RecursiveAgent``: the data stays in the sandbox; the model reads it through code.

The data (a file of any size, or a string) is the variable ``data`` inside the sandbox, never
in the model's context. The model's code slices it and calls ``ask_llm(prompt)`` on pieces, a
host tool routed through the kernel's LLM gate and charged to the task's budget; only what the
code prints comes back. This is how a model works through a text far larger than its window.
"""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path
from typing import Any

from ringzero.agents.code_agent import AgentConfig, AgentResult, CodeAgent, solve
from ringzero.core.context import Context
from ringzero.core.contract.errors import InvalidArgument
from ringzero.core.contract.types import JSON
from ringzero.core.kernel import Kernel

__all__ = ["RecursiveAgent", "recursive_agent_program"]

RECURSIVE_PROMPT = """You answer a question about a large text by writing Python code, which runs in a sandbox.
The text is in the variable `data` ({size} characters, {lines} lines): far too large to print.
These functions are defined there:
{tools}
- ask_llm(prompt): ask a language model about a piece of the text; returns its answer (a string).
- final_answer(value): call this with the answer when you have it.

Reply with one ```python code block. Slice `data` in code (data[:2000], data.splitlines(), ...),
call ask_llm on pieces you choose, and print only short results. You then write the next
block, until you call final_answer."""


async def recursive_agent_program(ctx: Context, question: str, source: str, config: dict[str, JSON]) -> dict[str, JSON]:
    """The kernel program behind a RecursiveAgent task; ``source`` is a file path, read here
    (again on a resume: the file must not change under a running task)."""
    text = await asyncio.to_thread(Path(source).read_text, errors="replace")
    settings = AgentConfig.from_dict(config)
    prompt = RECURSIVE_PROMPT.replace("{size}", f"{len(text):,}").replace("{lines}", f"{text.count(chr(10)) + 1:,}")
    settings = dataclasses.replace(settings, inputs={**settings.inputs, "data": text}, system_prompt=prompt)

    async def ask_llm(prompt: str) -> str:
        """Ask the model about a piece of the data (through the gate, charged to this task)."""
        if not isinstance(prompt, str):
            raise TypeError(f"ask_llm takes a string prompt, not {type(prompt).__name__}")
        return (await ctx.nested_llm(prompt, provider=settings.provider)).content

    return (await solve(ctx, question, settings, extra_tools={"ask_llm": ask_llm})).to_dict()


class RecursiveAgent(CodeAgent):
    """A CodeAgent whose task is a question about data kept out of the model's context."""

    def analyze(self, data: str | Path, question: str) -> AgentResult:
        """Answer ``question`` about ``data`` (a path); the result unpacks as ``result, output, error``."""
        source = _source(data)
        return self.host.call(lambda k: self._run(k, source, question), "RecursiveAgent.analyze")

    async def aanalyze(self, data: str | Path, question: str) -> AgentResult:
        source = _source(data)
        return await self.host.acall(lambda k: self._run(k, source, question))

    async def _run(self, kernel: Kernel, source: str, question: str) -> AgentResult:
        handle = await kernel.spawn(recursive_agent_program, question, source, self.config.to_dict(),
                                    name="recursive-task", limits=self.limits)
        result: Any = await handle.wait()
        return AgentResult.from_dict(result)


def _source(data: str | Path) -> str:
    path = Path(data).absolute()
    if not path.is_file():
        raise InvalidArgument(f"RecursiveAgent reads its data from a file; {str(data)!r} is not one")
    return str(path)
