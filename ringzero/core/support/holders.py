"""Whether the kernel holding a stored process is alive: what a resumer asks before it takes
the process (``ringzero resume``, ``serve``, ``retry``), so that it never takes one a live
kernel runs.

A kernel is named in the store's claims by its host id, ``hostname:os-pid[:n]`` (its monitor's
id; ``n`` tells the kernels of one OS process apart), or ``resume@hostname:os-pid`` (the node
name ``ringzero resume`` takes on a shared store); a cluster node by its node name. On this
machine the answer is exact and immediate: a kernel of this OS process is alive while it is open
(``OPEN``); one of another OS process while that process exists (not a zombie) and its activity
row, if it wrote one, does not say it closed. On another machine it is the activity row: fresh
(``KernelActivity.fresh``) and not closed. A kernel killed with -9 on this machine is dead at
once; on another machine, once its row is older than three of its ticks.
"""

from __future__ import annotations

import os
import socket
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from ringzero.core.contract.store import KernelStore
from ringzero.core.support.monitor import KernelActivity, read_activity

__all__ = ["OPEN", "Holders", "alive"]

OPEN: Counter[str] = Counter()
"""Host ids of the kernels of this OS process that are open, counted (added at start, taken
away at close; kernels without a monitor share their OS process's id)."""


@dataclass(frozen=True)
class Holders:
    """Who holds each stored process (its latest owner claim) and which kernels are alive, read
    once for a resume or an adoption of many processes."""

    owners: Mapping[int, tuple[int, str]] = field(default_factory=dict)
    activity: Mapping[str, KernelActivity] = field(default_factory=dict)

    @classmethod
    async def read(cls, store: KernelStore) -> Holders:
        """Two queries: every owner row, and every kernel's activity row (where any process has an owner)."""
        owners = await store.owners()
        activity = {row.kernel: row for row in await read_activity(store.checkpointer)} if owners else {}
        return cls(owners, activity)

    def of(self, pid: int, me: str) -> tuple[int, str | None]:
        """``(epoch, holder)``: the owner number ``pid`` has (0: none), and the live kernel other
        than ``me`` that holds it, or None where none does (none claimed it, or its holder died)."""
        epoch, holder = self.owners.get(pid, (0, ""))
        live = epoch > 0 and holder != me and alive(holder, self.activity)
        return epoch, holder if live else None


def alive(holder: str, activity: Mapping[str, KernelActivity], *, now: float | None = None) -> bool:
    """Whether the kernel named ``holder`` (a host id) may still be running what it holds;
    ``activity`` is every kernel's activity row by id (``read_activity``)."""
    row = activity.get(holder)
    hostname, _, rest = holder.rpartition("@")[2].partition(":")  # ``resume@host:pid``: a resume's node name
    os_pid = rest.partition(":")[0]
    if hostname != socket.gethostname() or not os_pid.isdigit():
        return row is not None and row.fresh(now)
    if int(os_pid) == os.getpid():
        return OPEN[holder] > 0
    return _process_exists(int(os_pid)) and not (row is not None and row.closed)


def _process_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's: it exists
        return True
    try:  # a zombie (killed, not yet reaped by its parent) runs nothing
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except (OSError, IndexError):
        return True
    return state not in ("Z", "X")
