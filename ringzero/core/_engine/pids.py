"""Where a new process's pid comes from: one allocator, with the store deciding how.

- A store that claims and appends (SQLite): pids come from a block of ``PID_BLOCK`` this kernel
  claimed, and the block holding the store's highest pid is reused where it is free, so pids stay
  dense from one kernel to the next on the same file. A spawn is then one append, not a commit.
- A cluster node (``node``): every block is a fresh one past the highest pid, so that nodes
  spawning at once do not race for the same next pid; each pid is still claimed.
- Any other store: the next pid after the highest, claimed where the store can claim (another
  kernel on the same store may take it meanwhile), else simply written.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
from collections.abc import Callable

from ringzero.core.contract.errors import ProcessStateError, RingzeroError
from ringzero.core.contract.store import KernelStore, ProcessRecord
from ringzero.core.support.timeouts import retrieved

__all__ = ["PID_BLOCK", "PidAllocator"]

PID_BLOCK = 1000
"""How many pids a kernel claims at a time, where it claims them in blocks."""


class PidAllocator:
    """Gives each new process record its pid and writes the record (``write_new``)."""

    def __init__(self, store: KernelStore, *, node: str | None, owner: Callable[[], str]) -> None:
        self.store = store
        self.node = node
        self._owner = owner
        """The name a claimed block is held under (the node, else this kernel's monitor id)."""
        capabilities = store.checkpointer.capabilities
        self._claims = capabilities.claims
        self._local_blocks = node is None and capabilities.claims and capabilities.append
        self._next_pid = 0
        self._block: list[int] | None = None
        """[next, last] of the block this kernel claimed."""
        self._waiters: collections.deque[asyncio.Future[int]] = collections.deque()
        """Spawns waiting for a pid while a block is claimed, in the order they asked."""
        self._handout: asyncio.Task[None] | None = None
        self._held: list[int] = []
        """Blocks claimed on one machine, handed back at ``release``."""
        self._closed = False
        self._started = False

    @property
    def taken_first(self) -> bool:
        """Whether a spawn takes its pid (``take``) before anything is written, in its caller's
        task: a spawn that waits for the next block and is cancelled meanwhile leaves nothing
        behind, and the record's creation runs through without a task of its own."""
        return self._local_blocks

    @property
    def waiting(self) -> int:
        """Spawns waiting for the block being claimed."""
        return len(self._waiters)

    @property
    def started(self) -> bool:
        return self._started

    async def start(self) -> None:
        """Number on after what the store already holds."""
        self._started = True
        self._next_pid = await self.store.max_pid()

    async def take(self) -> int:
        """The next pid of this kernel's block, claiming the next block when it is used up."""
        return await self._from_block(reuse=True)

    async def write_new(self, record: ProcessRecord) -> None:
        """Give ``record`` its pid (unless ``take`` did) and write it."""
        if self.node is not None:
            while True:
                record.numbered(await self._from_block(reuse=False))
                if await self.store.claim_process(record):
                    return
        if self._local_blocks:
            if not record.pid:
                record.numbered(await self.take())
            await self.store.append_process(record)
            return
        while True:
            self._next_pid += 1
            record.numbered(self._next_pid)
            if not self._claims:
                await self.store.create_process(record)
                return
            if await self.store.claim_process(record):
                return
            self._next_pid = max(self._next_pid, await self.store.max_pid())

    def drop_block(self) -> None:
        """Forget the block at hand: the next pid comes from a new claim."""
        self._block = None

    async def release(self) -> None:
        """Hand back the blocks this kernel holds (after every record it wrote: the store's delete
        comes after its appends), so that the next kernel on the file numbers on from this one's
        last pid. Where that fails, the next kernel starts at a fresh block. No block is claimed
        after this."""
        self._closed = True
        blocks, self._held = self._held, []
        self._block = None
        if blocks and self.store.checkpointer.capabilities.delete_checkpoints:
            with contextlib.suppress(RingzeroError):
                await self.store.release_pid_blocks(blocks)

    async def _from_block(self, *, reuse: bool) -> int:
        block = self._block
        if block is not None and block[0] <= block[1] and not self._waiters:
            pid = block[0]
            block[0] += 1
            return pid
        if self._closed:
            raise ProcessStateError("this kernel is closed")
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[int] = loop.create_future()
        self._waiters.append(waiter)
        if self._handout is None:
            self._handout = loop.create_task(self._hand_out(reuse))
            self._handout.add_done_callback(retrieved)
        return await waiter

    async def _hand_out(self, reuse: bool) -> None:
        """Claim blocks while spawns wait for a pid, giving each its pid in the order they asked
        (one task wakes each waiter once, rather than a lock passed from one to the next)."""
        waiters = self._waiters
        try:
            while waiters:
                block = self._block
                if block is None or block[0] > block[1]:
                    block = self._block = await self._claim_block(reuse)
                while waiters and block[0] <= block[1]:
                    waiter = waiters.popleft()
                    if not waiter.done():  # a spawn cancelled meanwhile takes no pid
                        waiter.set_result(block[0])
                        block[0] += 1
        except BaseException as exc:
            while waiters:
                waiter = waiters.popleft()
                if waiter.done():
                    continue
                if isinstance(exc, asyncio.CancelledError):
                    waiter.cancel()
                else:
                    waiter.set_exception(exc)
            raise
        finally:
            self._handout = None

    async def _claim_block(self, reuse: bool) -> list[int]:
        """Claim a free block (of kernels racing for one, one gets it). With ``reuse``, the block
        holding the store's highest pid where it is free, numbering on after that pid (read again
        once the block is ours: a kernel that held it before wrote every pid it used before handing
        it back); without, a fresh block past the highest pid."""
        top = await self.store.max_pid()
        block = (top + 1) // PID_BLOCK if reuse else top // PID_BLOCK + 1
        owner = self._owner()
        while True:
            if await self.store.claim_pid_block(block, owner):
                if not reuse:
                    return [block * PID_BLOCK, (block + 1) * PID_BLOCK - 1]
                self._held.append(block)
                end = (block + 1) * PID_BLOCK
                first = max(block * PID_BLOCK, await self.store.max_pid(below=end) + 1, 1)
                if first < end:
                    return [first, end - 1]
            block += 1

