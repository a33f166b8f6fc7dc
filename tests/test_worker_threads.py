"""Sync frameworks on worker threads never hang the kernel: any number of processes that run
their sync part in ``asyncio.to_thread`` (the LangGraph page's advice for a sync LangChain, LangGraph or
CrewAI call) and block there on syscalls all finish, whatever those syscalls need of asyncio's
default thread pool (an executor's first run, the process sandbox's workspace, a provider's
first DNS lookup). 48 processes here: eight times the pool's cap on a 2-core machine."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from ringzero import Context, Kernel
from ringzero.checkpointers import MemoryCheckpointer
from ringzero.compat.vendor_servers import openai_answer, vendor_server
from ringzero.providers.executors import MontyExecutor, ProcessExecutor

PROCESSES = 48


def runs_code(ctx: Context) -> Any:
    """A framework's sync step: it runs code through the kernel and waits for it."""
    return ctx.call_from_thread(ctx.exec("sum(range(5))"), "exec").value


async def code_on_a_worker_thread(ctx: Context) -> Any:
    return await asyncio.to_thread(runs_code, ctx)


def asks_a_langchain_model(ctx: Context) -> Any:
    from ringzero.adapters.langchain import KernelChatModel

    return KernelChatModel().invoke("hello").content  # inside a process: ctx.llm, on the kernel's loop


async def model_on_a_worker_thread(ctx: Context) -> Any:
    return await asyncio.to_thread(asks_a_langchain_model, ctx)


async def all_finish(kernel: Kernel, program: Any) -> list[Any]:
    handles = [await kernel.spawn(program) for _ in range(PROCESSES)]
    return await asyncio.wait_for(asyncio.gather(*(h.wait() for h in handles)), 60)


@pytest.mark.parametrize("executor", ["monty", "process"])
async def test_processes_blocked_on_worker_threads_all_finish_their_code(executor: str) -> None:
    made = MontyExecutor() if executor == "monty" else ProcessExecutor()
    async with Kernel(checkpointer=MemoryCheckpointer(), executor=made) as kernel:
        assert await all_finish(kernel, code_on_a_worker_thread) == [10] * PROCESSES


async def test_langchain_models_on_worker_threads_all_reach_a_server_named_localhost() -> None:
    from ringzero.providers.llm import OpenAIProvider

    with vendor_server("openai", [openai_answer("hi")] * PROCESSES) as server:
        url = server.url.replace("127.0.0.1", "localhost")  # a name: its first connection resolves it
        provider = OpenAIProvider(model="m", base_url=url, api_key="test-key")
        async with Kernel(checkpointer=MemoryCheckpointer(), llm=provider) as kernel:
            assert await all_finish(kernel, model_on_a_worker_thread) == ["hi"] * PROCESSES
        assert len(server.requests) == PROCESSES


async def test_a_kernel_keeps_a_default_pool_the_application_set_and_replaces_asyncio_s_own() -> None:
    import concurrent.futures

    from ringzero.core.support.loop_pool import LoopPool

    loop = asyncio.get_running_loop()
    await asyncio.to_thread(lambda: None)  # asyncio makes its own plain pool
    async with Kernel(checkpointer=MemoryCheckpointer()) as kernel:
        await kernel.start()
        assert isinstance(loop._default_executor, LoopPool)  # type: ignore[attr-defined]
    mine = concurrent.futures.ThreadPoolExecutor(max_workers=64, thread_name_prefix="app")
    loop.set_default_executor(mine)
    async with Kernel(checkpointer=MemoryCheckpointer()) as kernel:
        await kernel.start()
        assert loop._default_executor is mine  # type: ignore[attr-defined]


def test_work_queued_before_every_thread_blocked_on_the_loop_still_runs() -> None:
    """Every thread of the pool busy, a job queued behind them, then each thread waits for a
    result that only the queued job gives: the pool starts a thread for it, where a plain pool
    would wait for good."""
    import concurrent.futures
    import threading

    from ringzero.core.support.loop_pool import LoopPool, wait_for_loop

    pool = LoopPool()
    cap = pool._max_workers  # the cap the test fills
    answer: concurrent.futures.Future[str] = concurrent.futures.Future()
    started = threading.Barrier(cap + 1)
    go = threading.Event()

    def framework_step() -> str:
        started.wait(10)
        go.wait(10)  # busy, not yet blocked on the loop, while the job is queued
        return wait_for_loop(answer)

    try:
        steps = [pool.submit(framework_step) for _ in range(cap)]
        started.wait(10)
        job = pool.submit(answer.set_result, "answered")  # queued: every thread is busy
        go.set()
        assert [step.result(timeout=20) for step in steps] == ["answered"] * cap
        job.result(timeout=1)
    finally:
        if not answer.done():
            answer.set_result("released")  # a failed run lets its threads go
        pool.shutdown(wait=True)


def test_work_submitted_after_every_thread_blocked_runs_though_a_thread_counted_itself_idle() -> None:
    """``ThreadPoolExecutor`` counts a thread idle each time it finishes a piece of work, even
    where it goes straight on to the next one queued: a stale count, which the pool spends
    instead of starting a thread. Every thread blocked on the loop and such a count left, the
    job the loop waits for must still get a thread (on a plain pool it waited for good: the
    hang of 48 processes on worker threads, one run in 26 under load). The stale count is made
    here by hand, as the pool's own bookkeeping leaves it."""
    import concurrent.futures
    import threading

    from ringzero.core.support.loop_pool import LoopPool, wait_for_loop

    pool = LoopPool()
    pool._max_workers = 2  # a small cap, for a short story
    answer: concurrent.futures.Future[str] = concurrent.futures.Future()
    blocked = threading.Semaphore(0)

    def framework_step() -> str:
        blocked.release()
        return wait_for_loop(answer)

    try:
        steps = [pool.submit(framework_step) for _ in range(2)]
        for _ in range(2):
            assert blocked.acquire(timeout=10), "every step started"
        pool._idle_semaphore.release()  # the count a thread leaves that went on to other work
        job = pool.submit(answer.set_result, "answered")  # what the loop's syscalls wait for
        job.result(timeout=2)
        assert [step.result(timeout=10) for step in steps] == ["answered"] * 2
    finally:
        if not answer.done():
            answer.set_result("released")
        pool.shutdown(wait=True)
