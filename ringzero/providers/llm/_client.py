"""An httpx client per event loop, made when first needed.

An ``httpx.AsyncClient``'s pooled connections belong to the loop that opened them, and one
provider may serve several loops (a kernel's, and the private loop a sync LangChain call runs
on), so each loop gets its own client; a closed provider makes new ones if it is used again.
"""

from __future__ import annotations

import asyncio
import weakref

import httpx

__all__ = ["ClientPerLoop"]


class ClientPerLoop:
    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self._clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, httpx.AsyncClient] = (
            weakref.WeakKeyDictionary())

    def get(self) -> httpx.AsyncClient:
        loop = asyncio.get_running_loop()
        client = self._clients.get(loop)
        if client is None or client.is_closed:
            client = httpx.AsyncClient(timeout=httpx.Timeout(self.timeout, connect=min(10.0, self.timeout)))
            self._clients[loop] = client
        return client

    async def aclose(self) -> None:
        """Close this loop's client (other loops' clients close with their loops)."""
        client = self._clients.pop(asyncio.get_running_loop(), None)
        if client is not None:
            await client.aclose()
