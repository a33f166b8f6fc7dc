"""The host's side of the process sandbox's fork servers: a server, a run's channel to it, and
the removal of what a run's code left behind."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import struct
from collections import deque
from dataclasses import dataclass
from typing import Any

from ringzero.core.support.timeouts import fail_after
from ringzero.providers.executors._runner import frame
from ringzero.providers.executors.boundary import FrameBuffer, ProtocolViolation

__all__ = ["Channel", "ForkServer", "remove_tree"]


@dataclass(eq=False)
class ForkServer:
    """One fork server as the host sees it: its process, the control socket that requests go
    down, the empty directory its runs' private roots are mounted on, and how many of its runs
    are in flight."""

    process: asyncio.subprocess.Process
    control: socket.socket
    root: str
    runs: int = 0

    @property
    def alive(self) -> bool:
        return self.process.returncode is None

    def run_began(self) -> None:
        self.runs += 1

    def run_ended(self) -> None:
        self.runs -= 1

    async def stop(self) -> None:
        self.control.close()  # the fork server sees the host leave, frees its runs' cgroups, exits
        try:
            async with fail_after(5):
                await self.process.wait()
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                self.process.kill()
            await self.process.wait()
        await asyncio.to_thread(remove_tree, self.root)  # a second stop finds nothing to remove


class Channel:
    """The host's end of a run's socket. Every chunk read carries its sender's pid
    (SO_PASSCRED, checked by the kernel), and only the expected process may speak: the fork
    server for the greeting, then the run's own init. A process the code forked, which can
    write to the same socket, is caught at its first byte."""

    def __init__(self, sock: socket.socket, limit: int, sender: int) -> None:
        sock.setblocking(False)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
        self.sock = sock
        self.sender = sender
        self._frames = FrameBuffer(limit)
        self._messages: deque[dict[str, Any]] = deque()

    def hand_over(self, pid: int) -> None:
        """From now on only process ``pid`` (the run's own, after the fork server's greeting) may speak."""
        self.sender = pid

    async def read(self) -> dict[str, Any]:
        while not self._messages:
            data, pid = await self._recv()
            if not data:
                raise asyncio.IncompleteReadError(b"", None)
            if pid != self.sender:
                raise ProtocolViolation(f"bytes from process {pid}, where only process {self.sender} may speak")
            self._messages.extend(self._frames.feed(data))
        return self._messages.popleft()

    async def _recv(self) -> tuple[bytes, int | None]:
        loop = asyncio.get_running_loop()
        while True:
            try:
                data, ancillary, _, _ = self.sock.recvmsg(1 << 16, socket.CMSG_SPACE(12))
            except BlockingIOError:
                await _readable(loop, self.sock)
                continue
            pid = None
            for level, kind, payload in ancillary:
                if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS:
                    pid = struct.unpack("=iII", payload[:12])[0]
            return data, pid

    async def write(self, message: Any) -> None:
        await asyncio.get_running_loop().sock_sendall(self.sock, frame(message))

    def close(self) -> None:
        self.sock.close()


async def _readable(loop: asyncio.AbstractEventLoop, sock: socket.socket) -> None:
    """Wait until ``sock`` has something to read."""
    ready: asyncio.Future[None] = loop.create_future()

    def wake() -> None:
        if not ready.done():
            ready.set_result(None)

    loop.add_reader(sock.fileno(), wake)
    try:
        await ready
    finally:
        loop.remove_reader(sock.fileno())


def remove_tree(path: str) -> None:
    """Remove a directory tree that sandboxed code may have shaped: iteratively (a 3,000-deep
    chain cannot exhaust the stack), without following symlinks, relative to directory file
    descriptors (a path swapped for a link mid-way leads nowhere). What cannot be removed is
    left; it never raises."""
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        top = os.open(path, flags)
    except OSError:
        return
    stack: list[tuple[int, str, set[str]]] = [(top, "", set())]  # (directory fd, its name, children entered)
    while stack:
        fd, _, entered = stack[-1]
        descend: tuple[int, str] | None = None
        with contextlib.suppress(OSError), os.scandir(fd) as entries:
            for entry in entries:
                if entry.name in entered:
                    continue
                try:
                    descend = (os.open(entry.name, flags, dir_fd=fd), entry.name)
                    break
                except OSError:  # not a directory (a file, a link): unlink it
                    with contextlib.suppress(OSError):
                        os.unlink(entry.name, dir_fd=fd)
        if descend is not None:
            entered.add(descend[1])
            stack.append((descend[0], descend[1], set()))
            continue
        os.close(fd)
        name = stack.pop()[1]
        if stack:
            with contextlib.suppress(OSError):
                os.rmdir(name, dir_fd=stack[-1][0])
    with contextlib.suppress(OSError):
        os.rmdir(path)
