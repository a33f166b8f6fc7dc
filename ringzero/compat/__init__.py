"""Conformance kits: the tests a backend must pass, for other implementations to run.

``ringzero.compat.executor.ExecutorConformance`` is the kit for Executors; subclass it and
provide an ``executor`` fixture. Importing this package needs pytest.
"""
