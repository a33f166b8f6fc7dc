"""Egress for sandboxed code: what a run may reach on the network, through the host.

``engine.EgressRun`` is one run's ``http_request`` tool (policy, resolution, secrets, budget,
log); ``proxy.EgressProxy`` is the process sandbox's route to it; ``certificates.RunAuthority``
the run's own CA. The policy itself is ``ringzero.Egress`` (``ringzero.core.contract.egress``).
"""
