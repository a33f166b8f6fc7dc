"""``TaskManager``: background tasks of a CodeAgent, each a durable kernel process.

    manager = TaskManager(agent)
    ids = [manager.dispatch_task(f"Summarize file_{i}.csv") for i in range(3)]
    results = [manager.wait_for_task(i) for i in ids]

Tasks live in the agent's store: a manager made after a restart lists the old tasks and
resumes the unfinished ones from their journals (``recover=True``, the default), so no model
call or code run is repeated. Every method has an async twin (``adispatch_task``, ...).
"""

from __future__ import annotations

from ringzero.agents.code_agent import AgentResult, CodeAgent, code_agent_program
from ringzero.core.contract.errors import InvalidArgument, ProcessFailed, ProcessNotFound
from ringzero.core.contract.types import JSON
from ringzero.core.kernel import Kernel, ProcessHandle
from ringzero.core.support.references import reference_of

__all__ = ["TaskManager"]

_PROGRAM = reference_of(code_agent_program)


class TaskManager:
    """Dispatch, watch, wait for and cancel an agent's tasks."""

    def __init__(self, agent: CodeAgent, *, recover: bool = True) -> None:
        self.agent = agent
        self._recover = recover
        self._recovered = False

    # ------------------------------------------------------------------ sync API
    def dispatch_task(self, task: str) -> str:
        """Start ``task`` in the background; returns its id (``task-<pid>``)."""
        return self.agent.host.call(lambda k: self._dispatch(k, task), "TaskManager.dispatch_task")

    def get_status(self, task_id: str) -> dict[str, JSON]:
        return self.agent.host.call(lambda k: self._status(k, task_id), "TaskManager.get_status")

    def wait_for_task(self, task_id: str, timeout: float | None = None) -> AgentResult:
        """The task's result once it has ended (its error if it failed or was cancelled)."""
        return self.agent.host.call(lambda k: self._wait(k, task_id, timeout), "TaskManager.wait_for_task")

    def list_tasks(self) -> list[dict[str, JSON]]:
        return self.agent.host.call(self._list, "TaskManager.list_tasks")

    def cancel_task(self, task_id: str) -> bool:
        """Stop the task; False if it had already ended."""
        return self.agent.host.call(lambda k: self._cancel(k, task_id), "TaskManager.cancel_task")

    # ------------------------------------------------------------------ async API
    async def adispatch_task(self, task: str) -> str:
        return await self.agent.host.acall(lambda k: self._dispatch(k, task))

    async def aget_status(self, task_id: str) -> dict[str, JSON]:
        return await self.agent.host.acall(lambda k: self._status(k, task_id))

    async def await_for_task(self, task_id: str, timeout: float | None = None) -> AgentResult:
        return await self.agent.host.acall(lambda k: self._wait(k, task_id, timeout))

    async def alist_tasks(self) -> list[dict[str, JSON]]:
        return await self.agent.host.acall(self._list)

    async def acancel_task(self, task_id: str) -> bool:
        return await self.agent.host.acall(lambda k: self._cancel(k, task_id))

    # ------------------------------------------------------------------ on the kernel's loop
    async def _dispatch(self, kernel: Kernel, task: str) -> str:
        if not isinstance(task, str) or not task.strip():
            raise InvalidArgument(f"a task is a non-empty string, not {task!r}")
        await self._ready(kernel)
        handle = await kernel.spawn(code_agent_program, task, self.agent.config.to_dict(), name="task",
                                    limits=self.agent.limits)
        return _task_id(handle.pid)

    async def _status(self, kernel: Kernel, task_id: str) -> dict[str, JSON]:
        await self._ready(kernel)
        return _status(self._handle(kernel, task_id))

    async def _wait(self, kernel: Kernel, task_id: str, timeout: float | None) -> AgentResult:
        await self._ready(kernel)
        handle = self._handle(kernel, task_id)
        try:
            return AgentResult.from_dict(await handle.wait(timeout))
        except ProcessFailed as exc:
            return AgentResult(None, "", str(exc), 0)

    async def _list(self, kernel: Kernel) -> list[dict[str, JSON]]:
        await self._ready(kernel)
        handles = [kernel.get(row.pid) for row in await kernel.ps()]
        return [_status(h) for h in handles if h.program == _PROGRAM]

    async def _cancel(self, kernel: Kernel, task_id: str) -> bool:
        await self._ready(kernel)
        handle = self._handle(kernel, task_id)
        if handle.status.terminal:
            return False
        await handle.kill()
        return True

    async def _ready(self, kernel: Kernel) -> None:
        """Once: resume the tasks a previous host left unfinished."""
        if self._recover and not self._recovered:
            self._recovered = True
            await kernel.recover()

    @staticmethod
    def _handle(kernel: Kernel, task_id: str) -> ProcessHandle:
        prefix, _, number = str(task_id).partition("-")
        if prefix != "task" or not number.isdigit():
            raise InvalidArgument(f"a task id looks like 'task-12', not {task_id!r}")
        try:
            handle = kernel.get(int(number))
        except ProcessNotFound:
            raise InvalidArgument(f"no task {task_id!r}") from None
        if handle.program != _PROGRAM:
            raise InvalidArgument(f"{task_id!r} is not a task of this agent")
        return handle


def _task_id(pid: int) -> str:
    return f"task-{pid}"


def _status(handle: ProcessHandle) -> dict[str, JSON]:
    info = handle.info()
    result = handle.result if isinstance(handle.result, dict) else {}
    failure = handle.error["message"] if handle.error else None
    if handle.status.terminal and handle.stop_reason is not None and handle.status.value == "killed":
        failure = f"stopped: {handle.stop_reason.value}"
    return {"id": _task_id(handle.pid), "task": handle.args[0] if handle.args else None,
            "status": handle.status.value, "done": handle.status.terminal,
            "answer": result.get("answer"), "output": result.get("output"),
            "error": result.get("error") or failure, "steps": result.get("steps"),
            "llm_calls": info.llm_calls, "tokens": info.tokens}
