"""Userspace agents, built only on the kernel's protocols and syscalls.

- ``CodeAgent`` / ``create_agent()`` / ``execute_task()``: programmatic tool calling.
- ``ToolRegistry``: tools with progressive discovery (``search_tools``).
- ``TaskManager``: background tasks as durable kernel processes.
- ``RecursiveAgent``: data kept in the sandbox, read by the model's code with ``ask_llm``.
"""

from ringzero.agents.code_agent import AgentConfig, AgentResult, CodeAgent, create_agent, execute_task
from ringzero.agents.recursive import RecursiveAgent
from ringzero.agents.registry import ToolRegistry, ToolSpec
from ringzero.agents.tasks import TaskManager

__all__ = [
    "AgentConfig",
    "AgentResult",
    "CodeAgent",
    "RecursiveAgent",
    "TaskManager",
    "ToolRegistry",
    "ToolSpec",
    "create_agent",
    "execute_task",
]
