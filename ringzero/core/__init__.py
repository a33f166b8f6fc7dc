"""The kernel: protocols, types, errors, processes, syscalls, the LLM gate and the journal.

Nothing here imports a provider, checkpointer or adapter at module level; those import core.
"""
