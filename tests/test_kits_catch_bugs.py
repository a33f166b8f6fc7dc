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
from ringzero.checkpointers import MemoryCheckpointer, SqliteCheckpointer
from ringzero.compat.checkpointer import CheckpointerConformance, claims_race_across_instances
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


class DeletesByPrefix(MemoryCheckpointer):
    """``delete_thread`` matches thread ids by prefix, as ``WHERE thread_id LIKE ? || '%'`` does."""

    async def delete_thread(self, thread_id: str) -> None:
        for thread in [t for t in self._threads if t.startswith(thread_id)]:
            await super().delete_thread(thread)


async def test_a_store_that_deletes_threads_by_prefix_fails_the_checkpointer_kit() -> None:
    """Deleting ``user-1`` wiped ``user-10``; in a kernel, process 1 took process 12 with it."""
    kit = CheckpointerConformance()
    await fails(lambda: kit.test_delete_thread_matches_the_whole_id_never_a_prefix_or_pattern(DeletesByPrefix()),
                lambda: kit.test_delete_thread_matches_the_whole_id_never_a_prefix_or_pattern(MemoryCheckpointer()),
                "delete_thread took more than the thread it names")


class ChecksThenPuts(SqliteCheckpointer):
    """A claim that reads, then writes: atomic only where one client serializes the calls."""

    async def claim(self, checkpoint: Checkpoint) -> bool:
        if await self.get(checkpoint.thread_id, checkpoint.namespace, checkpoint.id) is not None:
            return False
        await asyncio.sleep(0.01)  # the round trip between the read and the write
        await self.put(checkpoint)
        return True


async def test_a_claim_that_is_atomic_only_in_one_client_fails_the_checkpointer_kit(tmp_path: Path) -> None:
    """Eight kernels, each with its own instance of the store, all won one pid: the kit raced on
    one instance, whose client serialized the calls."""
    control, planted = tmp_path / "control.db", tmp_path / "planted.db"
    await fails(lambda: _race(ChecksThenPuts(planted), lambda: ChecksThenPuts(planted)),
                lambda: _race(SqliteCheckpointer(control), lambda: SqliteCheckpointer(control)),
                "instances of the store won one claim")


async def _race(first: Any, open_again: Callable[[], Any]) -> None:
    try:
        await claims_race_across_instances(first, open_again)
    finally:
        await first.aclose()


async def test_an_executor_that_drops_stdout_when_the_code_raises_fails_the_executor_kit(site: Path) -> None:
    from ringzero_outside.executor import PipeExecutor

    class DropsIt(PipeExecutor):
        async def run(self, code: str, **options: Any) -> Any:
            result = await super().run(code, **options)
            return dataclasses.replace(result, stdout="") if result.error is not None else result

    kit = ExecutorConformance()
    await fails(lambda: kit.test_what_the_code_printed_before_it_raised_is_kept(DropsIt()),
                lambda: kit.test_what_the_code_printed_before_it_raised_is_kept(PipeExecutor()),
                "the code printed two lines before it raised")


async def test_a_provider_that_says_length_for_max_tokens_fails_the_llm_kit(site: Path) -> None:
    """The vendor's word passed through: a loop that checks for ``max_tokens`` never asks for the rest."""
    from ringzero_outside import provider as outside

    class KeepsTheVendorsWord(outside.ChatCompletions):
        async def complete(self, request: Any) -> Any:
            saved = dict(outside.STOP_REASONS)
            outside.STOP_REASONS.pop("length")
            try:
                return await super().complete(request)
            finally:
                outside.STOP_REASONS.update(saved)

    kit = LLMProviderConformance()
    await fails(lambda: kit.test_an_answer_cut_short_by_the_token_limit_stops_for_max_tokens(
                    on_the_kit_s_server(lambda url: KeepsTheVendorsWord(url, timeout=0.3))),
                lambda: kit.test_an_answer_cut_short_by_the_token_limit_stops_for_max_tokens(
                    on_the_kit_s_server(lambda url: outside.ChatCompletions(url, timeout=0.3))),
                "stopped for 'length', not 'max_tokens'")


async def test_the_kit_s_anthropic_server_answers_the_sdk_s_beta_path() -> None:
    """The Anthropic SDK's beta client posts to ``/v1/messages?beta=true``: the kit's server
    answered 404."""
    with scenario_server("anthropic", "answer") as url:
        async with httpx.AsyncClient() as client:
            response = await client.post(f"{url}/v1/messages?beta=true", json={
                "model": "claude-test", "max_tokens": 10, "messages": [{"role": "user", "content": "ping"}]},
                headers={"x-api-key": "k", "anthropic-version": "2023-06-01"})
    assert response.status_code == 200 and response.json()["content"][0]["text"] == "pong", response.text
