"""Each conformance kit fails a backend with a bug that breaks what the kernel promises, one
bug planted at a time in a backend that otherwise passes (the same kit test passes on it
unplanted: the control). These are the bugs a framework author's backends had while every kit
was green."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from ringzero import BadRequest, Checkpoint
from ringzero.checkpointers import MemoryCheckpointer
from ringzero.compat.checkpointer import CheckpointerConformance
from ringzero.compat.executor import ExecutorConformance
from ringzero.compat.llm import LLMProviderConformance
from ringzero.compat.llm_wire import scenario_server
from ringzero.compat.scheduler import SchedulerConformance
from ringzero.core.contract.protocols import LLMProvider
from tests.outside_install import installed  # noqa: F401  (the site fixture)


async def fails(check: Callable[[], Awaitable[None]], control: Callable[[], Awaitable[None]], words: str) -> None:
    """``control`` (the kit test on the backend without the bug) passes; ``check`` (the same
    test, bug planted) fails, saying ``words``."""
    await control()
    with pytest.raises(AssertionError) as failed:
        await check()
    assert words in str(failed.value), failed.value


class LosesParents(MemoryCheckpointer):
    """Never stores ``parent_id``."""

    async def put(self, checkpoint: Checkpoint) -> None:
        await super().put(dataclasses.replace(checkpoint, parent_id=None))


class KeepsWritesOfDeletedThreads(MemoryCheckpointer):
    """``delete_thread`` removes the checkpoints and leaves their writes."""

    async def delete_thread(self, thread_id: str) -> None:
        writes = {address: kept for address, kept in self._writes.items() if address[0] == thread_id}
        await super().delete_thread(thread_id)
        self._writes.update(writes)


async def test_a_store_that_loses_parent_links_fails_the_checkpointer_kit() -> None:
    kit = CheckpointerConformance()
    await fails(lambda: kit.test_parent_links_make_the_history(LosesParents()),
                lambda: kit.test_parent_links_make_the_history(MemoryCheckpointer()), "parent links were lost")


async def test_a_store_whose_delete_leaves_writes_fails_the_checkpointer_kit() -> None:
    kit = CheckpointerConformance()
    await fails(lambda: kit.test_delete_thread_removes_its_writes_too(KeepsWritesOfDeletedThreads()),
                lambda: kit.test_delete_thread_removes_its_writes_too(MemoryCheckpointer()),
                "delete_thread left the thread's writes behind")


async def test_an_executor_whose_timeout_leaves_the_code_running_fails_the_executor_kit(site: Path,
                                                                                       tmp_path: Path) -> None:
    from ringzero_outside.executor import PipeExecutor

    class LeavesItRunning(PipeExecutor):
        async def stop(self, child: asyncio.subprocess.Process) -> None:
            """Forgets the child: it runs on."""

    kit = ExecutorConformance()
    (tmp_path / "control").mkdir()
    (tmp_path / "planted").mkdir()
    await fails(lambda: kit.test_a_timeout_stops_the_code_for_good(LeavesItRunning(), tmp_path / "planted"),
                lambda: kit.test_a_timeout_stops_the_code_for_good(PipeExecutor(), tmp_path / "control"),
                "the code ran on after its timeout and wrote a file")


async def test_an_executor_that_calls_its_timeout_the_code_s_error_fails_the_executor_kit(site: Path) -> None:
    from ringzero_outside.executor import PipeExecutor

    from ringzero import ExecError

    class BlamesTheCode(PipeExecutor):
        def timed_out(self, wall: float) -> ExecError:
            return ExecError("TimeoutError", f"the code ran past {wall} s")

    kit = ExecutorConformance()
    await fails(lambda: kit.test_the_wall_time_limit_stops_a_run_that_sleeps(BlamesTheCode()),
                lambda: kit.test_the_wall_time_limit_stops_a_run_that_sleeps(PipeExecutor()),
                "a timeout was reported as the code's own error")


Started = Callable[[str], AbstractAsyncContextManager[LLMProvider]]


def on_the_kit_s_server(make: Callable[[str], LLMProvider]) -> Started:
    @asynccontextmanager
    async def start(scenario: str) -> Any:
        with scenario_server("openai", scenario) as url:
            provider = make(url)
            yield provider
            await provider.aclose()  # type: ignore[attr-defined]
    return start


async def test_a_provider_that_calls_403_a_bad_request_fails_the_llm_kit(site: Path) -> None:
    from ringzero_outside.provider import ChatCompletions

    class ForbiddenIsBad(ChatCompletions):
        def error_for(self, response: httpx.Response) -> Any:
            return BadRequest("403") if response.status_code == 403 else super().error_for(response)

    kit = LLMProviderConformance()
    await fails(lambda: kit.test_refused_credentials_are_authentication_failed(
                    on_the_kit_s_server(lambda url: ForbiddenIsBad(url, timeout=0.3)), "forbidden"),
                lambda: kit.test_refused_credentials_are_authentication_failed(
                    on_the_kit_s_server(lambda url: ChatCompletions(url, timeout=0.3)), "forbidden"),
                "forbidden: BadRequest, not AuthenticationFailed")


async def test_a_provider_that_lets_connection_refused_escape_fails_the_llm_kit(site: Path) -> None:
    from ringzero_outside.provider import ChatCompletions

    class LetsItEscape(ChatCompletions):
        def unreachable(self, exc: Exception) -> Any:
            raise exc

    kit = LLMProviderConformance()
    await fails(lambda: kit.test_a_server_that_is_down_is_provider_unavailable_and_retried(
                    on_the_kit_s_server(lambda url: LetsItEscape(url, timeout=0.3))),
                lambda: kit.test_a_server_that_is_down_is_provider_unavailable_and_retried(
                    on_the_kit_s_server(lambda url: ChatCompletions(url, timeout=0.3))),
                "httpx.ConnectError escaped complete()")


async def test_a_scheduler_that_leaks_a_slot_handed_to_a_cancelled_wait_fails_the_scheduler_kit(site: Path) -> None:
    from ringzero_outside.scheduler import HeapScheduler

    class Leaks(HeapScheduler):
        def left(self, entry: Any) -> None:
            if entry in self.waiting:
                self.waiting.remove(entry)  # and a slot handed to it is forgotten

    kit = SchedulerConformance()
    await fails(lambda: kit.test_a_wait_cancelled_right_after_hand_off_leaks_no_slot(Leaks()),
                lambda: kit.test_a_wait_cancelled_right_after_hand_off_leaks_no_slot(HeapScheduler()),
                "the slot handed to a cancelled wait was never given back")
