"""A store registered under ``outside://PATH`` (this package's entry point): rows kept in a
SQLite file through ringzero's own SQLite store, behind a class of this package's own, as an
author wrapping a database they already run would write it.

``SharedWithoutClaims`` declares that several kernels may share it but cannot claim a pid:
what ringzero refuses to build a Kernel on."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence

from ringzero import Checkpoint, CheckpointerCapabilities, PendingWrite
from ringzero.checkpointers import SqliteCheckpointer
from ringzero.protocols import JSON


class OutsideStore:
    """Every method of the Checkpointer protocol, each handed to a SQLite file."""

    capabilities = CheckpointerCapabilities(durable=True, multi_process=True, claims=True)

    def __init__(self, path: str) -> None:
        self.rows = SqliteCheckpointer(path)

    async def put(self, checkpoint: Checkpoint) -> None:
        await self.rows.put(checkpoint)

    async def put_writes(self, thread_id: str, namespace: str, checkpoint_id: str,
                         writes: Sequence[PendingWrite]) -> None:
        await self.rows.put_writes(thread_id, namespace, checkpoint_id, writes)

    async def get(self, thread_id: str, namespace: str = "", checkpoint_id: str | None = None) -> Checkpoint | None:
        return await self.rows.get(thread_id, namespace, checkpoint_id)

    async def list(self, thread_id: str | None = None, namespace: str | None = None, *,
                   filter: Mapping[str, JSON] | None = None, before: str | None = None,
                   limit: int | None = None) -> AsyncIterator[Checkpoint]:
        async for checkpoint in self.rows.list(thread_id, namespace, filter=filter, before=before, limit=limit):
            yield checkpoint

    async def delete_thread(self, thread_id: str) -> None:
        await self.rows.delete_thread(thread_id)

    async def claim(self, checkpoint: Checkpoint) -> bool:
        return await self.rows.claim(checkpoint)

    async def aclose(self) -> None:
        await self.rows.aclose()


class SharedWithoutClaims(OutsideStore):
    """Says several kernels may share it, and has no way to claim a pid."""

    capabilities = CheckpointerCapabilities(durable=True, multi_process=True, claims=False)


def open_store(url: str) -> OutsideStore:
    """The store ``outside://PATH`` names (the entry point ringzero calls with the whole URL)."""
    return OutsideStore(url.removeprefix("outside://"))
