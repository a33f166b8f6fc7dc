"""A ProcessExecutor run's egress: the link its init hands the proxy's listener over, the
run's CA, and the proxy (``ringzero.providers.egress.proxy``) serving it while the run lasts."""

from __future__ import annotations

import socket
from typing import Any

from ringzero.core.contract.errors import ExecutorError
from ringzero.providers.executors._mounts import EGRESS_PORT, SCRATCH
from ringzero.providers.executors.boundary import HostTools

__all__ = ["RunEgress"]


class RunEgress:
    """One run's egress, from the request for its sandbox to the run's end."""

    def __init__(self, host: HostTools) -> None:
        from ringzero.providers.egress.certificates import RunAuthority  # the egress extra: only where used

        assert host.egress is not None
        self.host = host
        self.authority = RunAuthority()
        self.host_end, self.init_end = socket.socketpair()
        self.proxy: Any = None

    def request(self) -> dict[str, Any]:
        """What the run's init writes and sets before the code starts (``_forkserver``)."""
        from ringzero.providers.egress.proxy import CA_FILE, environment

        assert self.host.egress is not None
        self.init_end.close()  # the fork server holds its own copy now
        return {"ca": self.authority.pem, "ca_file": CA_FILE, "env": environment(self.host.egress.egress, SCRATCH,
                                                                               EGRESS_PORT)}

    def serve(self) -> None:
        """Take the listener the init sent before it said "started", and serve it."""
        from ringzero.providers.egress.proxy import EgressProxy

        assert self.host.egress is not None
        self.host_end.setblocking(False)
        try:
            _, fds, _, _ = socket.recv_fds(self.host_end, 64, 1)
        except OSError:
            fds = []
        if len(fds) != 1:
            raise ExecutorError("the sandbox did not hand over its egress listener")
        listener = socket.socket(fileno=fds[0])
        if listener.family != socket.AF_INET or not listener.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
            listener.close()
            raise ExecutorError("the sandbox's egress listener is not a listening TCP socket")
        self.proxy = EgressProxy(listener, self.host.egress, self.host.call, self.authority)
        self.proxy.start()

    async def aclose(self) -> None:
        self.host_end.close()
        self.init_end.close()
        if self.proxy is not None:
            await self.proxy.aclose()
