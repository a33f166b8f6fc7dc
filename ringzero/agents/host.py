"""A kernel on a private event loop thread, for agents used from plain (sync or async) code.

``agent.execute_task(...)`` is a sync call, and an MCP server calls from its own loop; the
agent's kernel, its gate and its executor live on one private loop either way, so nothing is
ever used from two loops.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

from ringzero.core.kernel import Kernel
from ringzero.core.support.loops import Closing, LoopHome

__all__ = ["KernelHost"]

T = TypeVar("T")


class KernelHost(Closing):
    """Makes the kernel (with ``make_kernel``) on its own loop when first used."""

    def __init__(self, make_kernel: Callable[[], Kernel]) -> None:
        self._make = make_kernel
        self._kernel: Kernel | None = None
        self._home = LoopHome("agent-kernel", private=True)

    async def _kernel_here(self) -> Kernel:
        if self._kernel is None:
            kernel = self._make()
            await kernel.start()
            self._kernel = kernel
        return self._kernel

    def call(self, work: Callable[[Kernel], Awaitable[T]], what: str) -> T:
        """Run ``work(kernel)`` on the kernel's loop and wait for it (sync callers)."""
        return self._home.run_sync(self._with_kernel(work), what)

    async def acall(self, work: Callable[[Kernel], Awaitable[T]]) -> T:
        """Run ``work(kernel)`` on the kernel's loop and await it (async callers on any loop)."""
        return await self._home.run(self._with_kernel(work))

    async def _with_kernel(self, work: Callable[[Kernel], Awaitable[T]]) -> T:
        return await work(await self._kernel_here())

    def close(self) -> None:
        """Shut the kernel down as a host shutdown would (unfinished tasks stay resumable), then
        its loop thread."""
        if self._kernel is not None:
            kernel, self._kernel = self._kernel, None
            self._home.run_sync(kernel.aclose(), "KernelHost.close")
        self._home.close()

    async def aclose(self) -> None:
        if self._kernel is not None:
            kernel, self._kernel = self._kernel, None
            await self._home.run(kernel.aclose())
        await self._home.aclose()
