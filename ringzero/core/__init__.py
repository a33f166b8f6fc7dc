"""The kernel, in three layers a folder each: ``contract`` (protocols, records, errors, limits),
``support`` (what the engine and backends share) and ``_engine`` (private), under the face:
``kernel`` (``Kernel``), ``context`` (``Context``), ``handles`` and ``routing``.

Nothing here imports a provider, checkpointer or adapter at module level; those import core.
"""
